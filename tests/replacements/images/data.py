"""Small grayscale PNGs of three shapes, written once to a folder and read with PIL per item.

Training images are augmented as torchvision's transforms do, from the global generators: a
crop (Python's), brightness and noise (NumPy's), a flip (torch's); val and test are not.
"""

import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch.utils.data import Dataset, Subset

from .kit.data import SplitDataModule, split_dataset, split_sizes

CLASSES = ("circle", "square", "triangle")  # each the same shape when flipped left-right
NUM_IMAGES = 600
STORED = 20  # the side of a stored image
SIZE = 16  # the side the model sees: a crop of it


def draw_shape(kind: int, rng: random.Random) -> Image.Image:
    """One shape of a random size, place and shade on a darker background of its own."""
    image = Image.new("L", (STORED, STORED), rng.randint(0, 60))
    half = rng.uniform(3.5, 6.0)
    cx, cy = STORED / 2 + rng.uniform(-2, 2), STORED / 2 + rng.uniform(-2, 2)
    box = (cx - half, cy - half, cx + half, cy + half)
    shade = rng.randint(150, 255)
    draw = ImageDraw.Draw(image)
    if CLASSES[kind] == "circle":
        draw.ellipse(box, fill=shade)
    elif CLASSES[kind] == "square":
        draw.rectangle(box, fill=shade)
    else:
        draw.polygon([(cx, cy - half), (cx + half, cy + half), (cx - half, cy + half)], fill=shade)
    return image


def write_images(folder: Path, seed: int = 0) -> None:
    """`<index>_<class>.png` files, written once to a folder of their own, renamed into place."""
    if folder.is_dir():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    rng = random.Random(seed)
    for index in range(NUM_IMAGES):
        kind = index % len(CLASSES)
        draw_shape(kind, rng).save(staging / f"{index:04d}_{kind}.png")
    try:
        staging.rename(folder)
    except OSError:  # another run finished first
        shutil.rmtree(staging)


class ShapeImages(Dataset):
    """(image, class) from each PNG: a 1x16x16 float tensor in [-1, 1]; random crop, brightness,
    noise and flip when `augment`, the centre otherwise."""

    def __init__(self, folder: Path, augment: bool = False):
        self.files = sorted(folder.glob("*.png"))
        if len(self.files) != NUM_IMAGES:
            raise FileNotFoundError(f"{folder}: expected {NUM_IMAGES} .png files")
        self.augment = augment

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path = self.files[index]
        with Image.open(path) as file:
            pixels = np.asarray(file.convert("L"), dtype=np.float32) / 255
        margin = STORED - SIZE
        if self.augment:
            top, left = random.randint(0, margin), random.randint(0, margin)
        else:
            top = left = margin // 2
        pixels = pixels[top : top + SIZE, left : left + SIZE]
        if self.augment:
            pixels = pixels * np.random.uniform(0.8, 1.2)
            pixels = pixels + np.random.uniform(-0.05, 0.05, pixels.shape)
        image = torch.from_numpy(np.ascontiguousarray(pixels, dtype=np.float32)).unsqueeze(0)
        if self.augment and torch.rand(1) < 0.5:
            image = image.flip(-1)
        return (image - 0.5) / 0.5, int(path.stem.split("_")[1])


class ShapesDataModule(SplitDataModule):
    """600 images of circles, squares and triangles, split 70/15/15 by `split_seed`."""

    def __init__(self, data_dir: str = "data/shapes", **kwargs):
        super().__init__(**kwargs)

    def prepare_data(self) -> None:
        write_images(Path(self.hparams.data_dir))

    def make_splits(self) -> dict[str, Dataset]:
        self.prepare_data()  # a no-op once written; here for use outside a Trainer
        folder = Path(self.hparams.data_dir)
        sizes = split_sizes(NUM_IMAGES, 0.15, 0.15)
        splits = split_dataset(ShapeImages(folder), sizes, self.hparams.split_seed)
        # The same training images, augmented.
        splits["train"] = Subset(ShapeImages(folder, augment=True), splits["train"].indices)
        return splits
