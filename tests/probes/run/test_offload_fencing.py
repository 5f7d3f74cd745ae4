"""Starts fenced everywhere, markers validated field by field (issue 47, holes 1 and 2).

Hole 1: a superseded start (an older start of the run, alive on a hung node after a requeue began
a newer one) that later finishes or fails wrote ``done.json`` and ``training.json`` over the
newer start's: the worker ended "done" (or raised `TrainingDiedError`) while the newer start
trained on. Hole 2: a ``complete.json`` with ``"time": NaN`` (which Python's json reads without
complaint) was probed again and again, never recorded as done; so were other bad fields."""

from __future__ import annotations

import json
import threading
import types
from pathlib import Path

import pytest
import torch

from repgeom.probes.run.offload import lease, snapshots, starts
from repgeom.probes.run.offload.follow import follow

HEARTBEAT_S = 0.1
WATCH_S = 2.0
"""Seconds the worker is watched while the newer start trains: four of its polls."""


def _follow_in_thread(run_dir: Path) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def target() -> None:
        try:
            result["done"] = follow(run_dir, timeout_s=60, wandb=False)
        except BaseException as error:  # noqa: BLE001 - the test judges it
            result["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


@pytest.mark.parametrize("finished", [True, False], ids=["finishes", "fails"])
def test_a_superseded_start_that_ends_writes_nothing_and_the_worker_waits_for_the_newer(
        tmp_path, finished) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    folder = snapshots.snapshot_dir(run_dir)
    old = snapshots.SnapshotWriter(run_dir, heartbeat_s=HEARTBEAT_S, min_free_gb=0)
    old.start({"wandb": None})
    new = snapshots.SnapshotWriter(run_dir, heartbeat_s=HEARTBEAT_S, min_free_gb=0)
    new.start({"wandb": None})  # a requeue while the old start still lives
    old.close(final_step=20 if finished else None)  # the hung node wakes up and ends
    assert not (folder / snapshots.DONE).exists()
    beat = snapshots.read_json(folder / snapshots.TRAINING)
    assert beat["state"] == "running"
    thread, result = _follow_in_thread(run_dir)
    thread.join(WATCH_S)
    assert thread.is_alive(), f"the worker ended while the newer start trains: {result}"
    assert new.is_current() and not old.is_current()  # what a callback asks
    new.close(final_step=20)
    thread.join(30)
    assert not thread.is_alive() and result["done"].stopped == "done", result


BAD = {"nan time": ("time", float("nan")), "infinite time": ("time", float("inf")),
       "text time": ("time", "soon"), "no time": ("time", None), "text step": ("step", "x"),
       "other step": ("step", 11), "fractional number": ("number", 1.5),
       "negative bytes": ("bytes", -1), "bool rank": ("rank", True), "no start": ("start", None)}


@pytest.mark.parametrize("key,value", list(BAD.values()), ids=list(BAD))
def test_a_marker_with_a_bad_field_is_quarantined_once_never_probed_again_and_again(
        tmp_path, monkeypatch, key, value) -> None:
    from repgeom.probes.run.offload import follow as follow_module

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    writer = snapshots.SnapshotWriter(run_dir, heartbeat_s=HEARTBEAT_S, min_free_gb=0)
    writer.start({"wandb": None})
    model = torch.nn.Linear(2, 2)
    writer.snapshot(10, model, {"hyper_parameters": {}})
    writer.close(final_step=10)
    folder = snapshots.snapshot_dir(run_dir)
    marker_path = snapshots.step_dir(folder, 10) / snapshots.COMPLETE
    marker = json.loads(marker_path.read_text())
    marker.pop(key)
    if value is not None:
        marker[key] = value
    marker_path.write_text(json.dumps(marker))  # NaN and Infinity as Python's json writes them
    probes: list[int] = []
    passes: list[int] = []
    original = snapshots.snapshots

    def counted(path):
        passes.append(1)
        if len(passes) > 50:
            raise AssertionError(f"the worker spins: {len(passes)} passes over {path}")
        return original(path)

    def prepare(self, path, ckpt):  # a stand-in spec and recorder: no model to probe
        self.spec = types.SimpleNamespace(batch_size=1, to_dict=lambda: {})
        self.recorder = types.SimpleNamespace(
            settings=None, pairs=[], record=lambda *a, **k: None, state_dict=lambda: [],
            finish=lambda *a, **k: 0.0)

    def probe(*args, **kwargs):  # the probe is counted: a bad marker's snapshot is never probed
        probes.append(1)
        return types.SimpleNamespace(warnings=[])

    monkeypatch.setattr(snapshots, "snapshots", counted)
    monkeypatch.setattr(follow_module.Follower, "_prepare", prepare)
    monkeypatch.setattr(follow_module, "read_checkpoint", lambda path: {})
    monkeypatch.setattr(follow_module, "gpt_from_checkpoint",
                        lambda ckpt, device: types.SimpleNamespace(model=None, vocab=None))
    monkeypatch.setattr(follow_module, "checkpoint_masking", lambda ckpt, vocab: None)
    monkeypatch.setattr(follow_module, "probe_gpt", probe)
    result = follow(run_dir, timeout_s=60, wandb=False)
    assert result.stopped == "done" and result.probed == [] and list(result.quarantined) == [10]
    assert key in result.quarantined[10] and str(marker_path) in result.quarantined[10]
    skipped = json.loads((run_dir / "probes" / "skipped.json").read_text())
    assert skipped["step 10"]["step"] == 10 and key in skipped["step 10"]["reason"]
    assert follow(run_dir, timeout_s=60, wandb=False).probed == []  # not tried again
    assert probes == []


def test_a_start_superseded_between_its_fence_and_its_write_writes_its_own_number(
        tmp_path, monkeypatch) -> None:
    """The review's race: the older start passes `is_current`, the newer one claims, then the
    older writes. It stamped the newest number (the newer start's) on its own done.json and
    training.json, so the worker took them for the newer start's and ended the run."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    folder = snapshots.snapshot_dir(run_dir)
    old = snapshots.SnapshotWriter(run_dir, heartbeat_s=60, min_free_gb=0)
    old.start({"wandb": None})
    monkeypatch.setattr(old, "is_current", lambda: True)  # it checked before the newer claimed
    newer = starts.claim(folder)
    old.close(final_step=None)  # fails
    beat = snapshots.read_json(folder / snapshots.TRAINING)
    assert beat["state"] == "failed" and beat["number"] == old.number < newer
    # The worker's verdict: the newer start has claimed and not yet beaten, so it waits (not
    # certain) rather than ending at once on the older start's word.
    verdict = lease.training_alive(folder, 600, newest=starts.newest(folder))
    assert verdict.life is lease.Life.NOT_STARTED and not verdict.life.certain
