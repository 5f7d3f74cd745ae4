"""Phases of a trajectory: known answers on synthetic curves, the noise rule, several seeds, and
the training probe's per-probe phases and its one W&B alert per turn."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import wandb
from wandb_records import wandb_history, wandb_records

from repgeom.probes.core import table
from repgeom.probes.core.measure import ProbeSettings
from repgeom.probes.report import phase_report, plots, turn_test
from repgeom.probes.report.phases import (
    COMPRESSING,
    EXPANDING,
    MEAN_LAYER,
    PEAK,
    TO_COMPRESSION,
    TO_EXPANSION,
    find_phases,
    phase_by_step,
    phases_and_events,
)
from repgeom.probes.report.plots import phase_markers

STEPS = [0, 10, 20, 40, 80, 160, 320]


def trajectory(curve, *, std=0.1, n_batches=16, blocks=2, final_norm=None, metric="twonn",
               **extra):
    """A probe table: every block follows `curve` (block i shifted by i, so the mean is
    ``curve + (blocks + 1) / 2``), the embedding is flat, and an optional final-norm layer.
    Each value is the mean of `n_batches` batches with population std `std`: a standard error
    of ``std / √(n_batches − 1)`` on ``n_batches − 1`` degrees of freedom (`turn_test`)."""
    rows = []
    extra = {**extra, "n_batches": n_batches}
    for step, value in zip(STEPS, curve, strict=True):
        rows.append(dict(step=step, layer=0, metric=metric, value=1.0, std=std, **extra))
        for layer in range(1, blocks + 1):
            rows.append(dict(step=step, layer=layer, metric=metric, value=value + layer, std=std,
                             **extra))
        if final_norm is not None:
            rows.append(dict(step=step, layer=blocks + 1, layer_name="final_norm", metric=metric,
                             value=final_norm[STEPS.index(step)], std=std, **extra))
    return table.rows_to_frame(rows)


def mean_rows(events: pd.DataFrame) -> pd.DataFrame:
    return events.loc[events["layer"] == MEAN_LAYER]


def test_rise_then_fall_has_its_peak_and_one_turn() -> None:
    curve = [2.0, 4.0, 7.0, 9.0, 6.0, 4.0, 3.0]
    # A final norm that peaks elsewhere must not move the mean's peak: it is not a block.
    events = find_phases(trajectory(curve, final_norm=[0, 0, 0, 0, 0, 0, 100.0]))
    mean = mean_rows(events)
    assert mean[["event", "step"]].values.tolist() == [[PEAK, 40], [TO_COMPRESSION, 40]]
    # The fall from 9 to 6 (3 > the noise, √2 · 0.1) is seen at the next probe.
    assert mean["confirmed_step"].tolist()[1] == 80
    assert mean["value"].tolist()[0] == pytest.approx(9.0 + 1.5)  # blocks 1, 2: +1.5 on average
    for layer in (1, 2):  # each block turns at the same step
        rows = events.loc[events["layer"] == layer]
        assert rows.loc[rows["event"] == TO_COMPRESSION, "step"].tolist() == [40]
    # The final norm is a layer of its own, with its own peak and no turn (it never falls).
    norm = events.loc[events["layer_name"] == "final_norm"]
    assert norm["event"].tolist() == [PEAK] and norm["step"].tolist() == [320]
    by_step = phase_by_step(trajectory(curve))
    online = by_step.loc[by_step["layer"] == MEAN_LAYER, "phase"].tolist()
    # Undecided at the first probe, expanding as soon as 4 − 2 beats the noise, still expanding
    # at the peak (the fall is not seen yet), compressing from the next probe on.
    assert online == [0, EXPANDING, EXPANDING, EXPANDING, COMPRESSING, COMPRESSING, COMPRESSING]


def test_a_change_counts_beyond_the_trajectory_wide_threshold() -> None:
    # std 0.3 over 16 batches: se = 0.3 / √15 on 15 degrees of freedom; a change beats the noise
    # when above c(7 steps, 15) · √2 · se, c the 95% point of the largest standardised fall
    # along a flat curve of 7 points (turn_test.critical).
    se = 0.3 / np.sqrt(15)
    bar = turn_test.critical(len(STEPS), 15) * np.sqrt(2) * se
    assert 2.5 < bar / (np.sqrt(2) * se) < 3.5  # between the one-step and Bonferroni points
    below = find_phases(trajectory([0.0, 0.97 * bar, 0.0, 0, 0, 0, 0], std=0.3),
                        metrics=["twonn"])
    assert set(below["event"]) == {PEAK}
    above = find_phases(trajectory([0.0, 1.03 * bar, 0.0, 1.03 * bar, 0.0, 1.03 * bar, 0.0],
                                   std=0.3))
    assert mean_rows(above)["event"].tolist() == [PEAK, TO_COMPRESSION, TO_EXPANSION,
                                                  TO_COMPRESSION, TO_EXPANSION, TO_COMPRESSION]
    # The same changes in today's 2-batch tables (one degree of freedom): c is about 17 at 7
    # steps, and nothing is decided.
    two = find_phases(trajectory([0.0, 1.03 * bar, 0.0, 1.03 * bar, 0.0, 1.03 * bar, 0.0],
                                 std=0.3, n_batches=2))
    assert set(two["event"]) == {PEAK}
    assert turn_test.critical(len(STEPS), 1) > 10
    # The layer mean's standard error is the root mean square of the blocks' (an upper bound
    # whatever their correlation): blocks at std 0.3 and 0.4 give √((0.3² + 0.4²) / 2) / √15.
    mean_se = np.sqrt((0.3**2 + 0.4**2) / 2) / np.sqrt(15)
    mean_bar = turn_test.critical(len(STEPS), 15) * np.sqrt(2) * mean_se
    for step_size, turns in ((0.97 * mean_bar, 0), (1.03 * mean_bar, 1)):
        frame = trajectory([0.0, step_size, 0.0, 0.0, 0.0, 0.0, 0.0], std=0.3)
        frame.loc[frame["layer"] == 2, "std"] = 0.4
        frame.loc[frame["layer"] == 2, "value"] = frame.loc[frame["layer"] == 1, "value"].to_numpy()
        mean = mean_rows(find_phases(frame))
        assert (mean["event"] == TO_COMPRESSION).sum() == turns, step_size


def test_the_whole_trajectory_sets_the_threshold_online() -> None:
    """The training probe passes its schedule's length (`n_steps`): a fall that would count in
    a 7-step table does not at a 100-step schedule's threshold, so no turn is called online
    that the finished run could not confirm."""
    se = 0.1 / np.sqrt(15)
    fall = 1.1 * turn_test.critical(len(STEPS), 15) * np.sqrt(2) * se
    assert fall < turn_test.critical(100, 15) * np.sqrt(2) * se
    frame = trajectory([0.0, 1.0, 2.0, 3.0, 3.0 - fall, 3.0 - fall, 3.0 - fall])
    assert TO_COMPRESSION in set(find_phases(frame)["event"])
    assert TO_COMPRESSION not in set(find_phases(frame, n_steps=100)["event"])


def test_noise_monotone_and_no_std() -> None:
    rng = np.random.default_rng(0)
    wiggle = (5.0 + rng.uniform(-0.05, 0.05, len(STEPS))).tolist()
    for curve in (wiggle, [1.0, 2, 3, 4, 5, 6, 7], [7.0, 6, 5, 4, 3, 2, 1]):
        events = find_phases(trajectory(curve))
        assert set(events["event"]) == {PEAK}, curve
    rising = phase_by_step(trajectory([1.0, 2, 3, 4, 5, 6, 7]))
    assert rising.loc[rising["layer"] == MEAN_LAYER, "phase"].tolist()[1:] == [EXPANDING] * 6
    flat = phase_by_step(trajectory(wiggle))
    assert (flat["phase"] == 0).all()
    # No batch std and one seed: nothing tells a turn from noise (as in the report).
    events = find_phases(trajectory([2.0, 4.0, 7.0, 9.0, 6.0, 4.0, 3.0], std=np.nan))
    assert set(events["event"]) == {PEAK}


def test_fall_then_rise_and_several_models() -> None:
    a = trajectory([9.0, 5.0, 2.0, 4.0, 8.0, 9.0, 9.5], model="a")
    b = trajectory([2.0, 4.0, 7.0, 9.0, 6.0, 4.0, 3.0], model="b")
    events = find_phases(pd.concat([a, b]))
    turns = mean_rows(events).query("event != 'peak'")
    assert turns[["model", "event", "step"]].values.tolist() == [
        ["a", TO_EXPANSION, 20], ["b", TO_COMPRESSION, 40]]


def test_several_seeds_use_the_interval_over_seeds() -> None:
    base = np.array([2.0, 4.0, 7.0, 9.0, 6.0, 4.0, 3.0])
    agree = [trajectory((base + shift).tolist(), std=0.1) for shift in (0.0, 0.2, -0.1)]
    events = find_phases(agree)
    mean = mean_rows(events)
    assert mean["n_seeds"].unique().tolist() == [3]
    assert mean.loc[mean["event"] == TO_COMPRESSION, "step"].tolist() == [40]
    # Seeds that disagree: the mean curve rises and falls by 1, but the seeds move by ±3 around
    # it, so the 95% interval over three seeds covers 0 and no turn is decided.
    up, down = np.array([0, 3, 6, 9, 6, 3, 0.0]), np.array([0, -3, -6, -9, -6, -3, 0.0])
    bump = np.array([0, 0.3, 0.6, 1, 0.6, 0.3, 0])
    disagree = [trajectory((bump + 3 * part).tolist(), std=0.01)
                for part in (up / 3, down / 3, np.zeros(7))]
    assert set(find_phases(disagree)["event"]) == {PEAK}
    with pytest.raises(ValueError, match="different steps"):
        find_phases([trajectory(base.tolist()), trajectory(base.tolist()).query("step != 80")])


def test_turns_are_marked_on_the_metric_vs_step_figure() -> None:
    frame = trajectory([2.0, 4.0, 7.0, 9.0, 6.0, 4.0, 3.0])
    fig = plots.metric_vs_step(frame, "twonn")
    marked = [line for line in fig.axes[0].get_lines() if line.get_gid() == TO_COMPRESSION]
    assert len(marked) == 1
    assert marked[0].get_xdata().tolist() == [40] and marked[0].get_ydata().tolist() == [10.5]
    assert phase_markers.mark_turns(fig.axes[0], frame.assign(metric="anisotropy"),
                                    "anisotropy", "k") == 0  # not a dimension: no phases


def test_phases_and_events_in_one_pass() -> None:
    frame = pd.concat([trajectory([2.0, 4.0, 7.0, 9.0, 6.0, 4.0, 3.0], final_norm=[5.0] * 7),
                       trajectory([1.0, 2.0, 3.0, 3.5, 3.6, 3.7, 3.8], metric="gride_k16")])
    every, events = phases_and_events(frame)
    pd.testing.assert_frame_equal(every, phase_by_step(frame))
    pd.testing.assert_frame_equal(events, find_phases(frame))


def test_phase_watch_alerts_once_per_turn(tmp_path: Path) -> None:
    """The training probe's hook on a real offline W&B run: the current phase at each probe,
    and one alert when the layer mean turns, not repeated at the later probes nor after a
    resume (the alerted turns are in the checkpoint)."""
    frame = trajectory([2.0, 4.0, 7.0, 9.0, 6.0, 4.0, 3.0])
    run = wandb.init(project="phases", dir=tmp_path, mode="offline")
    watch = phase_report.PhaseWatch()
    logged = []
    for step in STEPS:
        logged.append(watch.update([run], frame.loc[frame["step"] <= step], step))
    resumed = phase_report.PhaseWatch()
    resumed.load_state_dict(watch.state_dict())
    resumed.update([run], frame, STEPS[-1])
    run_dir = Path(run.dir).parent
    run.finish()
    alerts = wandb_records(run_dir, "alert")
    assert [a["title"] for a in alerts] == [phase_report.alert_title("twonn")]
    assert "peaked at step 40" in alerts[0]["text"] and "seen at step 80" in alerts[0]["text"]
    assert watch.state_dict() == [["twonn", 40]]
    assert logged[0] == {}  # one probe: no trajectory yet
    assert [row.get("probe/phase/twonn/mean") for row in logged[1:]] == [1, 1, 1, -1, -1, -1]
    history = [row for row in wandb_history(run_dir) if "probe/phase/twonn/layer_01" in row]
    assert [row["probe/step"] for row in history] == [*STEPS[1:], STEPS[-1]]


def test_report_writes_phases_csv_and_summary(tmp_path: Path, capsys) -> None:
    frame = trajectory([2.0, 4.0, 7.0, 9.0, 6.0, 4.0, 3.0])

    class Run:
        summary: dict = {}

    events = phase_report.report(frame, tmp_path, [Run])
    pd.testing.assert_frame_equal(phase_report.read_phases(tmp_path), events)
    assert "mean over blocks 1..L: peak 10.5 at step 40; expansion -> compression at step 40 " \
           "(seen at 80)" in capsys.readouterr().out
    assert Run.summary["probe_summary/phases/twonn/mean/peak_step"] == 40
    assert Run.summary["probe_summary/phases/twonn/mean/expansion_to_compression"] == [40]
    assert Run.summary["probe_summary/phases/twonn/layer_01/peak_value"] == pytest.approx(10.0)


def test_a_block_missing_at_some_steps_makes_no_turn_of_the_layer_mean() -> None:
    """The layer mean is over the blocks read at every step: a mean over whichever blocks are
    read would jump from 1.5 to 2 where block 1 goes missing, and read as a turn."""
    frame = trajectory([0.0] * len(STEPS))  # flat: blocks at 1 and 2
    gone = (frame["layer"] == 1) & frame["step"].isin([40, 80])
    frame.loc[gone, "value"] = np.nan
    mean = mean_rows(find_phases(frame))
    assert set(mean["event"]) == {PEAK}
    assert mean["value"].tolist() == [2.0]  # block 2 alone: the one read throughout


def test_phase_watch_alerts_control_the_run_family_of_layer_means(tmp_path: Path) -> None:
    """Issue 49: the alerts are one family per run, the layer means of the metrics followed,
    each at 5% / n. The fall of 6 here, with a standard error of 5.32 / √15 at every point (16
    batches), has z = 3.09: beyond c(7, 15) at 5% (2.94), short of it at 2.5% (3.24). So one
    metric alerts, while two metrics of that curve do not, though each curve's logged phase
    still turns (per curve, 5%)."""
    curve, std = [2.0, 4.0, 7.0, 9.0, 6.0, 4.0, 3.0], 5.32
    z = 6 / np.sqrt(2 * (std / np.sqrt(15)) ** 2)
    assert turn_test.critical(7, 15) < z < turn_test.critical(7, 15, 0.025)
    alone = trajectory(curve, std=std)
    pair = pd.concat([alone, trajectory(curve, std=std, metric="gride_k16")])
    texts, logged = {}, {}
    for name, frame in (("alone", alone), ("pair", pair)):
        run = wandb.init(project="phases", dir=tmp_path / name, mode="offline")
        logged[name] = phase_report.PhaseWatch().update([run], frame, STEPS[-1])
        run_dir = Path(run.dir).parent
        run.finish()
        texts[name] = [a["text"] for a in wandb_records(run_dir, "alert")]
    assert len(texts["alone"]) == 1 and "conditional on this run" in texts["alone"][0]
    assert texts["pair"] == []
    assert logged["pair"]["probe/phase/twonn/mean"] == -1
    assert logged["pair"]["probe/phase/gride_k16/mean"] == -1
    assert "2.50%" in phase_report.alert_caveat(2)


def test_phase_watch_family_is_the_configured_metrics_from_the_first_probe(tmp_path: Path) -> None:
    """Issue 49's review: the family was the layer means with a peak row so far, so a metric
    not yet read (or read at too few steps) shrank it and the rate per curve rose. Given the
    probe's metrics, the family is theirs from the first probe: the fall of z = 3.09 above
    (beyond c at 5%, short of it at 2.5%) alerts alone, but not when two metrics are configured
    though the table holds one so far."""
    frame = trajectory([2.0, 4.0, 7.0, 9.0, 6.0, 4.0, 3.0], std=5.32)
    texts = {}
    for name, metrics in (("found", None), ("configured", ["twonn", "gride_k16", "anisotropy"])):
        run = wandb.init(project="phases", dir=tmp_path / name, mode="offline")
        watch = phase_report.PhaseWatch(metrics=metrics)
        watch.update([run], frame, STEPS[-1])
        run_dir = Path(run.dir).parent
        run.finish()
        texts[name] = [a["text"] for a in wandb_records(run_dir, "alert")]
    assert len(texts["found"]) == 1 and texts["configured"] == []
    assert phase_report.PhaseWatch(metrics=["anisotropy", "gride_k16", "twonn"]).metrics == (
        "twonn", "gride_k16")
    # What the probe computes: the default metrics write TwoNN (and its LLM-microscope variant)
    # and GRIDE; a probe of anisotropy alone follows no phase.
    assert phase_report.phase_metrics(ProbeSettings()) == ("twonn", "twonn_llm_microscope",
                                                           "gride_k16")
    assert phase_report.phase_metrics(ProbeSettings(metrics=["anisotropy"])) == ()
