"""What a model hands to the probes: hidden states, queries, keys and attention per layer.

Our own model (`repgeom.models.gpt`) and Hugging Face models (`repgeom.models.hf`) both fill this
structure, so every probe reads one format whatever the model was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

FINAL_NORM = "final_norm"
"""`layer_name` of the final norm's output, probed as layer L + 1 where a model has one."""


def layer_names(n_blocks: int, final_norm: bool) -> list[str]:
    """Names of the probed layers by index: ``embedding``, ``block_1`` .. ``block_L``, and
    ``final_norm`` when the model has one.

    >>> layer_names(2, True)
    ['embedding', 'block_1', 'block_2', 'final_norm']
    """
    return ["embedding", *(f"block_{i}" for i in range(1, n_blocks + 1))] + (
        [FINAL_NORM] if final_norm else []
    )


@dataclass
class Capture:
    """Internal states of one forward pass over a batch of B windows of T tokens.

    Attributes
    ----------
    hidden : list of (B, T, C) tensors
        The residual stream: the state after the embedding (index 0) and after every block
        (index 1..n_layer), before any final norm. This is the one layer convention of every
        model repgeom probes, ours and Hugging Face's alike.
    final_norm : (B, T, C) tensor or None
        The output of the model's final normalisation (GPT-2's ``ln_f``), for models that have
        one; probed as its own layer, named ``final_norm``, after the last block. None for
        models without one (post-LN blocks normalise inside each block).
    queries, keys : list of (B, H, T, D) tensors, one per block
        Per-head queries and keys as they enter the attention product (before the 1/sqrt(D)
        scaling). Empty when the model's attention projections cannot be read.
    attention : list of (B, H, T, T) tensors, one per block
        Attention probabilities (rows sum to one over the positions a query may attend to).
        Empty when not requested or not readable.
    causal : bool
        True when each position attends only to itself and earlier positions.
    valid : (B, T) bool tensor or None
        Positions to include in the probes (False for padding or excluded special tokens);
        None means all positions.
    """

    hidden: list[torch.Tensor]
    final_norm: torch.Tensor | None = None
    queries: list[torch.Tensor] = field(default_factory=list)
    keys: list[torch.Tensor] = field(default_factory=list)
    attention: list[torch.Tensor] = field(default_factory=list)
    causal: bool = True
    valid: torch.Tensor | None = None

    @property
    def n_layers(self) -> int:
        """Number of blocks (the embedding state is not counted)."""
        return len(self.hidden) - 1

    def layers(self) -> list[torch.Tensor]:
        """The probed layers, the one rule for every reader: the embedding output, each block's
        output, then the final norm's output where the model has one (`layer_names`)."""
        return [*self.hidden, *([] if self.final_norm is None else [self.final_norm])]

    def layer_names(self) -> list[str]:
        """The names of `layers`: ``embedding``, ``block_<i>``, ``final_norm``."""
        return layer_names(self.n_layers, self.final_norm is not None)

    def text_states(self, row: int = 0) -> list[torch.Tensor]:
        """Per layer (`layers`), the (T, C) float32 CPU states of window `row` at its valid
        positions: what one text gives every reader (compare mode, the analyses)."""
        keep = slice(None) if self.valid is None else self.valid[row]
        return [h[row][keep].float().cpu() for h in self.layers()]
