"""Sentences on two topics, one text file each, tokenised when read."""

import random
import shutil
import tempfile
from pathlib import Path

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset

from my_lightning_project.kit.data import SplitDataModule, split_dataset, split_sizes

TOPICS = (
    "apple banana cherry grape lemon mango melon orange peach pear plum",
    "engine piston valve gear clutch brake wheel axle pump belt bolt",
)
FILLER = "the a of and with from near very some".split()
VOCABULARY = ["<pad>", *sorted({w for topic in TOPICS for w in topic.split()} | set(FILLER))]
NUM_SENTENCES = 600


def write_sentences(folder: Path, seed: int = 0) -> None:
    """`<index>_<topic>.txt` files of 3 to 12 words, written once."""
    if folder.is_dir():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    # A folder of its own, renamed into place: runs started together never share it.
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    rng = random.Random(seed)
    for index in range(NUM_SENTENCES):
        topic = index % 2
        words = [
            rng.choice(TOPICS[topic].split() if rng.random() < 0.5 else FILLER)
            for _ in range(rng.randint(3, 12))
        ]
        (staging / f"{index:04d}_{topic}.txt").write_text(" ".join(words))
    try:
        staging.rename(folder)
    except OSError:  # another run finished first
        shutil.rmtree(staging)


class Sentences(Dataset):
    def __init__(self, folder: Path):
        self.files = sorted(folder.glob("*.txt"))
        self.ids = {word: i for i, word in enumerate(VOCABULARY)}

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> dict:
        path = self.files[index]
        tokens = [self.ids[word] for word in path.read_text().split()]
        return {"tokens": torch.tensor(tokens), "label": int(path.stem.split("_")[1])}


class SentenceDataModule(SplitDataModule):
    def __init__(
        self,
        batch_size: int = 32,
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        split_seed: int = 42,
        predict_split: str = "test",
        data_dir: str = "data/sentences",
    ):
        super().__init__(batch_size, num_workers, pin_memory, split_seed, predict_split)

    def prepare_data(self) -> None:
        write_sentences(Path(self.hparams.data_dir))

    def make_splits(self) -> dict[str, Dataset]:
        self.prepare_data()
        sizes = split_sizes(NUM_SENTENCES, 0.15, 0.15)
        return split_dataset(Sentences(Path(self.hparams.data_dir)), sizes, self.hparams.split_seed)

    def collate_fn(self, samples: list[dict]) -> dict:
        tokens = pad_sequence([s["tokens"] for s in samples], batch_first=True)
        return {
            "tokens": tokens,
            "mask": tokens != 0,
            "label": torch.tensor([s["label"] for s in samples]),
        }
