"""Every time the docs promise says on what machine, and benchmarks/claims.py measures
it: a promise of time it does not list, or one with no machine ("in seconds", "under a
minute"), fails here. (The figures themselves are this machine's: the benchmark
prints them; no test asserts a duration.)"""

import re
import sys
from pathlib import Path

from conftest import TEMPLATE, render

sys.path.insert(0, str(TEMPLATE / "benchmarks"))
from claims import CLAIMS  # noqa: E402

PROMISE = re.compile(r"about\s+[\d.]+\s+(?:s|minutes?)\s+on\s+2\s+CPU\s+cores")
VAGUE = re.compile(r"in\s+seconds\s+on|under\s+a\s+minute|a\s+few\s+minutes", re.IGNORECASE)


def pages(project: Path) -> dict[str, str]:
    rendered = [project / "README.md", project / "AGENTS.md", *sorted(project.glob("docs/*.md"))]
    found = {f"render:{p.relative_to(project)}": p.read_text() for p in rendered}
    found["template:README.md"] = (TEMPLATE / "README.md").read_text()
    return found


def test_every_promise_of_time_names_its_machine_and_is_measured(tmp_path):
    listed = {(where, words) for where, words, _, _ in CLAIMS}
    made = set()
    for where, text in pages(render(tmp_path)).items():
        made |= {(where, " ".join(words.split())) for words in PROMISE.findall(text)}
        vague = VAGUE.findall(text)
        assert not vague, f"{where}: {vague}: say on what, e.g. 'about 20 s on 2 CPU cores'"
    assert made == listed, f"not measured: {made - listed}; gone from the docs: {listed - made}"
