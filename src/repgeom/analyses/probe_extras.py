"""The analyses a ``probe.py`` run can ask for, dispatched from the entry point.

The probe pipeline (`repgeom.probes.run.runner`) sits below the analyses and never imports them; it
takes *extras*, functions ``(cfg, output_dir, device) -> list of figure paths`` run after its
own figures (so W&B logs theirs too). `probe` is ``probe.py``'s function: the pipeline with:

- ``qk_projection=true`` (``run=`` only): the queries and keys of every checkpoint in one SVD
  projection per head (Godey et al. 2024 Figs. 11-12; `repgeom.analyses.qk_projection`), into
  ``qk_projection/``;
- ``labels.csv=...`` (``ckpt=`` or ``hf=``): activation distributions fitted per label group
  ("Beyond Gaussian"; `repgeom.analyses.distributions`), into ``distributions/``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig

from repgeom.probes.core.measure import ProbeSettings
from repgeom.probes.report import console
from repgeom.probes.run.runner import ProbeRunResult
from repgeom.probes.run.runner import probe as run_probes


def qk_projection_figures(cfg: DictConfig, output_dir: Path, device: torch.device) -> list[Path]:
    """``qk_projection=true``: `repgeom.analyses.qk_projection` on the run's checkpoints."""
    if not cfg.get("qk_projection"):
        return []
    from repgeom.analyses import qk_projection

    return qk_projection.write(cfg.run, output_dir / "qk_projection",
                               windows=cfg.get("attention_windows"), device=device)[1]


def label_group_fits(cfg: DictConfig, output_dir: Path, device: torch.device) -> list[Path]:
    """``labels.csv=``: `repgeom.analyses.distributions` on the model of ``ckpt=``/``hf=``, one
    fit per group of ``labels.csv`` (the post fits each subject:attribute pair)."""
    if not (cfg.get("labels") or {}).get("csv"):
        return []
    from repgeom.analyses import distributions
    from repgeom.analyses.subjects import load_subject

    subject = load_subject(hf=cfg.get("hf"), ckpt=cfg.get("ckpt"), tokenizer=cfg.get("tokenizer"))
    samples = (cfg.get("settings") or {}).get("distribution_samples")
    tables = distributions.run(
        subject, pd.read_csv(Path(str(cfg.labels.csv)).expanduser()),
        output_dir / "distributions",
        group_by=[str(c) for c in cfg.labels.get("group_by") or []],
        n_samples=samples or ProbeSettings.distribution_samples,
        seed=0 if cfg.get("seed") is None else int(cfg.seed),
    )
    console.print_family_shares(tables["shares"])
    return []


EXTRAS = (qk_projection_figures, label_group_fits)


def probe(cfg: DictConfig) -> ProbeRunResult:
    """``probe.py``: the probe pipeline, then the analyses `cfg` asks for (`EXTRAS`)."""
    return run_probes(cfg, extras=EXTRAS)
