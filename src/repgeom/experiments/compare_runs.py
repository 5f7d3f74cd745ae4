"""Compare the layer profiles of several runs side by side, in one figure.

The one command to lay a causal and a bidirectional run beside each other::

    repgeom-compare-runs outputs/causal outputs/bidirectional \\
        --metric anisotropy --labels causal bidirectional --out compare.png

Each RUN is a run folder (its table is ``<run>/probes/probes.parquet`` or ``.csv``), a ``probes``
folder, or a table file. Every panel shows one run's layer profile at its last probe step (or at
``--step``), on a shared y axis.

Several runs per label (seeds) are drawn as one panel: the mean profile over those runs and its
95% t-interval, shaded (`repgeom.experiments.seeds`). Repeat a label, or let each run's saved Hydra
config name its group::

    repgeom-compare-runs sweep/causal-seed{0,1,2} \\
        sweep/bidirectional-seed{0,1,2} \\
        --labels causal causal causal bidirectional bidirectional bidirectional
    repgeom-compare-runs sweep/*-seed* --group-by masking

The runs of one label must have been probed at the same steps.

Representation similarity of two runs, layer by layer (linear CKA or mutual k-NN of the same
layer of run A and run B on the same windows, `repgeom.probes.core.pairwise.similarity`), from the
states
each
probe saved (the training probe with a pairwise metric, ``probe.metrics=[all]``, or probe.py,
whose default computes them)::

    repgeom-compare-runs outputs/causal outputs/bidirectional \
        --similarity linear_cka --labels causal bidirectional --out causal_vs_bidi.png

writes the figure and the rows (``layer``, ``run_b``, ``value``, ``std``: mean and std over the
probe's batches) as ``causal_vs_bidi.csv``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml

from repgeom.experiments.figures import profile_bands, profiles_side_by_side
from repgeom.probes.core import catalogue
from repgeom.probes.core.measure import ProbeSettings
from repgeom.probes.core.pairwise import similarity
from repgeom.probes.core.table import PROBE_DIR, read_table, rows_to_frame
from repgeom.probes.report.plots import DPI, layer_profile


def _run_folder(run: str) -> Path:
    path = Path(run).resolve()
    if path.is_file():  # <run>/probes/probes.csv -> <run>/probes
        path = path.parent
    if path.name == PROBE_DIR:  # <run>/probes -> <run>
        path = path.parent
    return path


def _labels(runs: Sequence[str]) -> list[str]:
    """Default labels: each run folder's name, or its last two parts where names repeat."""
    paths = [_run_folder(run) for run in runs]
    names = [p.name for p in paths]
    if len(set(names)) < len(names):
        names = [f"{p.parent.name}/{p.name}" for p in paths]
    return names


def config_labels(runs: Sequence[str], key: str) -> list[str]:
    """One label per run: the value of `key` (e.g. ``masking`` -> ``masking.name``, or a dotted
    path such as ``model.name``) in the run's ``.hydra/config.yaml``.

    Raises
    ------
    FileNotFoundError
        When a run has no saved config.
    ValueError
        When a config lacks `key`.
    """
    path_of = {"masking": "masking.name"}.get(key, key)
    labels = []
    for run in runs:
        config_file = _run_folder(run) / ".hydra" / "config.yaml"
        if not config_file.is_file():
            raise FileNotFoundError(f"--group-by {key}: {run} has no {config_file}")
        value = yaml.safe_load(config_file.read_text())
        for part in path_of.split("."):
            if not isinstance(value, dict) or part not in value:
                raise ValueError(f"--group-by {key}: {config_file} has no {path_of!r}")
            value = value[part]
        labels.append(str(value))
    return labels


def run_similarity(runs: Sequence[str], labels: Sequence[str], metric: str, *,
                   step: int | str = "last",
                   batch_size: int = ProbeSettings.state_batch_size,
                   seed: int = ProbeSettings.seed):
    """Rows of `metric` between the same layer of two runs (`similarity.run_vs_run_rows`)."""
    folders = [_run_folder(run) / PROBE_DIR for run in runs]
    rows = similarity.run_vs_run_rows(
        *folders, [catalogue.BUILTIN[metric]], run_b=labels[1],
        step=None if step == "last" else int(step), batch_size=batch_size, seed=seed,
    )
    return rows_to_frame([{**row, "run": labels[0]} for row in rows])


def _step(step: int | str) -> int | str:
    if step == "last":
        return step
    try:
        return int(step)
    except ValueError:
        raise ValueError(f"step: expected an integer or 'last', got {step!r}") from None


def compare(runs: Sequence[str | Path], out: str | Path = "compare.png", *,
            metric: str = "anisotropy", labels: Sequence[str] | None = None,
            group_by: str | None = None, step: int | str = "last", dpi: int = DPI,
            similarity: str | None = None,
            batch_size: int = ProbeSettings.state_batch_size,
            seed: int = ProbeSettings.seed) -> Path:
    """Read each run's table, draw the figure, write it to `out`; return the path.

    One run per label: `profiles_side_by_side`. Several runs under a label: `profile_bands`,
    one panel per label with the mean over its runs and the 95% interval. `labels` defaults to
    the run folders' names, or each run's `group_by` key of its ``.hydra/config.yaml``.
    `similarity` (a pair metric of `catalogue.PAIR_NAMES`): instead of profiles, that similarity
    of the same layer of exactly two runs, from their saved probe states (a PNG and a CSV).

    Raises
    ------
    FileNotFoundError
        When a run has no probe table (naming where it looked).
    ValueError
        When a run lacks the metric (naming it and listing the metrics present) or the step, or
        the options disagree (labels and runs in number, labels with group_by, similarity with
        other than two runs).
    """
    runs = [str(r) for r in runs]
    out = Path(out)
    step = _step(step)
    if labels is not None and len(labels) != len(runs):
        raise ValueError(f"labels: got {len(labels)} labels for {len(runs)} runs")
    if labels is not None and group_by is not None:
        raise ValueError("labels and group_by: pass one of them")
    if similarity is not None and similarity not in catalogue.PAIR_NAMES:
        raise ValueError(f"similarity: {similarity!r} is not one of {list(catalogue.PAIR_NAMES)}")
    if similarity is not None and len(runs) != 2:
        raise ValueError(f"similarity compares exactly two runs, got {len(runs)}")
    if group_by is not None:
        labels = config_labels(runs, group_by)
    else:
        labels = list(labels) if labels else _labels(runs)
    if similarity is not None:
        frame = run_similarity(runs, labels, similarity, step=step, batch_size=batch_size,
                               seed=seed)
        out.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(out.with_suffix(".csv"), index=False)
        fig = layer_profile(frame, similarity)
        fig.suptitle(f"{labels[0]} vs {labels[1]}")
        fig.savefig(out, dpi=dpi, facecolor="white", bbox_inches="tight")
        print(f"wrote {out} and {out.with_suffix('.csv')}")
        return out
    groups: dict[str, list] = {}
    for label, run in zip(labels, runs, strict=True):
        groups.setdefault(label, []).append(read_table(run))
    if all(len(tables) == 1 for tables in groups.values()):
        frames = {label: tables[0] for label, tables in groups.items()}
        fig = profiles_side_by_side(frames, metric, step=step)
    else:
        fig = profile_bands(groups, metric, step=step)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi, facecolor="white", bbox_inches="tight")
    print(f"wrote {out}")
    return out
