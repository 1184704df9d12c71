"""A GAN that learns points on a ring, trained with manual optimization (two optimizers).

`network="generator"` makes `export` write the generator, which takes noise:
`network_inputs` gives it that, from a batch of points.
"""

from .data import RingDataModule
from .kit.spec import Project
from .model import PointGAN, network_inputs

PROJECT = Project(
    model=PointGAN,
    datamodule=RingDataModule,
    monitor="val/ring_error",  # how far generated points lie from the data's ring
    mode="min",  # which way is better
    network="generator",  # what `export` writes: noise in, points out
    network_inputs=network_inputs,
)
# What the default `fit` reaches (`pytest -m target` holds it to that).
TARGET = 0.3
