"""The analyses a ``probe.py`` run can ask for, dispatched from the entry point.

The probe pipeline (`repgeom.probes.run.runner`) sits below the analyses and never imports them; it
takes *extras*, functions ``(job) -> list of figure paths`` (`repgeom.probes.run.job.ProbeJob`,
the command's options read and checked once) run after its own figures (so W&B logs theirs
too). `probe` is ``probe.py``'s function: the pipeline with:

- ``qk_projection=true`` (``run=`` only): the queries and keys of every checkpoint in one SVD
  projection per head (Godey et al. 2024 Figs. 11-12; `repgeom.analyses.qk_projection`), into
  ``qk_projection/``;
- ``labels.csv=...`` (``ckpt=`` or ``hf=``): activation distributions fitted per label group
  ("Beyond Gaussian"; `repgeom.analyses.distributions`), into ``distributions/``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from repgeom.probes.core.measure import ProbeSettings
from repgeom.probes.report import console
from repgeom.probes.run.job import FOLLOW, ProbeJob
from repgeom.probes.run.runner import ProbeRunResult, follow_job
from repgeom.probes.run.runner import probe as run_probes


def qk_projection_figures(job: ProbeJob) -> list[Path]:
    """``qk_projection=true``: `repgeom.analyses.qk_projection` on the run's checkpoints."""
    if not job.qk_projection:
        return []
    from repgeom.analyses import qk_projection

    return qk_projection.write(job.run, job.output_dir / "qk_projection",
                               windows=job.request.attention_windows, device=job.device)[1]


def label_group_fits(job: ProbeJob) -> list[Path]:
    """``labels.csv=``: `repgeom.analyses.distributions` on the model of ``ckpt=``/``hf=``, one
    fit per group of ``labels.csv`` (the post fits each subject:attribute pair)."""
    if job.labels.csv is None:
        return []
    from repgeom.analyses import distributions
    from repgeom.analyses.subjects import load_subject

    subject = load_subject(hf=job.hf, ckpt=job.ckpt, tokenizer=job.tokenizer)
    samples = job.request.settings.get("distribution_samples")
    tables = distributions.run(
        subject, pd.read_csv(job.labels.csv), job.output_dir / "distributions",
        group_by=list(job.labels.group_by),
        n_samples=samples or ProbeSettings.distribution_samples,
        seed=0 if job.request.seed is None else int(job.request.seed),
    )
    console.print_family_shares(tables["shares"])
    return []


EXTRAS = (qk_projection_figures, label_group_fits)


def probe(job: ProbeJob) -> ProbeRunResult:
    """``probe.py``: the probe pipeline, then the analyses `job` asks for (`EXTRAS`); or, for
    ``follow=``, the probe worker of an offloaded training run (`follow_job`)."""
    if job.mode == FOLLOW:
        return follow_job(job)
    return run_probes(job, extras=EXTRAS)
