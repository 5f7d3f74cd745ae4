"""Experiment 4: a freshly initialised block under a common bias (Godey et al. 2024, section 4).

Godey, de la Clergerie and Sagot, "Anisotropy Is Inherent to Self-Attention in Transformers"
(EACL 2024, arXiv:2401.12143), section 4, feed an *untrained* Transformer block with untrained
token representations ``x`` plus one common bias vector ``b`` of norm ``N`` (their setup: a block
initialised as in BERT, 16 sequences of length 512 drawn uniformly from the embedding table,
``b`` a random direction scaled to norm ``N``), to see what a drift of the inputs alone does to
the outputs and to self-attention as ``N`` grows. This module repeats that with repgeom's own
`Block` (pre-LN or post-LN, causal or not) and GPT initialisation:

* **Inputs.** ``X(N) = Z + N u``: ``Z`` of shape (n_sequences, n_tokens, d) with i.i.d.
  ``N(0, token_std^2)`` entries, i.e. isotropic token states of typical norm
  ``token_std * sqrt(d)``; the default ``token_std = 0.02`` is the std of repgeom's (and BERT's,
  and GPT-2's) embedding initialisation, so the tokens look like rows of a fresh embedding
  table, as in the paper. ``u`` is ONE uniformly random unit vector. ``Z`` and ``u`` are drawn
  once per seed and shared by every ``N``, so the sweep changes nothing but the bias norm.
  As in the paper, the states enter the block directly (no embedding LayerNorm in front, no
  positional embedding: ``Z`` stands for token + position embeddings).
* **Blocks.** The ``n_layer`` blocks of ``GPT(config)`` freshly initialised under ``seed``
  (weights N(0, 0.02), residual projections scaled by ``1/sqrt(2 n_layer)``, LayerNorm gain 1 and
  bias 0), in eval mode, run in float64: at ``N = 1e5`` float32 would keep only ~1e-2 absolute
  precision of each state, the size of the token-specific part. "One block" is block 0 fed
  ``X(N)``; "through all blocks" is the output of the last block of the stack fed ``X(N)``.
* **Measures**, on all ``n_sequences * n_tokens`` states pooled: mean pairwise cosine
  (`repgeom.metrics.mean_cosine_similarity`) and mean token norm of input and output; the
  *drift norm* ``D = || mean over tokens ||`` (`repgeom.metrics.drift`) of input and output, and
  the *drift gain* ``g(N) = D_out / D_in``; per head of the block that produced the output: the
  mean, std and max ``|.|`` of the pre-softmax scores ``q.k / sqrt(D_head)``
  (`repgeom.metrics.qk_alignment`), and the mean over rows of each softmax row's max, median and
  min probability and its entropy (`repgeom.metrics.attention_entropy`; causal rows count only
  their attendable keys).

**The fixed point N\\*.** The drift gain compares the common component that leaves the block with
the one that entered it: ``g > 1`` means the block amplifies the common bias, ``g < 1`` that it
shrinks it. ``N*`` is the bias norm at which ``g(N*) = 1`` -- the common component is passed on
with its norm unchanged -- found by linear interpolation of ``log g`` against ``log N`` between
the two swept norms that bracket the first *clear* sign change of ``log g`` (norms > 0 only;
clear: ``|g - 1| > 1%`` at some swept norm on each side, see `drift_fixed_point`). A crossing
from ``g > 1`` below to ``g < 1`` above is *stable*: a stack of such blocks would pull the drift
norm towards ``N*`` from both sides. When the sweep brackets no clear crossing, ``N*`` is
``None`` with the reason (e.g. a pre-LN block, whose residual stream carries the bias through,
has ``g -> 1`` for large N). Because ``D_in -> N`` for ``N`` well above the noise level
``token_std * sqrt(d / n)`` of the sample mean, ``N*`` is, to that precision, the ``N`` at which
the output drift norm equals the bias norm.

The paper's section 4 figures plot input vs output cosine similarity and norm against ``N``, and
the max/median/min of softmax rows against ``N``; their numbers could not be checked from here
(see ``docs/results/common_bias/README.md`` for what was and was not verified).

Run it with ``repgeom-common-bias model=gpt_small`` (Hydra config
``conf/common_bias.yaml``); it writes ``common_bias.csv``, ``common_bias.png`` and
``summary.json`` into ``outputs/common_bias/<date>/<time>``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from repgeom.experiments.common_bias.figure import plot_common_bias
from repgeom.experiments.common_bias.markdown import render_markdown
from repgeom.experiments.common_bias.summary import FixedPoint, drift_fixed_point, summarize
from repgeom.experiments.common_bias.sweep import COLUMNS, common_bias_sweep
from repgeom.models.gpt import GPTConfig

__all__ = [
    "COLUMNS",
    "FixedPoint",
    "CommonBiasRun",
    "common_bias_sweep",
    "drift_fixed_point",
    "summarize",
    "plot_common_bias",
    "run",
    "render_markdown",
]


log = logging.getLogger(__name__)


@dataclass
class CommonBiasRun:
    """What `run` made: the table, its summary, and the files it wrote."""

    frame: pd.DataFrame
    summary: dict
    output_dir: Path
    csv: Path
    png: Path
    json: Path


def config_from_cfg(cfg) -> GPTConfig:
    """`GPTConfig` from a composed Hydra config (``cfg.model``, ``cfg.masking``)."""
    from omegaconf import OmegaConf

    model = OmegaConf.to_container(cfg.model, resolve=True)
    model.pop("_target_", None)
    model.setdefault("vocab_size", 256)  # unused: the sweep feeds states straight to the blocks
    masking = cfg.get("masking")
    if masking is not None and masking.get("causal") is not None:
        model["causal"] = bool(masking.causal)
    return GPTConfig(**model)


def run(cfg) -> CommonBiasRun:
    """Sweep, summarise, plot and write ``common_bias.{csv,png}`` and ``summary.json``.

    ``cfg`` is the composed ``conf/common_bias.yaml``: ``model``, ``masking``, ``norms``,
    ``n_tokens``, ``n_sequences``, ``seed``, ``token_std``, ``norm_position`` and ``output_dir``.
    """
    config = config_from_cfg(cfg)
    start = time.perf_counter()
    frame = common_bias_sweep(
        config,
        norms=list(cfg.norms),
        n_tokens=int(cfg.n_tokens),
        n_sequences=int(cfg.n_sequences),
        seed=int(cfg.seed),
        norm_position=cfg.get("norm_position"),
        token_std=float(cfg.token_std),
    )
    summary = summarize(frame)
    summary["settings"] = {
        "n_tokens": int(cfg.n_tokens), "n_sequences": int(cfg.n_sequences),
        "seed": int(cfg.seed), "token_std": float(cfg.token_std),
        "typical_token_norm": float(cfg.token_std) * math.sqrt(config.n_embd),
        "sweep_seconds": round(time.perf_counter() - start, 1),
        "command": _command_line(),
    }
    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": output_dir / "common_bias.csv",
        "png": output_dir / "common_bias.png",
        "json": output_dir / "summary.json",
    }
    frame.to_csv(paths["csv"], index=False)
    plot_common_bias(frame, summary).savefig(paths["png"], facecolor="white")
    paths["json"].write_text(json.dumps(summary, indent=2) + "\n")
    for stage, s in summary["stages"].items():
        log.info("%s: N* = %s%s", stage, s["n_star"],
                 f" ({s['n_star_reason']})" if s["n_star"] is None else "")
    log.info("wrote %s", ", ".join(str(p) for p in paths.values()))
    return CommonBiasRun(frame=frame, summary=summary, output_dir=output_dir, **paths)


def _command_line() -> str | None:
    """The command that started this Hydra run (overrides as typed), or None outside Hydra."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get().overrides
    typed = [o for o in hc.hydra  # e.g. hydra.run.dir=...; not those the command adds itself
             if not o.startswith(("hydra.mode=", "hydra.job.name="))]
    return " ".join(["repgeom-common-bias", *hc.task, *typed])
