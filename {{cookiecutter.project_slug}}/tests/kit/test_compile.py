"""`--compile.enabled true` compiles the network: a short fit, a resume and an export,
with no `_orig_mod.` anywhere.

Kit test: it compiles whatever network the model `project.py` names holds.
"""

import pytest
import torch
from support import PROJECT, load_checkpoint, run_dirs, run_forked

from {{ cookiecutter.package_name }}.kit.export import load_network

SHORT = [
    "--trainer.limit_train_batches=4",
    "--trainer.limit_val_batches=2",
    "--compile.enabled=true",
]


@pytest.mark.slow
def test_a_compiled_fit_saves_resumes_and_exports_like_an_eager_one(workdir):
    run_forked("fit", "--trainer.max_epochs=1", *SHORT, cwd=workdir)
    (run,) = run_dirs(workdir)
    last = run / "checkpoints" / "last.ckpt"
    assert not [key for key in load_checkpoint(last)["state_dict"] if "_orig_mod" in key]
    resumed = run_forked("fit", "--ckpt_path=last", "--trainer.max_epochs=2", *SHORT, cwd=workdir)
    assert "Resuming from" in resumed.stderr
    assert load_checkpoint(last)["epoch"] == 1 and run_dirs(workdir) == [run]
    run_forked("export", f"--ckpt_path={last}", "--output=model.pt", cwd=workdir)
    network = load_network(workdir / "model.pt", PROJECT)
    weights = load_checkpoint(last)["state_dict"]
    for key, value in network.state_dict().items():
        named = [v for k, v in weights.items() if k == key or k.endswith("." + key)]
        assert any(torch.equal(value, v) for v in named), key
