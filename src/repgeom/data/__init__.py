"""enwik8 data: download and verification, byte vocabulary, markup cleaning, MLM masking, and
the LightningDataModule that serves token windows."""

from repgeom.data.datamodule import ContiguousWindows, Enwik8DataModule, RandomWindows
from repgeom.data.enwik8 import DataError
from repgeom.data.masking import mlm_mask
from repgeom.data.vocab import Vocab

__all__ = [
    "ContiguousWindows",
    "DataError",
    "Enwik8DataModule",
    "RandomWindows",
    "Vocab",
    "mlm_mask",
]
