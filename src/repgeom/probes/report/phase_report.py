"""Where the phases of a trajectory (`repgeom.probes.report.phases`) go: the console, ``phases.csv``
beside ``probes.csv``, the W&B run summary, and, while training, the current phase per layer at
each probe and a W&B alert when the layer-mean dimension turns from expansion to compression.

W&B keys:

==============================================================  ===============================
``probe/phase/<metric>/layer_<ii>``, ``probe/phase/<metric>/mean``  at each probe (training): +1
                                                                expanding, −1 compressing, 0
                                                                undecided (`phases.phase_by_step`)
``probe_summary/phases/<metric>/<layer_<ii>|mean>/peak_step``   step of the largest value, and
``.../peak_value``, ``.../expansion_to_compression``,           that value; the steps of every
``.../compression_to_expansion``                                turn (a list)
==============================================================  ===============================
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from repgeom.probes.core import catalogue, table
from repgeom.probes.report import phases, turn_test

PHASES_FILE = "phases.csv"
"""Beside ``probes.csv``: `phases.find_phases` of the table."""
_ARROW = {phases.TO_COMPRESSION: "expansion -> compression",
          phases.TO_EXPANSION: "compression -> expansion"}


def _layer_key(layer: int) -> str:
    return phases.MEAN_NAME if layer == phases.MEAN_LAYER else f"layer_{int(layer):02d}"


def _ids(events: pd.DataFrame) -> list[str]:
    return [c for c in phases.GROUP_COLUMNS if c in events.columns]


def format_phases(events: pd.DataFrame) -> str:
    """The events as a few lines: per trajectory and metric, the layer mean, then each layer."""
    if events.empty:
        return "phases: no intrinsic dimension over several steps in the table"
    ids = _ids(events)
    n_curves = len(events[[*ids, "metric", "layer"]].drop_duplicates())
    lines = [f"phases: {n_curves} curves, each with at most "
             f"{turn_test.FALSE_TURN_RATE:.0%} false turns over its trajectory (no correction "
             "across curves; with one seed, turns of this run's curves)"]
    for key, group in events.groupby([*ids, "metric"], sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        title = ", ".join(str(k) for k in key[:-1])
        lines.append(f"phases of {catalogue.label(key[-1])}{f' ({title})' if title else ''}:")
        for (layer, name), rows in group.groupby(["layer", "layer_name"], sort=True):
            peak = rows.loc[rows["event"] == phases.PEAK].iloc[0]
            where = "mean over blocks 1..L" if layer == phases.MEAN_LAYER else f"{name}"
            turns = [f"{_ARROW[r.event]} at step {r.step} (seen at {r.confirmed_step})"
                     for r in rows.itertuples() if r.event != phases.PEAK]
            lines.append(f"  {where}: peak {peak['value']:.3g} at step {peak['step']}; "
                         + ("; ".join(turns) if turns else "no turn beyond the noise"))
    return "\n".join(lines)


def wandb_summary(events: pd.DataFrame) -> dict[str, Any]:
    """``probe_summary/phases/...`` (see the module doc); several trajectories (``model``) add
    its name after ``phases/``."""
    out: dict[str, Any] = {}
    ids = _ids(events)
    several = bool(ids) and len(events[ids].drop_duplicates()) > 1
    for key, rows in events.groupby([*ids, "metric", "layer"], sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        metric, layer = key[-2], key[-1]
        who = "/".join(str(k) for k in key[:-2]) + "/" if several else ""
        base = f"probe_summary/phases/{who}{metric}/{_layer_key(layer)}"
        peak = rows.loc[rows["event"] == phases.PEAK].iloc[0]
        out[f"{base}/peak_step"] = int(peak["step"])
        out[f"{base}/peak_value"] = float(peak["value"])
        for event in (phases.TO_COMPRESSION, phases.TO_EXPANSION):
            steps = [int(s) for s in rows.loc[rows["event"] == event, "step"]]
            if steps:
                out[f"{base}/{event}"] = steps
    return out


def report(frame: pd.DataFrame, run_dir: str | os.PathLike, runs: Iterable = ()) -> pd.DataFrame:
    """Find the phases of `frame`, write ``<run_dir>/probes/phases.csv``, print them and put
    them in the summary of every W&B run; return the events (`phases.find_phases`)."""
    events = phases.find_phases(frame)
    if frame["step"].nunique() < 2:  # one checkpoint or model: no trajectory, nothing to say
        return events
    folder = table.probe_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    events.to_csv(folder / PHASES_FILE, index=False)
    print(format_phases(events))
    summary = wandb_summary(events)
    for run in runs:
        run.summary.update(summary)
    return events


def read_phases(run_dir: str | os.PathLike) -> pd.DataFrame:
    """``<run_dir>/probes/phases.csv`` as written by `report`."""
    events = pd.read_csv(Path(table.probe_dir(run_dir)) / PHASES_FILE)
    events["confirmed_step"] = events["confirmed_step"].astype("Int64")
    return events


class PhaseWatch:
    """The training probe's view of the phases: at each probe, the current phase of every layer
    to W&B, and one alert per turn of the layer mean from expansion to compression.

    The logged phases are each curve's own, at `turn_test.FALSE_TURN_RATE` per curve. The alerts
    are one family per run: the layer means of the ``n`` metrics followed, each tested at
    ``FALSE_TURN_RATE / n`` (Bonferroni), so a run whose layer means never fall is alerted in at
    most 5% of runs, over the whole schedule. A turn alerted is one of *this run's* curve beyond
    the probe's noise (the alert says so): a seed's own training wiggle is part of its curve, so
    whether other seeds turn too is the cross-run report's question.

    A turn is keyed by (metric, step of its peak); the keys already alerted are kept in the
    callback's checkpoint (`state_dict`), so a resumed run does not alert them again. The phase
    found at a probe uses only the steps up to it, so later probes do not move an alerted turn.
    """

    def __init__(self, n_probes: int | None = None,
                 metrics: Iterable[str] | None = None) -> None:
        self.alerted: set[tuple[str, int]] = set()
        self.n_probes = n_probes
        """The schedule's length (`phases.find_phases`'s ``n_steps``): the false-turn rate is
        controlled over the whole run, not over the probes so far."""
        self.metrics = (None if metrics is None
                        else tuple(m for m in phases.PHASE_METRICS if m in set(metrics)))
        """The phase metrics the probe is configured to write (`phase_metrics`): the alerts'
        family, fixed from the first probe. None: the layer means found in the table so far
        (a family that is smaller while a metric has no layer mean yet)."""

    def state_dict(self) -> list[list]:
        return [[m, s] for m, s in sorted(self.alerted)]

    def load_state_dict(self, state: Iterable) -> None:
        self.alerted = {(str(m), int(s)) for m, s in state}

    def update(self, runs: list, frame: pd.DataFrame, step: int) -> dict[str, int]:
        """Log ``probe/phase/...`` at `step` to `runs` and send the alerts due; return the
        logged phases (empty with fewer than two steps or no W&B run)."""
        if not runs or frame["step"].nunique() < 2:
            return {}
        n = self.n_probes
        if step == frame["step"].max():  # the usual case: one pass gives both
            every, events = phases.phases_and_events(frame, n_steps=n)
            now = every.loc[every["step"] == step]
        else:
            now = phase_by_step_at(frame, step, n_steps=n)
            events = phases.find_phases(frame, n_steps=n)
        scalars = {f"probe/phase/{r.metric}/{_layer_key(r.layer)}": int(r.phase)
                   for r in now.itertuples()}
        for run in runs:
            run.log({**scalars, "probe/step": step})
        family = (len(self.metrics) if self.metrics is not None
                  else int(((events["layer"] == phases.MEAN_LAYER)
                            & (events["event"] == phases.PEAK)).sum()))  # layer means followed
        if family > 1:
            events = phases.find_phases(frame, n_steps=n, mean_only=True,
                                        rate=turn_test.FALSE_TURN_RATE / family)
        turns = events.loc[(events["layer"] == phases.MEAN_LAYER)
                           & (events["event"] == phases.TO_COMPRESSION)]
        for turn in turns.itertuples():
            key = (str(turn.metric), int(turn.step))
            if key in self.alerted:
                continue
            self.alerted.add(key)
            last = now.loc[(now["metric"] == turn.metric) & (now["layer"] == phases.MEAN_LAYER)]
            for run in runs:
                run.alert(
                    title=alert_title(turn.metric),
                    text=(f"The mean over blocks 1..L of {turn.metric} peaked at step {turn.step} "
                          f"({turn.value:.4g}) and has fallen beyond the noise since (seen at "
                          f"step {turn.confirmed_step}; {float(last['value'].iloc[0]):.4g} at "
                          f"step {step}): expansion has turned to compression. "
                          + alert_caveat(family)),
                    level="INFO",
                )
        return scalars


def phase_metrics(settings) -> tuple[str, ...]:
    """The phase metrics (`phases.PHASE_METRICS`) that the probe `settings` compute: the
    `PhaseWatch` alerts' family, known before any of them has a layer mean."""
    chosen = catalogue.select(settings)
    entries = [*chosen.states, *chosen.qk, *chosen.pairs,
               *([chosen.attention] if chosen.attention is not None else [])]
    written = {o.member or o.pattern for e in entries for o in e.outputs}
    return tuple(m for m in phases.PHASE_METRICS if m in written)


def alert_caveat(family: int) -> str:
    """What an alert's turn claims (the `PhaseWatch` doc): its false-alert rate over the run,
    and that it is one run's curve."""
    rate = turn_test.FALSE_TURN_RATE
    tested = (f"each of this run's {family} layer-mean curves tested at {rate / family:.2%}"
              if family > 1 else "its one layer-mean curve tested")
    return (f"False alerts: in at most {rate:.0%} of runs whose layer means never fall "
            f"({tested}, over the whole schedule). "
            "This is a turn of this run's curve beyond the probe's noise, conditional on this "
            "run: a seed's own training wiggle is part of it; whether other seeds turn too is "
            "the cross-run report's question.")


def alert_title(metric: str) -> str:
    """The W&B alert's title (under 64 characters, as W&B asks)."""
    return f"{catalogue.label(metric)}: compression began"[:63]


def phase_by_step_at(frame: pd.DataFrame, step: int, *,
                     n_steps: int | None = None) -> pd.DataFrame:
    """`phases.phase_by_step` at `step` only: the phase of every layer and of the mean."""
    every = phases.phase_by_step(frame.loc[frame["step"] <= step], n_steps=n_steps)
    return every.loc[every["step"] == step]
