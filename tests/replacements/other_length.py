"""Export a fresh model of the project to .pt2 and .onnx with the export command, and
run both on token sequences 3 longer than those they were traced on (run inside a
rendered project by tests/test_replacements.py, for problems whose
`Project.dynamic_dims` frees the length, dim 1)."""

import lightning
import onnxruntime
import torch

from my_lightning_project.__main__ import main, project
from my_lightning_project.kit.export import example_data, network_inputs, tensors_of
from my_lightning_project.kit.spec import network_of

PROJECT = project()
assert PROJECT.dims.get(1), f"Project.dynamic_dims leaves the length fixed: {PROJECT.dims}"
torch.manual_seed(0)
module = PROJECT.model().eval()
checkpoint = {
    "state_dict": module.state_dict(),
    "hyper_parameters": dict(module.hparams),
    "pytorch-lightning_version": lightning.__version__,
}
torch.save(checkpoint, "fresh.ckpt")
_, network = network_of(module, PROJECT.network)
batch, _ = example_data(PROJECT)
inputs = network_inputs(batch, PROJECT.network_inputs)
length = inputs[0].shape[1]
other = tuple(torch.cat([x, x[:, :3]], dim=1)[:2] for x in inputs)  # 3 longer, batch of 2
with torch.no_grad():
    expected = tensors_of(network(*other))
for suffix in ("pt2", "onnx"):
    code = main(["export", "--ckpt_path=fresh.ckpt", f"--output=model.{suffix}"])
    assert code == 0, f"export to .{suffix} exited {code}"
    if suffix == "pt2":
        program = torch.export.load("model.pt2").module()
        got = tensors_of(program(*other))
    else:
        session = onnxruntime.InferenceSession("model.onnx")
        feed = {f"input_{i}": x.numpy() for i, x in enumerate(other)}
        got = [torch.from_numpy(y) for y in session.run(None, feed)]
    for g, w in zip(got, expected, strict=True):
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-5), (suffix, (g - w).abs().max())
    print(f"{suffix}: length {length} traced, length {other[0].shape[1]} ok")
