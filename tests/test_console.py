"""What the rendered project prints is what its docs show, line for line: a default
`fit`, `fit --ckpt_path last` on the finished run, and `predict`, as a log file or a
pipe receives them (docs/train.md). A line of Lightning's that the kit's own lines
repeat, or a warning that does not concern the run, fails here."""

import re
import sys
from pathlib import Path

import pytest
import torch
from conftest import render, run

NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e-?\d+)?")
UNIT = re.compile(r"( [kKMGTP]?)(?:FLOP|i?B)\b")  # a number's unit, its SI prefix first


def blocks(page: str) -> list[list[str]]:
    """The lines of each ```text block of a docs page."""
    return [block.splitlines() for block in re.findall(r"```text\n(.*?)```", page, re.DOTALL)]


def pattern(line: str) -> re.Pattern:
    """A docs line as a pattern: its numbers stand for any number (a time, a loss), with
    any SI prefix of the unit after it (345 MFLOP/s here is 1.2 GFLOP/s elsewhere)."""
    parts = NUMBER.split(line)
    escaped = [re.escape(parts[0])]
    for part in parts[1:]:
        unit = UNIT.match(part)
        rest = part[unit.end(1) :] if unit else part
        escaped.append((" [kKMGTP]?" if unit else "") + re.escape(rest))
    return re.compile(r"[\d.e+-]+".join(escaped) + "$")


def unshown(output: list[str], shown: list[str]) -> str | None:
    """Where `output` departs from the `shown` lines, else None. A shown `...` stands for
    more lines like the one before it; `<...>` for one or more lines of any kind, up to
    the next shown line."""
    at = 0
    for n, line in enumerate(shown):
        if line == "...":
            after = pattern(shown[n + 1]) if n + 1 < len(shown) else None
            while at < len(output) and pattern(shown[n - 1]).match(output[at]):
                last = at + 1 == len(output) or not pattern(shown[n - 1]).match(output[at + 1])
                if after is not None and after.match(output[at]) and last:
                    break  # the last of them is the line shown next
                at += 1
            continue
        if line.startswith("<") and line.endswith(">"):
            following = [p for p in shown[n + 1 :] if p != "..."]
            start = at
            while at < len(output) and (
                at == start or not following or not pattern(following[0]).match(output[at])
            ):
                at += 1
            continue
        if at >= len(output):
            return f"the output ended where the docs show {line!r}"
        if not pattern(line).match(output[at]):
            return f"line {at + 1} is {output[at]!r} where the docs show {line!r}"
        at += 1
    if at < len(output):
        return f"lines the docs do not show, from line {at + 1}: {output[at:]}"
    return None


# Lightning's lines that the kit's own say better: never printed (kit/cli.py REPORTED).
REPEATED = (
    "GPU available:",
    "TPU available:",
    "HPU available:",
    "Initializing distributed:",
    "Restoring states from the checkpoint path",
    "💡",
)


SLOW_MACHINE = re.compile(r"^Epoch \d+, batch |: The model waited for data ")


@pytest.mark.slow
@pytest.mark.skipif(
    "+cpu" not in torch.__version__ or torch.cuda.is_available(),
    reason="docs/train.md shows a CPU-only build's report",
)
@pytest.mark.parametrize("example", ["digits", "minimal"])
def test_fit_resume_and_predict_print_what_docs_train_md_shows(tmp_path, example):
    project = render(tmp_path, example=example)
    fit_shown, finished_shown, predict_shown = blocks((project / "docs" / "train.md").read_text())
    command = [sys.executable, "-m", "my_lightning_project"]

    def output(*args: str) -> list[str]:
        # stdout and stderr in one pipe, in the order written, as a job's log has them
        script = " ".join(f"'{word}'" for word in [*command, *args]) + " 2>&1"
        text = run(["bash", "-c", script], cwd=project, PYTHONPATH="src").stdout
        repeated = [line for line in text.splitlines() if line.startswith(REPEATED)]
        assert not repeated, repeated
        # Lines only a slow machine adds (a minute-long epoch's line as it goes, the
        # advice when the loader cannot keep up): not the run's, the machine's.
        text = "\n".join(line for line in text.splitlines() if not SLOW_MACHINE.search(line))
        # The docs name the console command, where a module run names itself by its module.
        return text.replace("python -m my_lightning_project", "my-lightning-project").splitlines()

    fit = output("fit")
    assert (gone := unshown(fit, fit_shown)) is None, "\n".join([gone, *fit])
    finished = output("fit", "--ckpt_path", "last")
    assert (gone := unshown(finished, finished_shown)) is None, "\n".join([gone, *finished])
    best = next(Path(project, "logs", "version_0", "checkpoints").glob("best-*.ckpt"))
    predicted = output("predict", "--ckpt_path", str(best.relative_to(project)))
    assert (gone := unshown(predicted, predict_shown)) is None, "\n".join([gone, *predicted])
