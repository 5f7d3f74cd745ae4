"""enwik8 data: download and verification, byte vocabulary, markup cleaning, MLM masking, the
token cache and its validation windows (`repgeom.data.tokens`, no Lightning), and the
LightningDataModule that serves training windows (`repgeom.data.datamodule`, imported on first
use so that the probes never load Lightning)."""

from importlib import import_module

from repgeom.data.enwik8 import DataError
from repgeom.data.masking import mlm_mask
from repgeom.data.vocab import Vocab

_LAZY = {"ContiguousWindows", "Enwik8DataModule", "RandomWindows"}

__all__ = [
    "ContiguousWindows",
    "DataError",
    "Enwik8DataModule",
    "RandomWindows",
    "Vocab",
    "mlm_mask",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module("repgeom.data.datamodule"), name)
    raise AttributeError(f"module 'repgeom.data' has no attribute {name!r}")
