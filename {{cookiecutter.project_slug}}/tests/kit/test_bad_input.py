"""Hostile input to every command: one clear line, a non-zero exit, nothing written.

Kit test: the inputs are the kit's (configs, flags, checkpoints, output paths),
given to whatever model and data `project.py` names.
"""

from dataclasses import replace

import pytest
import torch
from support import PROJECT, made_a_run

from {{ cookiecutter.package_name }}.__main__ import main


def command(args: list[str]) -> int:
    """The exit code the command line would give (a parse error exits via SystemExit)."""
    try:
        return main(args)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1  # SystemExit("...") exits 1


def write(path, text: str):
    path.write_text(text)
    return path


def other_model(checkpoint, folder):
    """The trained checkpoint with its weights renamed and one reshaped: another model's."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    weights = state["state_dict"]
    first = next(iter(weights))
    weights["elsewhere.weight"] = weights.pop(first)
    second = next(k for k, v in weights.items() if v.dim() > 0 and k != "elsewhere.weight")
    weights[second] = torch.zeros(*weights[second].shape[:-1], weights[second].shape[-1] + 1)
    torch.save(state, folder / "other.ckpt")
    return folder / "other.ckpt", first, second


# (arguments, files to make first, what the one line must say), for every command.
CASES = {
    "config that is not YAML": (
        ["fit", "--config", "bad.yaml"],
        {"bad.yaml": "trainer: [unclosed\n"},
        "error: Problems parsing config: while parsing a flow sequence",
    ),
    "config that does not exist": (
        ["fit", "--config", "missing.yaml"],
        {},
        "File does not exist: ",
    ),
    "unknown key in a config": (
        ["fit", "--config", "unknown.yaml"],
        {"unknown.yaml": "trainer:\n  max_epochz: 3\n"},
        "does not accept option 'trainer.max_epochz'",
    ),
    "unknown flag (no abbreviation)": (
        ["fit", "--trainer.max_epoch=3"],
        {},
        "error: unrecognized arguments: --trainer.max_epoch=3",
    ),
    "value of the wrong type": (
        ["fit", "--trainer.max_epochs=many"],
        {},
        "error: trainer.max_epochs=many: expected int or null",
    ),
    "value of the wrong type in validate": (
        ["validate", "--trainer.limit_val_batches=some"],
        {},
        "error: trainer.limit_val_batches=some: expected",
    ),
    "checkpoint.async that is not true or false": (
        ["fit", "--checkpoint.async=maybe"],
        {},
        "error: checkpoint.async=maybe: expected bool",
    ),
    "checkpoint path that is a folder": (
        ["validate", "--ckpt_path=a-folder"],
        {"a-folder/": ""},
        "error: checkpoint 'a-folder' does not exist or is not a file",
    ),
    "checkpoint path that is a folder, for export": (
        ["export", "--ckpt_path=a-folder"],
        {"a-folder/": ""},
        "error: checkpoint 'a-folder' does not exist or is not a file",
    ),
    "predict from a missing checkpoint": (
        ["predict", "--ckpt_path=nowhere.ckpt"],
        {},
        "error: checkpoint 'nowhere.ckpt' does not exist or is not a file",
    ),
    "unknown command": (["exprot"], {}, "error: unknown command 'exprot' (did you mean 'export'?)"),
}


@pytest.mark.parametrize(("args", "files", "expected"), CASES.values(), ids=CASES.keys())
def test_hostile_input_gets_one_line_and_writes_nothing(workdir, capfd, args, files, expected):
    for name, text in files.items():
        if name.endswith("/"):
            (workdir / name).mkdir()
        else:
            write(workdir / name, text)
    before = sorted(p.name for p in workdir.iterdir())
    assert command(args) == 2
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("Seed set")]
    assert expected in lines[0], err
    if args[0] in ("fit", "validate", "test", "predict", "export"):
        assert len(lines) == 1, err  # (an unknown command is followed by the command list)
    assert "Traceback" not in err
    assert sorted(p.name for p in workdir.iterdir()) == before and not made_a_run(workdir)


def test_a_checkpoint_of_another_model_names_the_keys(trained_checkpoint, workdir, capfd):
    other, renamed, reshaped = other_model(trained_checkpoint, workdir)
    for subcommand in ("validate", "export"):
        assert command([subcommand, f"--ckpt_path={other}"]) == 2
        err = capfd.readouterr().err
        (line,) = [line for line in err.splitlines() if line.startswith("error: ")]
        assert "does not fit" in line
        assert renamed in line and "elsewhere.weight" in line, line
        assert reshaped in line, line
        assert "Traceback" not in err
    # No run, no export (what the DataModule's prepare_data fetched may stay).
    assert not made_a_run(workdir) and not (workdir / "model.pt").exists()


def test_an_output_that_cannot_be_written(trained_checkpoint, workdir, capfd):
    write(workdir / "a-file", "")
    assert command(["export", f"--ckpt_path={trained_checkpoint}", "--output=a-file/m.pt"]) == 2
    err = capfd.readouterr().err
    assert "error: cannot write m.pt in a-file/: a-file is a file, not a folder (" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in workdir.iterdir()) == ["a-file"]


@pytest.mark.parametrize("args", [["fit"], ["export", "--ckpt_path", "x.ckpt"], ["sweep"]])
def test_a_project_py_the_kit_cannot_run_is_one_line(args, workdir, monkeypatch, capsys):
    """A field of Project that refuses its value: one line naming it, exit 2, no run."""
    from {{ cookiecutter.package_name }} import __main__ as entry

    def described():
        return replace(PROJECT, mode="maximum")  # what Project checks when it is made

    monkeypatch.setattr(entry, "project", described)
    assert command(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: project.py: Project.mode='maximum': expected 'min' or 'max'"]
    assert not made_a_run(workdir)


def test_a_checkpoint_of_another_project_names_the_arguments(trained_checkpoint, workdir, capfd):
    """Hyperparameters the model does not take: another project's model, said as such
    (not as a flag the command does not accept)."""
    state = torch.load(trained_checkpoint, map_location="cpu", weights_only=True)
    state["hyper_parameters"] = {"vocabulary": 5000, "heads": 8}
    torch.save(state, workdir / "theirs.ckpt")
    for subcommand in ("fit", "test"):
        assert command([subcommand, "--ckpt_path=theirs.ckpt"]) == 2
        err = capfd.readouterr().err
        (line,) = [line for line in err.splitlines() if line.startswith("error: ")]
        assert "holds another model: its hyperparameters heads, vocabulary are not" in line
        assert f"arguments of {PROJECT.model.__name__}" in line and "Traceback" not in err
    assert not made_a_run(workdir)


def test_a_missing_data_file_is_one_line_naming_where(workdir, capfd, monkeypatch):
    """A file the DataModule reads that is not there: the input, not a bug; the line names
    the file and the project's line that read it, and no run is left behind."""

    def reads_a_file(self, stage=None):
        open("data/absent.csv")  # noqa: SIM115  (it fails)

    monkeypatch.setattr(PROJECT.datamodule, "setup", reads_a_file)
    assert command(["fit"]) == 2
    err = capfd.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("error: ")]
    assert "No such file or directory: 'data/absent.csv'" in line
    assert "(raised in test_bad_input.py:" not in line and "Traceback" not in err
    assert not made_a_run(workdir)


def test_a_loader_worker_that_cannot_take_the_dataset_says_what_to_do(workdir, capfd, monkeypatch):
    """A fork server hands a worker each tensor of the dataset as a file descriptor, a few
    hundred at most: past that, one line on what to do."""
    from torch.utils.data import DataLoader, TensorDataset

    class HandedOver(DataLoader):
        def __iter__(self):  # as Python's fork server refuses a dataset of many tensors
            raise ValueError("too many fds")

    def loader(self):
        return HandedOver(TensorDataset(torch.zeros(4, 1)))

    monkeypatch.setattr(PROJECT.datamodule, "train_dataloader", loader)
    assert command(["fit"]) == 1
    err = capfd.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("error: ")]
    assert "could not be handed the dataset (too many fds)" in line and "Traceback" not in err
