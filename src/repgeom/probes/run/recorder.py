"""`ProbeRecorder`: where a training probe's steps go, in the training process or beside it.

The in-process callback (`repgeom.probes.run.callback.ProbeCallback`) and the worker that follows a
run's snapshots (`repgeom.probes.run.offload.follow`) record each probed step the same way, into the
same files of the run folder: the table (``probes/probes.{parquet,csv}``, `sink.write_step`),
the W&B scalars on the ``probe/step`` axis, the phases of every layer and their alerts
(`phase_report.PhaseWatch`), the figures every few probes, and with pairwise metrics each step's
states (compared with the final step's at the end, `finish`). Neither knows about Lightning
here."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd

from repgeom.probes.core import catalogue, table
from repgeom.probes.core.measure import ProbeOutput
from repgeom.probes.core.pairwise import similarity
from repgeom.probes.core.prediction import tokens
from repgeom.probes.core.spec import ProbeSpec
from repgeom.probes.report import aggregate, phase_report, sink, wandb_charts


class ProbeRecorder:
    """Record probed steps of one training run into `run_dir` and `runs` (W&B runs).

    Parameters
    ----------
    run_dir : Path
        The training run's folder (``<run_dir>/probes/`` holds the table and figures).
    spec : ProbeSpec
        What fixes the numbers (its metrics say whether states are kept for pairwise ones).
    plot_every_n_probes : int
        Redraw the figures every this many probes (and always at the end); 0 only at the end.
    plot_metrics : list of str or None
        The metrics to draw; None draws every metric.
    n_probes : int, optional
        The schedule's length: the phases' false-turn rate is controlled over the whole
        trajectory (`repgeom.probes.report.turn_test`), so a turn seen online is one the finished
        run shows too.
    """

    def __init__(self, run_dir: Path, spec: ProbeSpec, *, plot_every_n_probes: int,
                 plot_metrics: list[str] | None, n_probes: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.settings = spec.probe_settings()
        self.texts = spec.texts  # the table's texts column (`sink.write_step`)
        self.pairs = catalogue.select(self.settings).pairs
        self.plot_every_n_probes = plot_every_n_probes
        self.plot_metrics = plot_metrics
        self.phase_watch = phase_report.PhaseWatch(  # phases per probe, one alert per turn
            n_probes, metrics=phase_report.phase_metrics(self.settings))

    def record(self, step: int, output: ProbeOutput, runs: list, *, n_done: int,
               seconds: float) -> pd.DataFrame:
        """Write one probed step (its rows, states, W&B scalars, phases, maybe figures); return
        the whole table. `n_done` counts the probes so far (this one included), `seconds` the
        probe time so far (``probe/seconds_total``)."""
        if self.pairs:  # kept for the comparison with the final step (`finish`)
            similarity.save_states(
                table.probe_dir(self.run_dir), step, output.states, output.layer_names
            )
        if output.token_states is not None:  # settings.per_token: before the table says done
            tokens.save_step(table.probe_dir(self.run_dir), step, output.token_states)
        rows = [{"step": step, **row} for row in output.rows]
        frame = sink.write_step(self.run_dir, rows, texts=output.texts)
        sink.log_scalars(runs, step, table.rows_to_frame(rows), {"probe/seconds_total": seconds})
        self.phase_watch.update(runs, frame, step)
        if self.plot_every_n_probes and n_done % self.plot_every_n_probes == 0:
            self.plot(runs, frame, step)
        return frame

    def plot(self, runs: list, frame: pd.DataFrame, step: int) -> list[Path]:
        return sink.figures(runs, frame, self.run_dir, step, metrics=self.plot_metrics)

    def finish(self, runs: list, *, n_done: int, seconds: float, where: str = "") -> float:
        """The end of the run: each step against the final one (pairwise metrics), the figures,
        the summary (console and W&B) and the phases (``probes/phases.csv``). Returns its own
        seconds (counted in the total printed: the run waits for it too)."""
        start = time.perf_counter()
        if self.pairs:
            self._vs_final(runs)
        frame = table.read_table(self.run_dir)
        self.plot(runs, frame, int(frame["step"].max()))
        end = time.perf_counter() - start
        seconds += end
        result = aggregate.summary(frame)
        text = aggregate.format_summary(result)
        print(f"Probe summary ({n_done} probes{where}, {seconds:.1f} s in total, "
              f"{end:.1f} s of it the end-of-run figures):\n{text}")
        for run in runs:
            run.summary.update(
                {f"probe_summary/{k}": v for k, v in result.items() if v is not None}
            )
            run.summary["probe_summary/seconds_total"] = seconds
            run.summary.update(wandb_charts.summary(aggregate.single_set(frame)))
        phase_report.report(frame, self.run_dir, runs)
        return end

    def _vs_final(self, runs: list) -> None:
        """Each probe step's layers against the final step's (`similarity.vs_final_rows`)."""
        rows = similarity.vs_final_rows(
            table.probe_dir(self.run_dir),
            self.pairs,
            batch_size=self.settings.state_batch_size,
            seed=self.settings.seed,
            permutations=self.settings.null_permutations,
        )
        if not rows:
            return
        sink.write_step(self.run_dir, rows, texts=self.texts)
        frame = table.rows_to_frame(rows)
        for step, part in frame.groupby("step"):
            sink.log_scalars(runs, int(step), part, {})

    def state_dict(self) -> list[list]:
        return self.phase_watch.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.phase_watch.load_state_dict(state)
