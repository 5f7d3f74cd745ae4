"""The sweep of experiment 4 (`repgeom.experiments.common_bias`): fresh blocks, one common bias
of growing norm, one row per (norm, layer, head).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pandas as pd
import torch

from repgeom.metrics import (
    attention_entropy,
    drift,
    isotropic_mean_cosine_chance,
    mean_cosine_similarity,
    qk_alignment,
)
from repgeom.metrics._validation import check_int
from repgeom.models.gpt import GPT, GPTConfig

#: Columns of the table `common_bias_sweep` returns, one row per (norm, layer, head).
COLUMNS = [
    "model", "norm_position", "causal", "n_embd", "n_layer", "n_head",  # what was swept
    "norm",  # N, the norm of the common bias
    "layer", "n_blocks",  # output taken after block `layer` (0-based), i.e. n_blocks = layer + 1
    "head",
    "cos_in", "cos_out", "cos_baseline",  # mean pairwise cosine; 95% isotropic chance level
    "norm_in", "norm_out", "norm_ratio",  # mean token norm, and out / in
    "drift_in", "drift_out", "drift_gain",  # ||mean state||, and out / in (the gain g(N))
    "drift_ratio_in", "drift_ratio_out",  # ||mean state|| / mean token norm
    "score_mean", "score_std", "score_max_abs",  # pre-softmax q.k/sqrt(D) of this head
    "prob_max", "prob_median", "prob_min",  # mean over rows of the row's max/median/min prob.
    "entropy", "normalized_entropy",  # mean row entropy (nats), and / log(#attendable keys)
]


def common_bias_sweep(
    config: GPTConfig,
    *,
    norms: Sequence[float],
    n_tokens: int = 128,
    n_sequences: int = 2,
    seed: int = 0,
    norm_position: str | None = None,
    token_std: float = 0.02,
    layers: Sequence[int] | None = None,
) -> pd.DataFrame:
    """Feed fresh blocks isotropic token states plus one common bias of norm N, for every N.

    See the module docstring for the inputs, the blocks and the measures.

    Parameters
    ----------
    config : GPTConfig
        Architecture of the blocks (``n_embd``, ``n_head``, ``n_layer``, ``bias``, ``norm``,
        ``causal``); ``vocab_size`` and ``block_size`` do not matter (no embedding is used).
    norms : sequence of float, keyword-only
        Bias norms N >= 0, distinct; the table is sorted by N. Include 0 for the unbiased
        reference. Only N > 0 enter the fixed point (it is interpolated in log N).
    n_tokens, n_sequences : int, keyword-only
        Shape of the input: ``n_sequences`` sequences of ``n_tokens`` (>= 2) token states each.
        Attention runs within a sequence; cosine, norm and drift pool all the states.
    seed : int, keyword-only
        Seeds the block initialisation and (separately) the inputs ``Z`` and the direction ``u``;
        the same seed gives the same table. The global torch RNG is left as it was.
    norm_position : {"pre", "post"} or None, keyword-only
        Overrides ``config.norm`` (pre-LN GPT-2 block or post-LN BERT block); None keeps it.
    token_std : float, keyword-only
        Std of each coordinate of ``Z`` (> 0); 0.02, the embedding initialisation, by default.
    layers : sequence of int or None, keyword-only
        Blocks (0-based) whose output and attention are measured; all blocks run regardless.
        None gives ``(0, n_layer - 1)``: "one block" and "through all blocks".

    Returns
    -------
    pandas.DataFrame
        The columns of `COLUMNS`, one row per (norm, layer, head); the input and output columns
        (``cos_*``, ``norm_*``, ``drift_*``) repeat over the heads of a (norm, layer). ``*_in``
        always describe the stack's input ``X(N)``, ``*_out`` the output of block ``layer``.

    Raises
    ------
    ValueError
        If an argument is out of range (the message names it).

    Examples
    --------
    >>> cfg = GPTConfig(vocab_size=8, n_layer=1, n_head=2, n_embd=16)
    >>> t = common_bias_sweep(cfg, norms=[0.0, 10.0], n_tokens=8, n_sequences=2)
    >>> t.groupby("norm").cos_in.first().round(2).tolist()[1]
    1.0
    """
    if not isinstance(config, GPTConfig):
        raise ValueError(f"config must be a GPTConfig, got {type(config).__name__}")
    norm_values = _check_norms(norms)
    n_tokens = check_int(n_tokens, "n_tokens", minimum=2)
    n_sequences = check_int(n_sequences, "n_sequences", minimum=1)
    seed = check_int(seed, "seed", minimum=None)
    if norm_position is not None:
        if norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be 'pre', 'post' or None, got {norm_position!r}")
        config = replace(config, norm=norm_position)
    if (
        isinstance(token_std, bool)
        or not isinstance(token_std, numbers.Real)
        or not math.isfinite(token_std)
        or token_std <= 0
    ):
        raise ValueError(f"token_std must be a finite number > 0, got {token_std!r}")
    if layers is None:
        layers = sorted({0, config.n_layer - 1})
    else:
        layers = sorted({check_int(i, "layers", minimum=0) for i in layers})
        if not layers or layers[-1] >= config.n_layer:
            raise ValueError(
                f"layers must be a non-empty list of block indices in [0, {config.n_layer - 1}], "
                f"got {list(layers)}"
            )
    return _common_bias_sweep(
        config, norm_values, n_tokens, n_sequences, seed, float(token_std), layers
    )


def _check_norms(norms) -> np.ndarray:
    try:
        values = np.asarray(list(norms), dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"norms must be a sequence of numbers, got {norms!r}") from err
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"norms must be a non-empty 1-D sequence, got shape {values.shape}")
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        raise ValueError(f"norms must be finite and >= 0, got {values.tolist()}")
    if np.unique(values).size != values.size:
        raise ValueError(f"norms must be distinct, got {values.tolist()}")
    return np.sort(values)


def _fresh_blocks(config: GPTConfig, seed: int) -> torch.nn.ModuleList:
    """The blocks of a GPT initialised under `seed`, without touching the global RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(config)
    return model.transformer.h.to(torch.float64).eval()


def _inputs(config: GPTConfig, n_sequences: int, n_tokens: int, seed: int, token_std: float):
    # A generator of its own, offset from the init seed, so that Z and u do not depend on how
    # many numbers the model initialisation drew.
    gen = torch.Generator().manual_seed(seed + 1_000_003)
    d = config.n_embd
    Z = token_std * torch.randn(n_sequences, n_tokens, d, generator=gen, dtype=torch.float64)
    u = torch.randn(d, generator=gen, dtype=torch.float64)
    return Z, u / torch.linalg.vector_norm(u)  # (B, T, d), (d,)


@torch.no_grad()
def _common_bias_sweep(config, norms, n_tokens, n_sequences, seed, token_std, layers):
    blocks = _fresh_blocks(config, seed)
    Z, u = _inputs(config, n_sequences, n_tokens, seed, token_std)
    d, n = config.n_embd, n_sequences * n_tokens
    baseline = isotropic_mean_cosine_chance(n, d)
    fixed = dict(
        model=config.name, norm_position=config.norm, causal=config.causal, n_embd=d,
        n_layer=config.n_layer, n_head=config.n_head,
    )
    rows = []
    for N in norms:
        x = Z + N * u  # (B, T, d)
        flat = x.reshape(n, d)
        d_in = drift(flat)
        inp = dict(
            cos_in=mean_cosine_similarity(flat), cos_baseline=baseline,
            norm_in=float(torch.linalg.vector_norm(flat, dim=1).mean()),
            drift_in=d_in.norm, drift_ratio_in=d_in.ratio,
        )
        h = x
        for i, block in enumerate(blocks):
            record = {"queries": [], "keys": [], "attention": []} if i in layers else None
            h = block(h, record)  # (B, T, d)
            if record is None:
                continue
            out = h.reshape(n, d)
            d_out = drift(out)
            norm_out = float(torch.linalg.vector_norm(out, dim=1).mean())
            cos_out = mean_cosine_similarity(out)
            qk = qk_alignment(record["queries"][0], record["keys"][0], causal=config.causal)
            att = attention_entropy(record["attention"][0], causal=config.causal)
            for head in range(config.n_head):
                rows.append(dict(
                    fixed, norm=float(N), layer=i, n_blocks=i + 1, head=head, **inp,
                    cos_out=cos_out, norm_out=norm_out, norm_ratio=norm_out / inp["norm_in"],
                    drift_out=d_out.norm, drift_gain=d_out.norm / d_in.norm,
                    drift_ratio_out=d_out.ratio,
                    score_mean=float(qk.score_mean[head]), score_std=float(qk.score_std[head]),
                    score_max_abs=float(qk.score_max_abs[head]),
                    prob_max=float(att.max_prob[head]), prob_median=float(att.median_prob[head]),
                    prob_min=float(att.min_prob[head]), entropy=float(att.entropy[head]),
                    normalized_entropy=float(att.normalized_entropy[head]),
                ))
    return pd.DataFrame(rows, columns=COLUMNS)
