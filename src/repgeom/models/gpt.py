"""A character-level transformer in one file, after nanoGPT's model.py.

The same network serves as a decoder (causal self-attention) and as an encoder (no mask), so
that the attention mask is the only difference between the two; `norm="post"` gives BERT's
block layout to separate the effect of the mask from that of the layer-norm position.

Besides the logits, `capture()` returns what the probes read: the residual stream after the
embedding and after every block, the output of the final norm (pre-LN only), per-head queries
and keys, and (on request) attention probabilities. Normal training goes through
`scaled_dot_product_attention` and pays nothing for this.

`vocab_multiple` pads the token embedding and the output layer (tied, one matrix) to a multiple
of that many rows, for the GPU's matmul tiles (issue 41: 207 symbols become 256 rows at 64).
The extra rows are zero, never looked up, and their logits are cut off in `forward`, so the
loss, its gradients and every captured state are those of the unpadded model; `state_dict`
holds the vocabulary's rows only, so checkpoints keep their keys and shapes, and a checkpoint
of either layout loads into the other.
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
    vocab_multiple: int = 1  # pad the embedding/output rows to a multiple of this (1: none)

    @property
    def padded_vocab_size(self) -> int:
        """The rows of the embedding and output matrix: vocab_size rounded up to the multiple."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "vocab_multiple"):
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

    def forward_at(self, x: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        """The attention output at positions `at` of each window only: (B, M, C).

        `at` is (B, M) position indices into x's T positions. Keys and values come from every
        position, queries only from `at` (under a causal mask a query at position p sees keys
        0..p): what `forward` gives at those rows, up to float rounding, at a fraction of the
        cost when M << T.
        """
        B, T, C = x.size()
        M = at.shape[1]
        H, D = self.n_head, C // self.n_head
        weight, bias = self.c_attn.weight, self.c_attn.bias
        rows = x.gather(1, at[..., None].expand(B, M, C))
        q = F.linear(rows, weight[:C], None if bias is None else bias[:C])
        k, v = F.linear(x, weight[C:], None if bias is None else bias[C:]).split(C, dim=2)
        q = q.view(B, M, H, D).transpose(1, 2)  # (B, H, M, D)
        k = k.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        v = v.view(B, T, H, D).transpose(1, 2)
        mask = None
        if self.causal:  # (B, 1, M, T): key s is visible to the query at position p if s <= p
            mask = (torch.arange(T, device=x.device) <= at[..., None])[:, None]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.transpose(1, 2).reshape(B, M, C)
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

    def forward_at(self, x: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        """The block's output at positions `at` (B, M) of each window only: (B, M, C), what
        `forward` gives at those rows (`SelfAttention.forward_at`: every position still feeds
        the keys and values; the queries, the attention output and the MLP run on M rows)."""
        rows = x.gather(1, at[..., None].expand(*at.shape, x.shape[-1]))
        if self.pre_norm:
            rows = rows + self.attn.forward_at(self.ln_1(x), at)
            return rows + self.mlp(self.ln_2(rows))
        rows = self.ln_1(rows + self.attn.forward_at(x, at))
        return self.ln_2(rows + self.mlp(rows))


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
        if config.padded_vocab_size > config.vocab_size:
            # zero rows appended after the layers are made: every random draw (theirs, the
            # init's below) is that of the unpadded model
            weight = self.lm_head.weight.detach()
            padding = weight.new_zeros(config.padded_vocab_size - config.vocab_size, config.n_embd)
            self.lm_head.weight = nn.Parameter(torch.cat([weight, padding]))
            self.lm_head.out_features = self.transformer.wte.num_embeddings = (
                config.padded_vocab_size)
            self.register_state_dict_post_hook(_unpad_vocab_rows)
            self.register_load_state_dict_pre_hook(_pad_vocab_rows)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as in GPT-2
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # scaled residual init (GPT-2 paper)
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _vocab_rows(self, weight: torch.Tensor) -> torch.Tensor:
        """The vocabulary's rows of the (tied) embedding/output matrix, the whole of any other
        weight: initialised alone, they draw the same random numbers as an unpadded model's."""
        return weight[: self.config.vocab_size] if weight is self.lm_head.weight else weight

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(self._vocab_rows(module.weight), mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(self._vocab_rows(module.weight), mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; position embeddings excluded by default, as in nanoGPT; the zero
        rows that pad the vocabulary (`vocab_multiple`) are layout, not parameters."""
        padding = (self.config.padded_vocab_size - self.config.vocab_size) * self.config.n_embd
        n = sum(p.numel() for p in self.parameters()) - padding
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def _embed(self, idx: torch.Tensor) -> torch.Tensor:
        """Token plus position embeddings of `idx` (B, T), and post-LN's embedding norm."""
        T = idx.size(1)
        if T > self.config.block_size:
            raise ValueError(
                f"input length {T} exceeds model.block_size {self.config.block_size}; "
                "use shorter windows or a model with a larger block_size"
            )
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        return x if self.config.norm == "pre" else self.transformer.ln(x)

    def _run(
        self, idx: torch.Tensor, record: dict[str, list] | None, logits: bool = True
    ) -> torch.Tensor | None:
        x = self._embed(idx)  # (B, T, C)
        pre_norm = self.config.norm == "pre"
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
        if not logits:
            return None
        logits = self.lm_head(x)  # (B, T, padded vocab)
        vocab = self.config.vocab_size
        return logits if logits.size(-1) == vocab else logits[..., :vocab]  # (B, T, vocab)

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

    def _states_at(self, idx: torch.Tensor, at: torch.Tensor) -> list[torch.Tensor]:
        """The residual stream after the embedding and every block, and the final norm's output
        (pre-LN), at positions `at` (B, M) of windows `idx` (B, T): (B, M, C) tensors. The last
        block runs on those rows only (`Block.forward_at`) when they are at most half of T."""
        blocks = self.transformer.h
        index = at[..., None].expand(*at.shape, self.config.n_embd)
        x = self._embed(idx)
        states = [x.gather(1, index)]
        for block in blocks[:-1]:
            x = block(x)
            states.append(x.gather(1, index))
        if 2 * at.shape[1] <= idx.shape[1]:
            x = blocks[-1].forward_at(x, at)
        else:
            x = blocks[-1](x).gather(1, index)
        states.append(x)
        if self.config.norm == "pre":
            states.append(self.transformer.ln(x))
        return states

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
        window order. A bidirectional model reads every window whole. Every block but the last
        runs on every position (a later block reads them all); the last one, and the final
        norm, only on the marked rows (`Block.forward_at`: keys and values from every position,
        queries, attention output and MLP at the marked rows), unless a window marks more than
        half of its positions. Only the marked rows of each layer are kept. The numbers are
        those of whole windows up to float rounding (other batch shapes and kernels, another
        summation order).
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
        counts = positions.sum(dim=1)
        order = order[(length[order] > 0) & (counts[order] > 0)]  # none marked: not run
        if len(order) == 0:
            raise ValueError("positions marks no position: nothing to capture")
        start = counts.cumsum(0) - counts  # (N,) each window's first row in the output
        kept: list[torch.Tensor] = []
        for first in range(0, len(order), batch_size):
            chunk = order[first : first + batch_size]
            cut = int(length[chunk].max())
            m = int(counts[chunk].max())
            # each window's marked positions in order, padded with position 0: (b, m)
            at = torch.where(positions[chunk, :cut], torch.arange(cut), cut).sort(dim=1)[0]
            valid = at[:, :m] < cut
            at = torch.where(valid, at[:, :m], 0)
            rows = (start[chunk, None] + torch.arange(m))[valid].to(device)  # output rows
            states = self._states_at(windows[chunk, :cut].to(device), at.to(device))
            if not kept:
                kept = [s.new_empty(int(counts.sum()), s.shape[-1]) for s in states]
            valid = valid.to(device)
            for out, s in zip(kept, states, strict=True):
                out.index_copy_(0, rows, s[valid])
        pre_norm = self.config.norm == "pre"
        final = kept.pop()[None] if pre_norm else None
        return Capture(hidden=[h[None] for h in kept], final_norm=final,
                       causal=self.config.causal)


_VOCAB_WEIGHTS = ("transformer.wte.weight", "lm_head.weight")


def _unpad_vocab_rows(module: GPT, state_dict: dict, prefix: str, local_metadata) -> None:
    """`state_dict` hook: the embedding/output matrix without its zero padding rows."""
    for key in _VOCAB_WEIGHTS:
        if prefix + key in state_dict:
            state_dict[prefix + key] = state_dict[prefix + key][: module.config.vocab_size]


def _pad_vocab_rows(module: GPT, state_dict: dict, prefix: str, *args) -> None:
    """`load_state_dict` pre-hook: a checkpoint's vocabulary rows, padded with zero rows."""
    rows = module.config.padded_vocab_size
    for key in _VOCAB_WEIGHTS:
        weight = state_dict.get(prefix + key)
        if weight is not None and weight.size(0) == module.config.vocab_size:
            pad = weight.new_zeros(rows - weight.size(0), *weight.shape[1:])
            state_dict[prefix + key] = torch.cat([weight, pad])
