"""Probes off the training clock (`repgeom.probes.run.offload`): the snapshot holds exactly its
step's weights, incomplete snapshots are never read, the worker's table equals the in-process
one, it resumes after kill -9 and stops when training dies, and under DDP only rank 0 writes."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import offload_stop
import pandas as pd
import pytest
import torch
from cli_runs import PYTHON, ROOT, run_train, subprocess_env, tiny_overrides
from hydra_configs import compose_train

from repgeom.models.checkpoints import gpt_from_checkpoint, read_checkpoint
from repgeom.probes.core import table
from repgeom.probes.run.callback import ProbeCallback
from repgeom.probes.run.offload import follow as follow_module
from repgeom.probes.run.offload import snapshots, training_side
from repgeom.probes.run.offload.follow import Follower, TrainingDiedError, follow
from repgeom.probes.run.offload.lease import Life, Verdict, hold_start, training_alive
from repgeom.probes.run.recorder import ProbeRecorder
from repgeom.train import train

pytestmark = pytest.mark.slow

PROBE = ["probe.every_n_steps=10", "probe.log_spaced_until=4", "probe.n_log_spaced=3"]
STEPS = [0, 1, 2, 4, 10, 20]  # the schedule of PROBE over 20 steps (test_callback)
KEYS = ["step", "layer", "head", "metric"]


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(KEYS).reset_index(drop=True)


@pytest.fixture(scope="module")
def snapshot_run(tmp_path_factory):
    """A 20-step run with ``probe.offload=snapshots`` and no worker (the snapshots stay), whose
    writer is slowed down so that training runs several steps ahead of each write, and the
    model's weights just before each optimizer step that follows a probe step (the weights
    after that many optimizer steps)."""
    run_dir = tmp_path_factory.mktemp("offload") / "run"
    before_step: dict[int, dict[str, torch.Tensor]] = {}
    original_write = snapshots.SnapshotWriter._write
    original_hook = ProbeCallback.on_before_optimizer_step

    def slow_write(self, *args, **kwargs):
        time.sleep(0.3)  # ~several training steps of the tiny model: the next steps run now
        return original_write(self, *args, **kwargs)

    def record(self, trainer, pl_module, optimizer):
        if trainer.global_step in STEPS:
            before_step[trainer.global_step] = {
                k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}
        return original_hook(self, trainer, pl_module, optimizer)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(snapshots.SnapshotWriter, "_write", slow_write)
        patch.setattr(ProbeCallback, "on_before_optimizer_step", record)
        result = train(compose_train(run_dir, ["logger=csv", *PROBE,
                                               "probe.offload=snapshots"]))
    final = {k: v.detach().clone() for k, v in result.module.model.state_dict().items()}
    return run_dir, before_step, final


def _copy_run(run_dir: Path, to: Path) -> Path:
    shutil.copytree(run_dir, to)
    return to


def _snapshot_weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    path = snapshots.step_dir(snapshots.snapshot_dir(run_dir), step) / snapshots.WEIGHTS
    state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    return {k.removeprefix("model."): v for k, v in state.items()}


_LIVE: list = []  # the start leases of pretended live trainers (dropped, a lease is let go)


def _pretend_training_runs(run_dir: Path, *, pid: int | None = None) -> None:
    """The run folder as a live training run leaves it: no done marker, a fresh heartbeat, a
    step that just moved, and its start's lease held (by this process: a live one), unless
    `pid` names a process that is gone (then its lease is let go, as filelock finds it)."""
    folder = snapshots.snapshot_dir(run_dir)
    (folder / snapshots.DONE).unlink(missing_ok=True)
    beat = snapshots.read_json(folder / snapshots.TRAINING)
    snapshots.write_json(folder / snapshots.TRAINING, {
        **beat, "state": "running", "time": time.time(), "step_time": time.time(),
        "pid": pid or os.getpid()})
    if pid is None:
        _LIVE.append(hold_start(folder, beat["number"]))


def test_each_snapshot_holds_the_weights_of_exactly_its_step(snapshot_run) -> None:
    run_dir, before_step, final = snapshot_run
    complete, incomplete = snapshots.snapshots(snapshots.snapshot_dir(run_dir))
    assert [step for step, _ in complete] == STEPS and not incomplete
    assert (snapshots.snapshot_dir(run_dir) / snapshots.DONE).is_file()
    assert not (table.probe_dir(run_dir) / "probes.csv").exists()  # nothing probed in-process
    for step in STEPS:
        # After `step` optimizer steps: recorded just before the next step's update (the
        # writer wrote 0.3 s later, several updates on); the final step is the final model.
        expected = final if step == STEPS[-1] else before_step[step]
        got = _snapshot_weights(run_dir, step)
        assert got.keys() == expected.keys()
        for key in expected:
            torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0, msg=key)
    # The weights did move between probe steps, so a copy of the wrong step would be caught.
    first, last = _snapshot_weights(run_dir, 4), _snapshot_weights(run_dir, 10)
    assert any(not torch.equal(first[k], last[k]) for k in first)


def test_worker_table_equals_the_in_process_table(snapshot_run, tmp_path: Path) -> None:
    # The in-process probe on the same 20 steps of the same seed (CPU training is
    # deterministic, so its weights at each step are the snapshots' weights).
    in_process = tmp_path / "in_process"
    train(compose_train(in_process, ["logger=csv", *PROBE]))
    run_dir = _copy_run(snapshot_run[0], tmp_path / "followed")
    result = follow(run_dir, timeout_s=30)
    assert result.stopped == "done" and result.probed == STEPS
    worker, reference = _sorted(table.read_table(run_dir)), _sorted(table.read_table(in_process))
    pd.testing.assert_frame_equal(worker[KEYS], reference[KEYS])
    # rtol 1e-6: the same weights, probe set and code; only float summation order may differ.
    np.testing.assert_allclose(worker["value"], reference["value"], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(worker["std"], reference["std"], rtol=1e-6, atol=1e-9)
    # The same files: phases, figures; the snapshots are deleted once probed.
    assert (table.probe_dir(run_dir) / "phases.csv").is_file()
    assert (table.plot_dir(run_dir) / "profile_anisotropy.png").is_file()
    assert snapshots.snapshots(snapshots.snapshot_dir(run_dir)) == ([], [])


def test_an_incomplete_snapshot_is_never_read(snapshot_run, tmp_path: Path) -> None:
    run_dir = _copy_run(snapshot_run[0], tmp_path / "run")
    folder = snapshots.snapshot_dir(run_dir)
    # Training killed while writing step 10: half a weights file and no completion marker.
    cut = snapshots.step_dir(folder, 10)
    (cut / snapshots.COMPLETE).unlink()
    data = (cut / snapshots.WEIGHTS).read_bytes()
    (cut / snapshots.WEIGHTS).write_bytes(data[: len(data) // 2])
    result = follow(run_dir, timeout_s=30, keep_snapshots=True)
    assert result.skipped == [10]
    assert sorted(table.read_table(run_dir)["step"].unique()) == [s for s in STEPS if s != 10]
    assert cut.is_dir()  # named, not deleted by the worker (the next training start removes it)


def test_the_training_callback_clears_an_incomplete_snapshot_when_it_starts(
    snapshot_run, tmp_path: Path
) -> None:
    folder = snapshots.snapshot_dir(_copy_run(snapshot_run[0], tmp_path / "run"))
    (snapshots.step_dir(folder, 10) / snapshots.COMPLETE).unlink()
    user_file = folder / "notes.txt"
    user_file.write_text("mine")
    writer = snapshots.SnapshotWriter(folder.parent.parent, heartbeat_s=60)
    writer.start({"wandb": None})
    writer.close(final_step=20)
    complete, incomplete = snapshots.snapshots(folder)
    assert not incomplete and 10 not in [s for s, _ in complete]
    assert user_file.read_text() == "mine"  # not ours: left alone


def test_the_worker_resumes_after_kill_9(snapshot_run, tmp_path: Path) -> None:
    reference = _copy_run(snapshot_run[0], tmp_path / "reference")
    follow(reference, timeout_s=30)
    run_dir = _copy_run(snapshot_run[0], tmp_path / "run")
    _pretend_training_runs(run_dir)
    args = [f"follow={run_dir}", "follow_timeout_s=120", f"hydra.run.dir={tmp_path / 'hydra'}"]
    process = subprocess.Popen([PYTHON, "probe.py", *args], cwd=ROOT, env=subprocess_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    worker_state = snapshots.snapshot_dir(run_dir) / snapshots.WORKER
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if len((snapshots.read_json(worker_state) or {}).get("done", [])) >= 2:
            break
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    probed = [int(s) for s in (snapshots.read_json(worker_state) or {}).get("done", {})]
    assert 2 <= len(probed) < len(STEPS), probed
    # Training ends; the same command goes on where the killed worker stopped.
    snapshots.write_json(snapshots.snapshot_dir(run_dir) / snapshots.DONE, {
        "step": 20, "time": time.time(), "number": 0, "skipped_for_space": {}})
    result = follow(run_dir, timeout_s=30)
    assert set(result.probed) == set(STEPS) - set(probed)
    resumed, whole = _sorted(table.read_table(run_dir)), _sorted(table.read_table(reference))
    pd.testing.assert_frame_equal(resumed[KEYS], whole[KEYS])
    np.testing.assert_allclose(resumed["value"], whole["value"], rtol=1e-6, atol=1e-9)
    assert snapshots.snapshots(snapshots.snapshot_dir(run_dir)) == ([], [])


def test_the_worker_stops_when_training_dies(snapshot_run, tmp_path: Path) -> None:
    run_dir = _copy_run(snapshot_run[0], tmp_path / "run")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no longer runs: training was killed, its heartbeat still fresh
    _pretend_training_runs(run_dir, pid=gone.pid)
    folder = snapshots.snapshot_dir(run_dir)
    assert training_alive(folder, 60).life is Life.GONE
    started = time.monotonic()
    # A vanished pid on this host is certain: it stops once the complete snapshots are probed,
    # without waiting out the timeout (a stale heartbeat from another host waits for it).
    with pytest.raises(TrainingDiedError, match=r"pid \d+\) is gone\. Probed steps .*resume"):
        follow(run_dir, timeout_s=600)
    assert time.monotonic() - started < 300
    # What was complete was probed before it stopped.
    assert sorted(table.read_table(run_dir)["step"].unique()) == STEPS
    # A stale heartbeat (another host, or no process) counts as dead after the timeout too.
    beat = snapshots.read_json(folder / snapshots.TRAINING)
    live = hold_start(folder, beat["number"])  # a start this host cannot prove gone
    try:
        snapshots.write_json(folder / snapshots.TRAINING, {**beat, "time": time.time() - 30})
        assert training_alive(folder, 10) == Verdict(
            Life.SILENT, "no heartbeat from the training process for 30 s")
        assert training_alive(folder, 60).life is Life.ALIVE
    finally:
        live.release()


def test_a_second_worker_on_the_same_run_waits_for_the_first(snapshot_run, tmp_path: Path) -> None:
    run_dir = _copy_run(snapshot_run[0], tmp_path / "run")
    first = Follower(run_dir, device=torch.device("cpu"), timeout_s=30, keep_snapshots=True)
    first.lock.acquire(30, str(run_dir))
    training = snapshots.snapshot_dir(run_dir) / snapshots.TRAINING  # beats fit a 1-s timeout
    snapshots.write_json(training, {**snapshots.read_json(training), "heartbeat_s": 0.2})
    # The second waits for the first (follow_timeout_s), then says which one holds the run.
    with pytest.raises(RuntimeError, match=rf"another probe worker \(pid {os.getpid()} on "):
        follow(run_dir, timeout_s=1)
    first.lock.release()  # released: the next worker may follow
    assert follow(run_dir, timeout_s=30).stopped == "done"


@pytest.mark.parametrize("lock", ["flock", "file"])
def test_two_workers_started_on_one_run_probe_each_step_once(snapshot_run, tmp_path: Path,
                                                             lock: str) -> None:
    # Two `probe.py follow=` on one run at once (a resubmitted worker job while the first still
    # runs), with flock and with the lease file of a shared file system: one probes, the other
    # waits for it, and the table is the one a single worker writes.
    reference = _copy_run(snapshot_run[0], tmp_path / "reference")
    follow(reference, timeout_s=30)
    run_dir = _copy_run(snapshot_run[0], tmp_path / "run")
    workers = [subprocess.Popen(
        [PYTHON, "probe.py", f"follow={run_dir}", "follow_timeout_s=300", f"follow_lock={lock}",
         f"hydra.run.dir={tmp_path / f'hydra{i}'}"], cwd=ROOT, env=subprocess_env(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outputs = [w.communicate(timeout=600)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    assert sum("waiting for it to finish" in out for out in outputs) == 1, outputs
    assert sum(out.count("probed step") for out in outputs) == len(STEPS), outputs
    both, single = _sorted(table.read_table(run_dir)), _sorted(table.read_table(reference))
    pd.testing.assert_frame_equal(both[KEYS], single[KEYS])  # each step once, no duplicates
    # rtol 1e-6: the same weights and code in another process; float summation order only.
    np.testing.assert_allclose(both["value"], single["value"], rtol=1e-6, atol=1e-9)
    folder = snapshots.snapshot_dir(run_dir)
    assert snapshots.snapshots(folder) == ([], []) and not (folder / "worker.lease").exists()


def test_a_worker_where_flock_is_refused_follows_at_once_with_the_lease(
    snapshot_run, tmp_path: Path, capsys
) -> None:
    # NFS without lockd: flock answers ENOLCK. That is no other worker; the lease (filelock's
    # SoftFileLease) needs no flock, and the worker probes at once, rather than waiting
    # follow_timeout_s for nobody.
    import fcntl

    run_dir = _copy_run(snapshot_run[0], tmp_path / "run")

    def no_lockd(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fcntl, "flock", no_lockd)
        result = follow(run_dir, timeout_s=30, wandb=False)
    assert result.stopped == "done" and result.probed == STEPS
    assert "waiting for it" not in capsys.readouterr().out
    assert not (snapshots.snapshot_dir(run_dir) / "worker.lease").exists()  # released


def test_a_full_disk_skips_that_probe_and_training_goes_on(tmp_path: Path, caplog) -> None:
    # ENOSPC in the middle of the weights file of step 4 (torch.save writes through the open
    # file): that step's probe is skipped with a warning naming the folder and the free space,
    # its half-written folder is removed, and training ends normally with the other snapshots.
    original_save = torch.save

    def save(obj, handle, *args, **kwargs):
        if isinstance(obj, dict) and "offload" in obj and obj["global_step"] == 4:  # a snapshot
            handle.write(b"half a checkpoint")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return original_save(obj, handle, *args, **kwargs)

    run_dir = tmp_path / "run"
    with pytest.MonkeyPatch.context() as patch, caplog.at_level("WARNING"):
        patch.setattr(torch, "save", save)
        result = train(compose_train(run_dir, ["logger=csv", *PROBE, "probe.offload=snapshots"]))
    assert result.trainer.global_step == 20
    folder = snapshots.snapshot_dir(run_dir)
    complete, incomplete = snapshots.snapshots(folder)
    assert [s for s, _ in complete] == [s for s in STEPS if s != 4] and not incomplete
    assert not snapshots.step_dir(folder, 4).exists() and not list(folder.rglob("*.tmp"))
    assert (folder / snapshots.DONE).is_file()  # training ended normally
    warned = [r.getMessage() for r in caplog.records if "snapshot of step 4 is skipped" in
              r.getMessage()]
    assert warned and str(folder) in warned[0] and re.search(r"[\d.]+ GB free in", warned[0])
    # The checkpoints were saved too: the error did not surface inside a checkpoint save.
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


def test_too_little_free_space_skips_the_snapshot_before_writing(tmp_path: Path, caplog) -> None:
    # The free-space check, as downloads do: a snapshot that would leave less than
    # probe.worker.min_free_gb is not started (here more than any disk has).
    run_dir = tmp_path / "run"
    with caplog.at_level("WARNING"):
        train(compose_train(run_dir, ["logger=csv", *PROBE, "probe.offload=snapshots",
                                      "probe.worker.min_free_gb=1e9"]))
    folder = snapshots.snapshot_dir(run_dir)
    assert snapshots.snapshots(folder) == ([], []) and (folder / snapshots.DONE).is_file()
    messages = " ".join(r.getMessage() for r in caplog.records)
    for step in STEPS:
        assert f"snapshot of step {step} is skipped" in messages
    assert "min_free_gb=1e+09 GB kept free" in messages and str(folder) in messages


def test_a_snapshot_rewritten_by_a_resumed_training_start_is_probed_again(
    snapshot_run, tmp_path: Path
) -> None:
    run_dir = _copy_run(snapshot_run[0], tmp_path / "run")
    follow(run_dir, timeout_s=30, keep_snapshots=True)
    # Training resumed from an earlier checkpoint and wrote step 10's snapshot again.
    marker = snapshots.step_dir(snapshots.snapshot_dir(run_dir), 10) / snapshots.COMPLETE
    snapshots.write_json(marker, {**snapshots.read_json(marker), "time": time.time()})
    assert follow(run_dir, timeout_s=30, keep_snapshots=True).probed == [10]


def test_a_training_exception_marks_the_run_failed(tmp_path: Path) -> None:
    writer = snapshots.SnapshotWriter(tmp_path, heartbeat_s=60)
    writer.start({"wandb": None})
    assert training_alive(snapshots.snapshot_dir(tmp_path), 60).life is Life.ALIVE
    writer.close(final_step=None)
    assert training_alive(snapshots.snapshot_dir(tmp_path), 60) == Verdict(
        Life.FAILED, "the training process failed")
    assert not (snapshots.snapshot_dir(tmp_path) / snapshots.DONE).exists()


def test_a_bad_offload_option_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="probe.offload must be null.*snapshots, worker"):
        ProbeCallback(offload="background")
    with pytest.raises(ValueError, match=r"probe.worker: unknown option\(s\) \['thread'\]"):
        ProbeCallback(offload="worker", worker={"thread": 2})
    # train() refuses it before any data is read or any folder written
    with pytest.raises(ValueError, match="probe.offload must be null.*got 'later'"):
        train(compose_train(tmp_path / "run", ["probe.offload=later"]))
    assert not (tmp_path / "run").exists()


def test_train_py_starts_its_own_worker(tmp_path: Path) -> None:
    # probe.offload=worker: one switch; train.py waits for its worker at the end.
    run_dir = tmp_path / "run"
    proc = run_train([*tiny_overrides(), "logger=csv", "probe.offload=worker",
                      "probe.worker.threads=1", f"hydra.run.dir={run_dir}"])
    assert "Probe worker started" in proc.stdout
    assert sorted(table.read_table(run_dir)["step"].unique()) == [0, 20]
    log = (table.probe_dir(run_dir) / "worker.log").read_text()
    assert "probed step 20" in log and "is done" in log
    assert snapshots.snapshots(snapshots.snapshot_dir(run_dir)) == ([], [])


def test_under_ddp_only_rank_0_writes_snapshots(tmp_path: Path) -> None:
    run_dir = tmp_path / "ddp"
    run_train([*tiny_overrides(trainer="ddp"), "trainer.devices=2", "trainer.accelerator=cpu",
               "trainer.precision=32-true", "data.batch_size=4", "logger=csv",
               "probe.offload=snapshots", f"hydra.run.dir={run_dir}"])
    folder = snapshots.snapshot_dir(run_dir)
    complete, incomplete = snapshots.snapshots(folder)
    assert [s for s, _ in complete] == [0, 20] and not incomplete
    markers = [snapshots.read_json(p / snapshots.COMPLETE) for _, p in complete]
    training = snapshots.read_json(folder / snapshots.TRAINING)
    # One writer, in rank 0's process (the process that ran the heartbeat too).
    assert {m["rank"] for m in markers} == {0}
    assert {m["pid"] for m in markers} == {training["pid"]}
    assert not list(folder.rglob("*.tmp"))
    assert training["state"] == "finished" and (folder / snapshots.DONE).is_file()


@pytest.mark.gpu
def test_a_gpu_snapshot_is_copied_on_a_side_stream_before_the_next_update(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    result = train(compose_train(run_dir, [
        "logger=csv", "probe.offload=snapshots", "trainer.accelerator=gpu", "trainer.devices=1",
        "trainer.max_steps=5"]))
    got = _snapshot_weights(run_dir, 5)
    for key, value in result.module.model.state_dict().items():
        torch.testing.assert_close(got[key], value.cpu(), rtol=0, atol=0, msg=key)


def test_the_worker_logs_to_w_and_b_in_the_training_runs_group(tmp_path: Path) -> None:
    from cli_runs import wandb_runs
    from wandb_records import wandb_history, wandb_records

    run_dir = tmp_path / "run"
    run_train([*tiny_overrides(), "logger=wandb", "probe.offload=worker",
               f"hydra.run.dir={run_dir}"])
    runs = wandb_runs(run_dir)
    worker = [r for r in runs if r.name.endswith("-probes")]
    training = [r for r in runs if not r.name.endswith("-probes")]
    assert len(worker) == 1 and len(training) == 1, runs
    groups = [wandb_records(r, "run")[0].get("run_group") for r in (*training, *worker)]
    assert groups[0] and groups[0] == groups[1], groups
    # The probe curves on the training steps, next to the loss.
    steps = {row["probe/step"] for row in wandb_history(worker[0]) if "probe/anisotropy/mean"
             in row}
    assert steps == {0, 20}


def test_training_and_its_worker_killed_then_rerun_end_with_the_uninterrupted_table(
    tmp_path: Path,
) -> None:
    # kill -9 of train.py at a known point, mid-run: training stops itself (SIGSTOP,
    # offload_stop.StopAtStep) at the first step >= 25 with a checkpoint, so the kill never
    # races the clock (it once came after a 40-step run on a busy machine had finished). Its
    # worker gets some time to probe while training is stopped. The same command then ends with
    # the table of a run that was never interrupted.
    args = [*tiny_overrides(), "logger=csv", *PROBE, "trainer.max_steps=40",
            "probe.offload=worker", "probe.worker.heartbeat_s=0.2"]
    reference = tmp_path / "reference"
    run_train([*args, f"hydra.run.dir={reference}"])
    run_dir = tmp_path / "run"
    command = [PYTHON, "train.py", *args, *offload_stop.overrides(25), f"hydra.run.dir={run_dir}"]
    process = subprocess.Popen(command, cwd=ROOT, env=subprocess_env(
        PYTHONPATH=offload_stop.pythonpath()), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    folder = snapshots.snapshot_dir(run_dir)
    deadline = time.monotonic() + 600
    while process.poll() is None and not offload_stop.stopped(process.pid):
        assert time.monotonic() < deadline, "train.py neither stopped at step 25 nor ended"
        time.sleep(0.05)
    for _ in range(200):  # the worker probes a few steps meanwhile, if it keeps up (not needed)
        if len((snapshots.read_json(folder / snapshots.WORKER) or {}).get("done", {})) >= 2:
            break
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    if (folder / snapshots.DONE).exists():  # no checkpoint before the end: never stopped
        pytest.skip("inconclusive: the run wrote no checkpoint before its last step, so it was "
                    "never stopped mid-run")
    assert (snapshots.read_json(folder / snapshots.TRAINING) or {}).get("step", 0) < 40
    run_train([*args, f"hydra.run.dir={run_dir}"])
    resumed, whole = _sorted(table.read_table(run_dir)), _sorted(table.read_table(reference))
    pd.testing.assert_frame_equal(resumed[KEYS], whole[KEYS])
    np.testing.assert_allclose(resumed["value"], whole["value"], rtol=1e-6, atol=1e-9)
    assert snapshots.snapshots(snapshots.snapshot_dir(run_dir)) == ([], [])


# -- issue 33: requeues, kills during the end-of-run work, finished reruns, bounded waits ---------


def _reference_table(snapshot_run, tmp_path: Path) -> pd.DataFrame:
    """The table of an uninterrupted worker on an untouched copy of the run."""
    reference = _copy_run(snapshot_run[0], tmp_path / "reference")
    follow(reference, timeout_s=30)
    return _sorted(table.read_table(reference))


def _assert_same_table(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(_sorted(got)[KEYS], expected[KEYS])
    # rtol 1e-6: the same weights, probe set and code; only float summation order may differ.
    np.testing.assert_allclose(_sorted(got)["value"], expected["value"], rtol=1e-6, atol=1e-9)


def test_a_replayed_step_replaces_the_unprobed_snapshot_of_the_abandoned_start(
    snapshot_run, tmp_path: Path
) -> None:
    # A requeued training start replays step 10 while the lagging worker is still at step 0:
    # the replay's weights are the run's weights at step 10 now (the abandoned start's need not
    # be bitwise the same), so its snapshot replaces the unprobed one, and the table gets it.
    # Here the replay writes the same weights (CPU training is deterministic), so the table
    # equals the uninterrupted one.
    reference = _reference_table(snapshot_run, tmp_path)
    run_dir = _copy_run(snapshot_run[0], tmp_path / "run")
    _pretend_training_runs(run_dir)
    folder = snapshots.snapshot_dir(run_dir)
    marker = snapshots.read_json(snapshots.step_dir(folder, 10) / snapshots.COMPLETE)
    ckpt = read_checkpoint(snapshots.step_dir(folder, 10) / snapshots.WEIGHTS)
    replayed = gpt_from_checkpoint(ckpt, torch.device("cpu")).model
    meta = {k: v for k, v in ckpt.items() if k not in ("state_dict", "global_step")}
    seen: dict[str, object] = {}
    original = follow_module.probe_gpt

    def probe_while_training_replays(model, *args, **kwargs):
        if not seen:
            writer = snapshots.SnapshotWriter(run_dir, heartbeat_s=60)
            writer.start({"wandb": None})
            writer.snapshot(10, replayed, meta)
            writer.wait()  # raises if the write failed: training would crash at its next save
            seen["marker"] = snapshots.read_json(snapshots.step_dir(folder, 10)
                                                 / snapshots.COMPLETE)
            writer.close(final_step=20)
        return original(model, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(follow_module, "probe_gpt", probe_while_training_replays)
        result = follow(run_dir, timeout_s=30)
    assert seen["marker"]["time"] > marker["time"]  # the replay's snapshot replaced the old one
    assert result.stopped == "done" and result.probed == STEPS
    _assert_same_table(table.read_table(run_dir), reference)
    state = snapshots.read_json(folder / snapshots.WORKER)
    assert state["done"]["10"] == seen["marker"]["time"]  # what was probed is the replay
    assert snapshots.snapshots(folder) == ([], []) and not snapshots.leftovers(folder)


def test_a_snapshot_replaced_while_probed_is_probed_again_under_its_step(
    snapshot_run, tmp_path: Path
) -> None:
    # Step 10's snapshot is replaced by a new generation (here: the weights of step 20) while
    # the worker probes the old one, as a training start writes a step again once the first
    # generation was deleted. The old probe must not be recorded as the new generation's, and
    # the new one, never probed, must not be deleted.
    run_dir = _copy_run(snapshot_run[0], tmp_path / "run")
    folder = snapshots.snapshot_dir(run_dir)
    step_10, step_20 = snapshots.step_dir(folder, 10), snapshots.step_dir(folder, 20)
    calls: list[int] = []
    original = follow_module.probe_gpt

    def probe_while_replaced(model, *args, **kwargs):
        output = original(model, *args, **kwargs)
        calls.append(1)
        if len(calls) == STEPS.index(10) + 1:
            shutil.rmtree(step_10)
            staging = folder / "staging"
            shutil.copytree(step_20, staging)
            snapshots.write_json(staging / snapshots.COMPLETE, {
                **snapshots.read_json(staging / snapshots.COMPLETE), "step": 10,
                "time": time.time()})
            os.rename(staging, step_10)
        return output

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(follow_module, "probe_gpt", probe_while_replaced)
        follow(run_dir, timeout_s=30)
    frame = table.read_table(run_dir)
    at_10 = _sorted(frame[frame["step"] == 10]).drop(columns="step").reset_index(drop=True)
    at_20 = _sorted(frame[frame["step"] == 20]).drop(columns="step").reset_index(drop=True)
    # Step 10's rows are those of the weights now labelled step 10 (the new generation).
    np.testing.assert_allclose(at_10["value"], at_20["value"], rtol=1e-6, atol=1e-9)
    assert snapshots.snapshots(folder) == ([], [])


def test_the_worker_reads_each_snapshot_file_once(snapshot_run, tmp_path: Path) -> None:
    run_dir = _copy_run(snapshot_run[0], tmp_path / "run")
    loads: list[str] = []
    original = torch.load

    def counted(path, *args, **kwargs):
        loads.append(str(path))
        return original(path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "load", counted)
        follow(run_dir, timeout_s=30)
    weights = [p for p in loads if p.endswith(snapshots.WEIGHTS)]
    assert len(weights) == len(STEPS) == len(set(weights)), weights


def test_a_worker_deleting_a_step_never_touches_a_write_in_progress(tmp_path: Path) -> None:
    # The worker that probed step 10's previous generation deletes "step_10" while a
    # requeued training start writes step 10 again.
    folder = snapshots.snapshot_dir(tmp_path)
    writer = snapshots.SnapshotWriter(tmp_path, heartbeat_s=60)
    writer.start({"wandb": None})
    model = torch.nn.Linear(3, 2)
    original = torch.save

    def save_then_worker_deletes(obj, handle, *args, **kwargs):
        original(obj, handle, *args, **kwargs)
        target = snapshots.step_dir(folder, 10)
        if target.exists():
            snapshots.remove_snapshot(target)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "save", save_then_worker_deletes)
        writer.snapshot(10, model, {"hyper_parameters": {}})
        writer.close(final_step=10)  # waits for the write: an error would surface here
    complete, incomplete = snapshots.snapshots(folder)
    assert [s for s, _ in complete] == [10] and not incomplete
    got = _snapshot_weights(tmp_path, 10)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(got[key], value, rtol=0, atol=0)


def test_a_write_never_touches_another_starts_write_of_the_same_pid(tmp_path: Path) -> None:
    # Two starts of one run in two containers (or on two nodes) can share a pid. Another start's
    # write of step 10 is in progress, under the name this process's pid once gave: this start's
    # own write of step 10 leaves it alone. Before, the temporary folder was named by the pid and
    # removed first ("this process's own cut write"), deleting the other start's files.
    folder = snapshots.snapshot_dir(tmp_path)
    writer = snapshots.SnapshotWriter(tmp_path, heartbeat_s=60)
    writer.start({"wandb": None})
    theirs = folder / f".{snapshots.step_dir(folder, 10).name}.{os.getpid()}{snapshots.WRITING}"
    theirs.mkdir()
    (theirs / "weights.pt").write_bytes(b"the other start's bytes")
    writer.snapshot(10, torch.nn.Linear(3, 2), {"hyper_parameters": {}})
    writer.close(final_step=10)
    assert (theirs / "weights.pt").read_bytes() == b"the other start's bytes"
    assert [s for s, _ in snapshots.snapshots(folder)[0]] == [10]


class _Killed(BaseException):
    """A kill -9 at that moment (nothing after it runs)."""


def test_a_worker_killed_during_its_end_of_run_work_does_it_when_rerun(
    snapshot_run, tmp_path: Path
) -> None:
    reference = _copy_run(snapshot_run[0], tmp_path / "reference")
    follow(reference, timeout_s=30)
    run_dir = _copy_run(snapshot_run[0], tmp_path / "run")

    def killed(self, *args, **kwargs):
        raise _Killed  # after the last probe, before the figures and phases.csv

    worker = Follower(run_dir, device=torch.device("cpu"), timeout_s=30, keep_snapshots=False,
                      wandb=False)
    with pytest.MonkeyPatch.context() as patch, pytest.raises(_Killed):
        patch.setattr(ProbeRecorder, "finish", killed)
        worker.run()
    assert not (table.probe_dir(run_dir) / "phases.csv").exists()
    # The same command again: nothing left to probe, the end-of-run work still done.
    result = follow(run_dir, timeout_s=30)
    assert result.stopped == "done" and result.probed == []
    phases = table.probe_dir(run_dir) / "phases.csv"
    assert phases.is_file()
    pd.testing.assert_frame_equal(pd.read_csv(phases),
                                  pd.read_csv(table.probe_dir(reference) / "phases.csv"))
    figures = sorted(p.name for p in table.plot_dir(run_dir).glob("*.png"))
    assert figures == sorted(p.name for p in table.plot_dir(reference).glob("*.png"))
    _assert_same_table(table.read_table(run_dir), _sorted(table.read_table(reference)))
    # Done once, not again at every rerun.
    assert snapshots.read_json(snapshots.snapshot_dir(run_dir) / snapshots.WORKER)[
        "finished"] == 20
    (table.probe_dir(run_dir) / "phases.csv").unlink()
    follow(run_dir, timeout_s=30)
    assert not phases.exists()


def test_the_worker_judges_progress_not_only_the_heartbeat(tmp_path: Path) -> None:
    writer = snapshots.SnapshotWriter(tmp_path, heartbeat_s=60)
    writer.start({"wandb": None})
    folder = snapshots.snapshot_dir(tmp_path)
    beat = {**snapshots.read_json(folder / snapshots.TRAINING), "step": 7}
    # A deadlocked trainer: its heartbeat thread beats on, its step has not moved for 100 s.
    snapshots.write_json(folder / snapshots.TRAINING, {**beat, "time": time.time(),
                                                   "step_time": time.time() - 100})
    verdict = training_alive(folder, 60)
    assert verdict.life is Life.STUCK
    assert verdict.why.startswith("the training process beats but has been at step 7")
    # The heartbeat says when training reached its step (the callback reports each step).
    writer.progress(8)
    writer._beat("running")
    beat = snapshots.read_json(folder / snapshots.TRAINING)
    assert beat["step"] == 8 and abs(beat["step_time"] - time.time()) < 60
    assert training_alive(folder, 60).life is Life.ALIVE
    writer.close(final_step=None)


def test_the_heartbeat_must_fit_twice_in_the_timeout(snapshot_run, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"at least 2 heartbeats.*heartbeat_s=400 s"):
        ProbeCallback(offload="worker", worker={"heartbeat_s": 400, "timeout_s": 600})
    # probe.py follow= reads the run's own heartbeat_s (training.json)
    run_dir = _copy_run(snapshot_run[0], tmp_path / "run")
    folder = snapshots.snapshot_dir(run_dir)
    beat = snapshots.read_json(folder / snapshots.TRAINING)
    snapshots.write_json(folder / snapshots.TRAINING, {**beat, "heartbeat_s": 60})
    assert follow(run_dir, timeout_s=30).stopped == "done"  # finished: no beats to judge
    _pretend_training_runs(run_dir)  # a live run with a 60 s heartbeat
    with pytest.raises(ValueError, match=r"timeout \(30 s.*follow_timeout_s"):
        follow(run_dir, timeout_s=30)


def test_the_worker_gets_its_own_session_and_cores_and_a_bounded_wait(tmp_path: Path) -> None:
    from repgeom.probes.run.offload.training_side import start_worker

    (tmp_path / "probes").mkdir()
    options = {"threads": 1, "device": "cpu", "cpus": [0], "timeout_s": 600,
               "keep_snapshots": False, "heartbeat_s": 10}
    process = start_worker(tmp_path, options)
    try:
        # start_new_session (no preexec_fn): its own session and process group
        assert os.getsid(process.pid) == process.pid
        assert os.sched_getaffinity(process.pid) == {0}
        from repgeom.probes.run.offload.training_side import stop_worker

        started = time.monotonic()
        # it waits for a run that never starts (600 s); stopped after the stated limit
        assert stop_worker(process, 0.5) is None
        assert time.monotonic() - started < 60 and process.poll() is not None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_finished_run_rerun_starts_a_worker_only_for_unfinished_probing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = [*tiny_overrides(), "logger=csv", "probe.offload=worker", f"hydra.run.dir={run_dir}"]
    first = run_train(args)
    assert "at most 3600 s (probe.worker.wait_timeout_s)" in first.stdout  # a stated limit
    log = table.probe_dir(run_dir) / "worker.log"
    before = log.read_text()
    folder = snapshots.snapshot_dir(run_dir)
    # Rerun of the finished run: nothing to probe, no worker (one would find no training).
    again = run_train(args)
    assert "worker started" not in again.stdout
    assert log.read_text() == before
    assert snapshots.read_json(folder / snapshots.TRAINING)["state"] == "finished"
    # Its worker was killed during the end-of-run work (worker.json says it is not done): the
    # rerun starts a worker that does it, and waits for it.
    phases = table.probe_dir(run_dir) / "phases.csv"
    phases.unlink()
    state = snapshots.read_json(folder / snapshots.WORKER)
    snapshots.write_json(folder / snapshots.WORKER, {**state, "finished": None})
    third = run_train(args)
    assert "its probing is not: probe worker started" in third.stdout
    assert phases.is_file() and "is done" in log.read_text()[len(before):]
    assert snapshots.read_json(folder / snapshots.WORKER)["finished"] == 20


def test_the_pairwise_rows_against_the_final_step_come_when_the_worker_is_rerun(
    tmp_path: Path,
) -> None:
    trained = tmp_path / "trained"
    train(compose_train(trained, ["logger=csv", *PROBE, "probe.offload=snapshots",
                                  "probe.metrics=[anisotropy,linear_cka]"]))
    reference = _copy_run(trained, tmp_path / "reference")
    follow(reference, timeout_s=30, wandb=False)
    run_dir = _copy_run(trained, tmp_path / "run")
    worker = Follower(run_dir, device=torch.device("cpu"), timeout_s=30, keep_snapshots=False,
                      wandb=False)

    def killed(self, *args, **kwargs):
        raise _Killed  # after the last probe, before the comparison with the final step

    with pytest.MonkeyPatch.context() as patch, pytest.raises(_Killed):
        patch.setattr(ProbeRecorder, "_vs_final", killed)
        worker.run()
    assert "step_b" not in table.read_table(run_dir).columns
    follow(run_dir, timeout_s=30, wandb=False)
    got, expected = table.read_table(run_dir), table.read_table(reference)
    keys = [c for c in expected.columns if c not in ("value", "std")]
    got = got.sort_values(keys).reset_index(drop=True)
    expected = expected.sort_values(keys).reset_index(drop=True)
    assert expected["step_b"].notna().any()  # the pairwise rows against the final step
    pd.testing.assert_frame_equal(got[keys], expected[keys])
    # rtol 1e-6: the same weights and states; only float summation order may differ.
    np.testing.assert_allclose(got["value"], expected["value"], rtol=1e-6, atol=1e-9)


def test_a_sigterm_marks_the_run_stopped_and_the_worker_waits_for_it(tmp_path: Path) -> None:
    # SLURM's requeue (and preemption, scancel) sends SIGTERM; Lightning raises SIGTERMException
    # out of fit. That run comes back under the same folder, so the worker must not stop at once
    # as it does for a failed run: it waits for a heartbeat or a snapshot up to its timeout.
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    callback = ProbeCallback(offload="snapshots")
    offloading = callback.offloading  # the training side of probe.offload
    offloading.run_dir = tmp_path
    offloading.writer = snapshots.SnapshotWriter(tmp_path, heartbeat_s=1)
    offloading.writer.start({"wandb": None})
    callback.on_exception(None, None, SIGTERMException())
    folder = snapshots.snapshot_dir(tmp_path)
    assert snapshots.read_json(folder / snapshots.TRAINING)["state"] == "stopped"
    assert not (folder / snapshots.DONE).exists()
    started = time.monotonic()
    with pytest.raises(TrainingDiedError, match="stopped.*no new snapshot for 2 s"):
        follow(tmp_path, timeout_s=2, wandb=False)
    assert time.monotonic() - started >= 2  # waited for the run to come back
    # Any other exception is a failure: the worker stops at once.
    offloading.writer = snapshots.SnapshotWriter(tmp_path, heartbeat_s=1)
    offloading.writer.start({"wandb": None})
    callback.on_exception(None, None, RuntimeError("boom"))
    assert snapshots.read_json(folder / snapshots.TRAINING)["state"] == "failed"
    # After a SIGTERM another error may surface first (W&B's service, killed by the same
    # signal, drops its connection): Lightning's own flag still says it was a SIGTERM.
    offloading.writer = snapshots.SnapshotWriter(tmp_path, heartbeat_s=1)
    offloading.writer.start({"wandb": None})
    callback.on_exception(SimpleNamespace(received_sigterm=True), None,
                          ConnectionResetError("Connection lost"))
    assert snapshots.read_json(folder / snapshots.TRAINING)["state"] == "stopped"


def test_a_real_full_disk_inside_torch_save_skips_that_probe(tmp_path: Path, monkeypatch,
                                                             caplog) -> None:
    # On a full disk (or a quota: EDQUOT while disk_usage still shows free space) the real
    # torch.save does not raise the OSError: its zip writer turns the failed write into a
    # RuntimeError ("unexpected pos ..."), the ENOSPC only its __context__. Here the real
    # torch.save writes through a file that runs out of space after 1000 bytes.
    original_save = torch.save

    class FullFile:
        def __init__(self, handle) -> None:
            self.handle, self.written = handle, 0

        def write(self, data) -> int:
            self.written += len(data)
            if self.written > 1000:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.handle.write(data)

        def flush(self) -> None:
            self.handle.flush()

    def save(obj, handle, *args, **kwargs):
        return original_save(obj, FullFile(handle) if obj["global_step"] == 2 else handle,
                             *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    writer = snapshots.SnapshotWriter(tmp_path, heartbeat_s=60, min_free_gb=0)
    writer.start({"wandb": None})
    model = torch.nn.Linear(64, 64)
    with caplog.at_level("WARNING"):
        for step in (1, 2, 3):
            writer.snapshot(step, model, {"offload": {}})  # a failed write surfaced here
        writer.close(final_step=3)
    folder = writer.folder
    assert [s for s, _ in snapshots.snapshots(folder)[0]] == [1, 3]
    assert snapshots.snapshots(folder)[1] == [] and not list(folder.glob(".*.tmp"))
    assert list(writer.skipped) == [2] and "No space left on device" in writer.skipped[2]
    warned = [r.getMessage() for r in caplog.records if "snapshot of step 2 is skipped" in
              r.getMessage()]
    assert warned and str(folder) in warned[0] and re.search(r"[\d.]+ GB free in", warned[0])


def test_a_json_file_that_cannot_be_written_leaves_no_temporary_file(tmp_path: Path,
                                                                     monkeypatch) -> None:
    # ENOSPC at fsync (as NFS reports a full disk): the heartbeat thread swallows it and tries
    # again, so a half-written `.training.json.*.tmp` must not stay behind each time.
    def full(fd) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        snapshots.write_json(tmp_path / snapshots.TRAINING, {"state": "running"})
    assert list(tmp_path.iterdir()) == []


def test_a_live_trainer_on_a_host_whose_clock_is_behind_is_not_judged_dead(
    snapshot_run, tmp_path: Path
) -> None:
    # The worker runs on another node than training (slurm/probe_worker.sbatch), whose clock is
    # two hours behind. Its heartbeat moves, its step moves: it lives, whatever its clock says.
    # The worker must wait for its done marker, not stop after follow_timeout_s.
    import threading

    run_dir = _copy_run(snapshot_run[0], tmp_path / "run")
    folder = snapshots.snapshot_dir(run_dir)
    (folder / snapshots.DONE).unlink()
    base = snapshots.read_json(folder / snapshots.TRAINING)
    live = hold_start(folder, base["number"])  # its start's lease: no process this host can ask
    stop = threading.Event()

    def trainer_elsewhere() -> None:
        skew, step = -7200.0, 20
        for _ in range(48):  # beats every 0.25 s, for more than twice the worker's timeout
            step += 1
            snapshots.write_json(folder / snapshots.TRAINING, {
                **base, "host": "node-elsewhere", "pid": 1, "state": "running",
                "heartbeat_s": 0.25, "step": step, "step_time": time.time() + skew,
                "time": time.time() + skew})
            if stop.wait(0.25):
                return
        snapshots.write_json(folder / snapshots.DONE, {
            "step": 20, "time": time.time() + skew, "number": base["number"],
            "skipped_for_space": {}})
        snapshots.write_json(folder / snapshots.TRAINING, {
            **base, "host": "node-elsewhere", "state": "finished", "time": time.time() + skew})

    thread = threading.Thread(target=trainer_elsewhere)
    thread.start()
    try:
        result = follow(run_dir, timeout_s=5, wandb=False)
    finally:
        stop.set()
        thread.join()
        live.release()
    assert result.stopped == "done" and result.probed == STEPS


def test_a_validation_run_counts_as_progress_in_the_heartbeat(tmp_path: Path,
                                                              monkeypatch) -> None:
    # No optimizer step moves during a validation run (or the checkpoint save after it); a long
    # one must not read as a deadlocked trainer, or the worker stops (TrainingDiedError) while
    # training is fine. Each validation batch that ends is progress.
    from repgeom.models.lightning_module import CharLM

    seen: list[tuple[int, float, float]] = []  # (batch, when it started, step_time then)
    original = CharLM.validation_step

    def validation_step(self, batch, batch_idx):
        callback = next(c for c in self.trainer.callbacks if isinstance(c, ProbeCallback))
        writer = callback.offloading.writer
        if writer is not None:  # not the sanity check before training starts
            seen.append((batch_idx, time.time(), writer.step_time))
        return original(self, batch, batch_idx)

    monkeypatch.setattr(CharLM, "validation_step", validation_step)
    train(compose_train(tmp_path / "run", ["logger=csv", *PROBE, "probe.offload=snapshots"]))
    assert [b for b, _, _ in seen] == [0, 1, 0, 1]  # validation at steps 10 and 20
    for (_, started, _), (_, _, progress) in zip(seen[0::2], seen[1::2], strict=True):
        assert progress >= started  # the first validation batch moved the heartbeat's clock


def test_a_complete_snapshot_without_its_weights_does_not_spin_the_worker(tmp_path: Path
                                                                          ) -> None:
    # step_1 says complete but its weights.ckpt is gone (deleted by hand to free space, or lost
    # by the file system). The worker named it "changed or vanished" and looked again at once,
    # forever (a busy loop writing worker.log), even for a failed run. It must skip it, say so,
    # and stop as for any failed run.
    run_dir = tmp_path / "run"
    folder = snapshots.snapshot_dir(run_dir)
    snapshots.step_dir(folder, 1).mkdir(parents=True)
    (folder / snapshots.MARKER).write_text("repgeom")
    snapshots.write_json(snapshots.step_dir(folder, 1) / snapshots.COMPLETE, {
        "step": 1, "time": time.time(), "rank": 0, "pid": 1, "start": "x", "number": 0,
        "bytes": 100})
    snapshots.write_json(folder / snapshots.TRAINING, {
        "state": "failed", "pid": 1, "step": 1, "step_time": time.time(), "time": time.time(),
        "heartbeat_s": 10.0, "number": 0})
    code = ("from repgeom.probes.run.offload.follow import follow; "
            f"follow({str(run_dir)!r}, timeout_s=5, wandb=False)")
    try:
        done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60,
                              env=subprocess_env(PYTHONPATH=str(ROOT / "src")))
    except subprocess.TimeoutExpired as spinning:
        pytest.fail(f"the worker never stopped: {str(spinning.stdout)[-300:]}")
    assert "TrainingDiedError" in done.stderr and "training process failed" in done.stderr
    assert done.stdout.count("step 1") <= 2
    assert "has no weights.ckpt" in done.stdout


def _full_at(name: str, error: int = errno.ENOSPC):
    """An `os.fsync` that fails with `error` on the temporary file of `name` (a full disk, as
    NFS reports it: at fsync) and flushes every other file as usual."""
    original = os.fsync

    def fsync(fd):
        if Path(os.readlink(f"/proc/self/fd/{fd}")).name.startswith(f".{name}."):
            raise OSError(error, os.strerror(error))
        return original(fd)

    return os, "fsync", fsync


@pytest.mark.parametrize(("error", "fix"), [(errno.ENOSPC, "free some space on that disk"),
                                            (errno.EROFS, "make that folder writable")])
def test_a_done_marker_that_cannot_be_written_says_where_and_how_to_finish(
    tmp_path: Path, monkeypatch, error: int, fix: str
) -> None:
    writer = snapshots.SnapshotWriter(tmp_path, heartbeat_s=60)
    writer.start({"wandb": None})
    monkeypatch.setattr(*_full_at(snapshots.DONE, error))
    with pytest.raises(snapshots.RunNotRecordedError) as raised:
        writer.close(final_step=7)
    message, folder = str(raised.value), writer.folder
    assert f"writing done.json in {folder} failed ({os.strerror(error)};" in message
    assert re.search(r"[\d.]+ GB free there", message) and fix in message
    assert "run the same train.py command again" in message
    assert not (folder / snapshots.DONE).exists() and not list(folder.glob(".*.tmp"))
    # not "running" with a heartbeat that stops: "stopped", a run that may come back
    assert snapshots.read_json(folder / snapshots.TRAINING)["state"] == "stopped"


def test_a_full_disk_at_the_end_of_training_fails_clearly_and_a_rerun_records_the_run(
    tmp_path: Path,
) -> None:
    # Training succeeds, then done.json cannot be written (ENOSPC): the checkpoints stay, the
    # worker train.py started is stopped within its limit (not orphaned, waiting for a done
    # marker that never comes), train() fails with the message that says how to finish, and
    # the same command rerun with space records the run and lets the worker finish.
    run_dir = tmp_path / "run"
    overrides = ["logger=csv", *PROBE, "probe.offload=worker", "probe.worker.threads=1"]
    workers: list[subprocess.Popen] = []
    original_start = training_side.start_worker

    def start_worker(*args, **kwargs):
        workers.append(original_start(*args, **kwargs))
        return workers[-1]

    folder = snapshots.snapshot_dir(run_dir)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(training_side, "start_worker", start_worker)
        patch.setattr(*_full_at(snapshots.DONE))
        with pytest.raises(snapshots.RunNotRecordedError) as raised:
            train(compose_train(run_dir, overrides))
        assert len(workers) == 1 and workers[0].poll() is not None  # stopped, not orphaned
    message = str(raised.value)
    assert f"done.json in {folder} failed (No space left on device;" in message
    assert re.search(r"[\d.]+ GB free there", message)
    assert "run the same train.py command again" in message
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == 20  # the trained model is saved
    assert not (folder / snapshots.DONE).exists() and not list(run_dir.rglob("*.tmp"))
    assert snapshots.read_json(folder / snapshots.TRAINING)["state"] == "stopped"

    # The same command with space: no training (the run is finished), the status written, and
    # a worker that probes what the stopped one left.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(training_side, "start_worker", start_worker)
        result = train(compose_train(run_dir, overrides))
    assert result.trainer.global_step == 20 and len(workers) == 2
    assert workers[1].poll() == 0  # waited for, and done
    assert snapshots.read_json(folder / snapshots.DONE)["step"] == 20
    assert snapshots.read_json(folder / snapshots.TRAINING)["state"] == "finished"
    assert snapshots.read_json(folder / snapshots.WORKER)["finished"] == 20
    assert sorted(table.read_table(run_dir)["step"].unique()) == STEPS
    assert follow(run_dir, timeout_s=30, wandb=False).stopped == "done"


def test_a_step_skipped_for_space_is_named_at_the_end_even_after_a_resume(tmp_path: Path,
                                                                         capsys) -> None:
    # Step 4's snapshot is skipped (ENOSPC), then training dies at step 12 and resumes from its
    # step-10 checkpoint. The resumed start knows nothing of step 4 from its own writer; the
    # gap is real, and the worker must say why that step has no rows rather than leave it
    # silently missing from the table.
    run_dir = tmp_path / "run"
    overrides = ["logger=csv", *PROBE, "probe.offload=snapshots"]
    original_save, original_progress = torch.save, snapshots.SnapshotWriter.progress

    def save(obj, handle, *args, **kwargs):
        if isinstance(obj, dict) and "offload" in obj and obj["global_step"] == 4:  # a snapshot
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return original_save(obj, handle, *args, **kwargs)

    def progress(self, step, **kwargs):
        if step == 12:
            raise _Killed  # after the checkpoint of step 10
        return original_progress(self, step, **kwargs)

    with pytest.MonkeyPatch.context() as patch, pytest.raises(_Killed):
        patch.setattr(torch, "save", save)
        patch.setattr(snapshots.SnapshotWriter, "progress", progress)
        train(compose_train(run_dir, overrides))
    train(compose_train(run_dir, overrides))  # resumes at step 10 and finishes
    done = snapshots.read_json(snapshots.snapshot_dir(run_dir) / snapshots.DONE)
    assert done["step"] == 20 and list(done["skipped_for_space"]) == ["4"]
    assert "No space left on device" in done["skipped_for_space"]["4"]
    capsys.readouterr()
    result = follow(run_dir, timeout_s=30, wandb=False)
    assert sorted(result.frame["step"].unique()) == [s for s in STEPS if s != 4]
    assert list(result.no_space) == [4]
    out = capsys.readouterr().out
    assert "steps [4] have no probe rows: training skipped their snapshots for lack of disk " \
           "space (step 4: No space left on device while writing)" in out


def test_a_run_killed_after_its_last_checkpoint_is_rerun_to_the_whole_table(
    tmp_path: Path,
) -> None:
    # kill -9 after the final checkpoint (step 20, saved at its validation) and before
    # on_train_end writes done.json: the rerun trains nothing (Lightning skips the finished fit)
    # and writes done.json. That claims no more than is there: the checkpoint waited for the
    # step-20 snapshot (state_dict), so the worker's table has every step of the schedule.
    run_dir = tmp_path / "run"
    overrides = ["logger=csv", *PROBE, "probe.offload=snapshots"]

    def killed(self, trainer, pl_module):
        raise _Killed

    def nothing_more(self, trainer, pl_module, exception):  # a killed process writes nothing
        self.offloading.writer._stop.set()  # (its heartbeat thread dies with it)
        self.offloading.writer._heartbeat.join()

    with pytest.MonkeyPatch.context() as patch, pytest.raises(_Killed):
        patch.setattr(ProbeCallback, "on_train_end", killed)
        patch.setattr(ProbeCallback, "on_exception", nothing_more)
        train(compose_train(run_dir, overrides))
    folder = snapshots.snapshot_dir(run_dir)
    assert snapshots.read_json(folder / snapshots.TRAINING)["state"] == "running"
    assert not (folder / snapshots.DONE).exists()
    assert torch.load(run_dir / "checkpoints" / "last.ckpt",
                      weights_only=False)["global_step"] == 20
    result = train(compose_train(run_dir, overrides))
    assert result.trainer.global_step == 20
    assert snapshots.read_json(folder / snapshots.DONE)["step"] == 20
    assert snapshots.read_json(folder / snapshots.TRAINING)["state"] == "finished"
    done = follow(run_dir, timeout_s=30, wandb=False)
    assert done.stopped == "done" and sorted(done.frame["step"].unique()) == STEPS
