"""A stand-in model with planted states, for tests that need known answers."""

from __future__ import annotations

import torch

from repgeom.analyses.subjects import Subject


class ArraySubject(Subject):
    """A stand-in model with planted states: ``states(text)`` returns ``table[text]``."""

    def __init__(self, table: dict, layer_names: list[str], name: str = "planted") -> None:
        self.table, self.layer_names, self.name = table, layer_names, name

    def states(self, text: str) -> list[torch.Tensor]:
        return [torch.as_tensor(h, dtype=torch.float32) for h in self.table[text]]

    def tokens(self, text: str) -> list[str]:
        return [str(i) for i in range(len(self.table[text][0]))]
