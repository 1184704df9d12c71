"""A schedule built for a number of steps (OneCycleLR's `total_steps`) and fits that take
more: refused in one line as training starts, however the run was stopped, and not
offered as a continuation by a finished run's closing line.

Kit test of the kit's ScheduleLength and its closing line, with a small model of its own.
"""

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from {{ cookiecutter.package_name }}.kit.schedules import ScheduleLength, ending_schedules
from {{ cookiecutter.package_name }}.kit.spec import ConfigError

BATCHES = 4  # an epoch's


class OneCycle(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(4 * BATCHES, 2)), batch_size=4)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        total = self.trainer.estimated_stepping_batches
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, 0.1, total_steps=total)
        schedule = {"scheduler": scheduler, "interval": "step"}
        return {"optimizer": optimizer, "lr_scheduler": schedule}


def trainer(folder, epochs: int, every: int) -> Trainer:
    saves = ModelCheckpoint(dirpath=folder, save_last=True, every_n_train_steps=every)
    return Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[saves, ScheduleLength()],
    )


@pytest.mark.parametrize(
    ("every", "left", "takes"),
    [(BATCHES, 0, 4), (3, 2, 6)],
    ids=["saved at an epoch's last batch", "saved half-way through one"],
)
def test_a_run_continued_past_its_schedule_is_refused_in_one_line(tmp_path, every, left, takes):
    """Two epochs of 4 steps, its newest checkpoint at step 8 (the last) or 6 (saved every
    3), continued for a third epoch: 4 or 6 steps more than the schedule has left."""
    first = trainer(tmp_path, 2, every)
    first.fit(OneCycle())  # a fresh fit, its schedule built for it: trained to its end
    (_, ended, _), *_ = ending_schedules(first)
    assert ended == 0
    refused = rf"OneCycleLR has {left} steps left and this fit takes {takes}: it cannot step"
    with pytest.raises(ConfigError, match=refused):
        trainer(tmp_path, 3, every).fit(OneCycle(), ckpt_path=str(tmp_path / "last.ckpt"))
