"""Counts, on the CPU, the calls that would make a GPU's host wait for the device.

On CUDA, reading a tensor's value on the host (`.item()`, `.tolist()`, `bool()`,
`float()`, `.cpu()`, `.numpy()`, ...) waits until the device has run every
kernel queued before it: the host stops queueing the next step's work, and a
small model's GPU idles. A CPU run has no such wait to see, so `SyncCounter`
counts the calls themselves, per training step, through a TorchFunctionMode
that sees every torch call made while the steps run.

Not every such call is a wait on a GPU: one on a tensor that stays in host
memory there too (an optimizer's step counter, a number the code made on the
host) reads host memory. The mode follows where each tensor would live: one
made by a factory without a device (`torch.tensor(0.5)`), or only from such
tensors, or moved to the host (`.cpu()`, `.numpy()`), is a host tensor; every
other tensor (parameters, batches, anything made from them or with a `device=`
that is the run's) is taken to live on the device, so an unknown tensor is
counted, never excused.
"""

import re
import traceback

import torch
from lightning.pytorch import Callback
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from {{ cookiecutter.package_name }}.kit.console import logs_this_step

# Calls that read a CUDA tensor's value on the host, or whose result's size does.
SYNCS = {
    "item",
    "tolist",
    "__bool__",
    "__float__",
    "__int__",
    "__index__",
    "cpu",
    "numpy",
    "nonzero",
    "equal",
    "allclose",
    "masked_select",
    "__repr__",
    "__format__",
}
TO_HOST = {"cpu", "numpy", "tolist"}


def on_host(value) -> bool:
    return getattr(value, "_lives_on_host", False)


def _names_a_device(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether a call places its result on a device other than the host ("cpu" literally)."""
    given = [kwargs.get("device")]
    if name == "to":
        given += [arg for arg in args[1:] if isinstance(arg, str | torch.device)]
    return any(
        device is not None and not (isinstance(device, str) and device.startswith("cpu"))
        for device in given
    )


class _Counting(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []  # (method, where it was called from)
        self.counting = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        first = args[0] if args else None
        if self.counting and name in SYNCS and isinstance(first, torch.Tensor):
            if not on_host(first):
                self.calls.append((name, _caller()))
        result = func(*args, **kwargs)
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        if name in TO_HOST or (
            all(on_host(t) for t in tensors) and not _names_a_device(name, args, kwargs)
        ):
            for made in tree_flatten(result)[0]:
                if isinstance(made, torch.Tensor) and not isinstance(made, torch.nn.Parameter):
                    made._lives_on_host = True
        return result


def _caller() -> str:
    """Where a call came from: the innermost frames outside torch, shortest paths."""
    frames = traceback.extract_stack()[:-2]  # not this function and the mode's
    outside = [f for f in frames if "/torch/" not in f.filename] or frames
    return " <- ".join(
        f"{re.sub(r'.*(site-packages|src|tests)/', '', f.filename)}:{f.lineno} {f.name}"
        for f in reversed(outside[-4:])
    )


class SyncCounter(Callback):
    """Counts host syncs per training step: from one batch's start to the next one's
    (the step, every hook, the logging and the next batch's fetch), or to the
    epoch's validation or end. `steps` holds (batch, whether the logger wrote at
    it, [(call, where)]) for each step (batch). With `batches`, the fit stops after
    that many, however many optimizer steps each takes."""

    def __init__(self, batches: int | None = None) -> None:
        self.batches = batches
        self.mode = _Counting()
        self.steps: list[tuple[int, bool, list[tuple[str, str]]]] = []
        self._open: tuple[int, bool, int] | None = None
        self._entered = False

    def _close(self) -> None:
        if self._open is not None:
            step, logs, first = self._open
            self.steps.append((step, logs, self.mode.calls[first:]))
            self._open = None
        self.mode.counting = False

    def on_train_start(self, trainer, pl_module) -> None:
        self.mode.__enter__()
        self._entered = True

    def _leave(self) -> None:
        self._close()
        if self._entered:
            self._entered = False
            self.mode.__exit__(None, None, None)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._close()
        batch = trainer.fit_loop.epoch_loop.total_batch_idx
        if self.batches and batch + 1 >= self.batches:
            trainer.should_stop = True  # after this batch, which then logs (Lightning's rule)
        self._open = (batch, logs_this_step(trainer), len(self.mode.calls))
        self.mode.counting = True

    def on_validation_start(self, trainer, pl_module) -> None:
        self._close()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._close()

    def on_train_end(self, trainer, pl_module) -> None:
        self._leave()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._leave()

    def report(self, steps) -> str:
        return "\n".join(
            f"step {step} ({'logging' if logs else 'not logging'}): {name} from {where}"
            for step, logs, calls in steps
            for name, where in calls
        )


class CopiesToDevice(TorchFunctionMode):
    """Counts the tensors copied from host memory onto a device of `device_type` (a
    CUDA device, or the `meta` device standing in for one on the CPU)."""

    def __init__(self, device_type: str):
        super().__init__()
        self.device_type, self.copies = device_type, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        source = args[0] if args else None
        from_host = not isinstance(source, torch.Tensor) or source.device.type == "cpu"
        made_there = isinstance(result, torch.Tensor) and result.device.type == self.device_type
        copies = getattr(func, "__name__", "") in ("to", "as_tensor", "tensor", "cuda")
        if copies and made_there and from_host:
            self.copies += 1
        return result
