"""`<command> export`'s flags: the parser that answers `export --help` at once, without
torch or Lightning (kit/export.py, which does the work, imports both). It imports
nothing of the kit."""

import argparse

FORMATS = ("state_dict", "pt2", "onnx", "folder")
# How far an export's outputs may be from the checkpoint network's (torch.allclose).
RTOL, ATOL = 1e-4, 1e-5


def parser(command: str = "<command>") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{command} export",
        description="Write the trained network of a checkpoint: a plain state_dict (.pt), a"
        " torch.export program (.pt2), an ONNX model (.onnx) or a model folder (DIR/:"
        " safetensors, config.json, a model card), checked before it is written.",
    )
    parser.add_argument("--ckpt_path", required=True, help="a Lightning checkpoint (.ckpt)")
    parser.add_argument("--output", default="model.pt", help="where to write (default: model.pt)")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        help="what to write (default: from --output: .pt2, .onnx, a folder/, else state_dict)",
    )
    parser.add_argument(
        "--rtol",
        type=float,
        default=RTOL,
        help=f"how far the file's outputs may be from the checkpoint's, relative (default: {RTOL})",
    )
    parser.add_argument(
        "--atol",
        type=float,
        default=ATOL,
        help=f"and absolute, as torch.allclose takes them (default: {ATOL})",
    )
    return parser
