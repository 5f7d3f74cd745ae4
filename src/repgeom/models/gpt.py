"""A character-level transformer in one file, after nanoGPT's model.py.

The same network serves as a decoder (causal self-attention) and as an encoder (no mask), so
that the attention mask is the only difference between the two; `norm="post"` gives BERT's
block layout to separate the effect of the mask from that of the layer-norm position.

Besides the logits, `capture()` returns what the probes read: the residual stream after the
embedding and after every block, the output of the final norm (pre-LN only), per-head queries
and keys, and (on request) attention probabilities. Normal training goes through
`scaled_dot_product_attention` and pays nothing for this.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from repgeom.models.capture import Capture


@dataclass
class GPTConfig:
    """Architecture of a `GPT`; checked on creation so a bad override fails at once."""

    vocab_size: int
    name: str = "custom"
    block_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True
    norm: Literal["pre", "post"] = "pre"
    causal: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if int(getattr(self, name)) < 1:
                raise ValueError(
                    f"model.{name} must be a positive integer, got {getattr(self, name)}"
                )
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head}); "
                "change one of them so each head gets a whole number of dimensions"
            )
        if self.norm not in ("pre", "post"):
            raise ValueError(f"model.norm must be 'pre' or 'post', got {self.norm!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout}")


class SelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.causal = config.causal
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, record: dict[str, list] | None = None) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, H, T, D)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, H, T, D)
        if record is not None and "attention" in record:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))  # (B, H, T, T)
            if self.causal:
                future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
                scores = scores.masked_fill(future, float("-inf"))
            probs = F.softmax(scores.float(), dim=-1).to(q.dtype)
            y = probs @ v  # (B, H, T, D)
            record["attention"].append(probs)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, is_causal=self.causal, dropout_p=self.dropout if self.training else 0.0
            )
        if record is not None:
            record["queries"].append(q)
            record["keys"].append(k)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LN (GPT-2: x + f(LN(x))) or post-LN (BERT: LN(x + f(x))) transformer block."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.pre_norm = config.norm == "pre"
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = SelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, record: dict[str, list] | None = None) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attn(self.ln_1(x), record)
            return x + self.mlp(self.ln_2(x))
        x = self.ln_1(x + self.attn(x, record))
        return self.ln_2(x + self.mlp(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                # Pre-LN normalises once after the last block (GPT-2); post-LN normalises the
                # embedding instead (BERT), so both layouts have the same parameter count.
                ln=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as in GPT-2
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # scaled residual init (GPT-2 paper)
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; position embeddings excluded by default, as in nanoGPT."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def _run(
        self, idx: torch.Tensor, record: dict[str, list] | None, logits: bool = True
    ) -> torch.Tensor | None:
        B, T = idx.size()
        if T > self.config.block_size:
            raise ValueError(
                f"input length {T} exceeds model.block_size {self.config.block_size}; "
                "use shorter windows or a model with a larger block_size"
            )
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(
            self.transformer.wte(idx) + self.transformer.wpe(pos)
        )  # (B, T, C)
        pre_norm = self.config.norm == "pre"
        if not pre_norm:
            x = self.transformer.ln(x)
        if record is not None:
            record["hidden"].append(x)
        for block in self.transformer.h:
            x = block(x, record)
            if record is not None:
                record["hidden"].append(x)
        if pre_norm:
            x = self.transformer.ln(x)
            if record is not None:
                record["final_norm"] = x
        return self.lm_head(x) if logits else None  # (B, T, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, vocab) for token ids (B, T)."""
        return self._run(idx, None)

    @torch.no_grad()
    def capture(self, idx: torch.Tensor, attention: bool = True) -> Capture:
        """Hidden states, queries, keys and (if `attention`) attention probabilities for `idx`."""
        record: dict[str, list] = {"hidden": [], "queries": [], "keys": []}
        if attention:
            record["attention"] = []
        self._run(idx, record, logits=False)
        return Capture(
            hidden=record["hidden"],
            final_norm=record.get("final_norm"),
            queries=record["queries"],
            keys=record["keys"],
            attention=record.get("attention", []),
            causal=self.config.causal,
        )

    @torch.no_grad()
    def capture_positions(
        self, windows: torch.Tensor, positions: torch.Tensor, *, batch_size: int
    ) -> Capture:
        """Hidden states (and the final norm's output) at the marked positions of every window.

        Parameters
        ----------
        windows : (N, T) int64 tensor of token ids
        positions : (N, T) bool tensor, True where the state is wanted
        batch_size : windows per forward pass

        Returns
        -------
        Capture
            ``hidden`` (and ``final_norm``) as (1, S, C) tensors, S = ``positions.sum()``, the
            states in window order and, within a window, position order (what flattening a
            whole-window capture at ``valid = positions`` gives); ``valid`` None, no queries,
            keys or attention.

        Under a causal mask the state at position p depends only on tokens 0..p, so each window
        is run only up to its last marked position: the windows go through the model in order
        of that length, each micro-batch cut at its longest, and the states are put back in
        window order. The numbers are those of whole windows up to float rounding (another
        batch shape, another summation order in the kernels). A bidirectional model reads
        every window whole.
        """
        n_windows, T = windows.shape
        positions = positions.to(torch.bool).cpu()
        if positions.shape != windows.shape:
            raise ValueError(
                f"positions must have the windows' shape {tuple(windows.shape)}, "
                f"got {tuple(positions.shape)}"
            )
        device = next(self.parameters()).device
        length = torch.full((n_windows,), T)
        if self.config.causal:  # last marked position + 1 (a window with none: 0)
            last = torch.where(positions, torch.arange(T), -1).amax(dim=1)
            length = last + 1
        order = torch.argsort(length, stable=True)
        order = order[length[order] > 0]  # windows with no marked position are not run
        counts = positions.sum(dim=1)
        start = counts.cumsum(0) - counts  # (N,) each window's first row in the output
        rank = positions.cumsum(dim=1) - 1  # (N, T) a marked position's row within its window
        hidden: list[torch.Tensor] = []
        final: torch.Tensor | None = None
        for first in range(0, len(order), batch_size):
            chunk = order[first : first + batch_size]
            cut = int(length[chunk].max())
            marked = positions[chunk, :cut]  # (b, cut)
            rows = (start[chunk, None] + rank[chunk, :cut])[marked].to(device)  # output rows
            capture = self.capture(windows[chunk, :cut].to(device), attention=False)
            states = capture.hidden + ([capture.final_norm] if capture.final_norm is not None
                                       else [])
            if not hidden:
                hidden = [s.new_empty(int(counts.sum()), s.shape[-1]) for s in states]
            keep = marked.flatten().nonzero()[:, 0].to(device)  # flat (window, position)
            for out, s in zip(hidden, states, strict=True):
                out.index_copy_(0, rows, s.reshape(-1, s.shape[-1]).index_select(0, keep))
        if not hidden:
            raise ValueError("positions marks no position: nothing to capture")
        if self.config.norm == "pre":
            final = hidden.pop()[None]
        return Capture(hidden=[h[None] for h in hidden], final_norm=final,
                       causal=self.config.causal)
