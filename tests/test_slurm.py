"""Against a real SLURM started here: sbatch jobs, preemption with requeue and resume, a sweep.

The fixture starts munged, slurmctld and slurmd (Debian's `slurm-wlm`, `munge`) in a temporary
folder (tests/slurm_cluster.py) and skips with the reason when it cannot. Jobs run on CPU: the
scripts take `--gpus-per-node=0` and Hydra overrides like any user's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import torch
from cli_runs import (
    PYTHON,
    assert_complete_run,
    csv_metrics,
    probe_table,
    run_train,
    subprocess_env,
    tiny_overrides,
    wandb_run_id,
    wandb_runs,
)
from hydra_configs import ROOT
from slurm_cluster import LocalSlurm, missing_requirements
from wandb_records import wandb_history

# One worker runs them all under `pytest -n` (make test): they share the session's cluster.
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm")]

# The scripts' #SBATCH lines ask for GPUs, a `gpu` partition and 64 GB; this node has none of
# them. Command-line options override #SBATCH lines, as they would for a user.
CPU_JOB = ["--partition=debug", "--gpus-per-node=0", "--cpus-per-task=1", "--mem=1G"]
# The scripts run `trainer=ddp` with devices = tasks per node; on CPU, over gloo.
CPU_TRAINER = ["trainer.accelerator=cpu", "trainer.precision=32-true"]


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except Exception as error:  # a failed start must not leave daemons behind
        cluster.stop()
        raise error
    yield cluster
    cluster.stop()


def sbatch(slurm: LocalSlurm, options: list[str], script: str, overrides: list[str], run_dir: Path,
           log: Path, **env_extra: str) -> str:
    """Submit `script` as a user does, with this Python's environment; return the job id."""
    env = subprocess_env(RUN_DIR=str(run_dir), **env_extra)
    proc = slurm.run(
        ["sbatch", "--parsable", *CPU_JOB, f"--output={log}", *options, script, *overrides],
        cwd=ROOT, env=env,
    )
    return proc.stdout.strip().split(";")[0]


def wandb_losses(wandb_run: Path) -> pd.Series:
    """train/loss by global step, as logged to one offline W&B run folder."""
    rows = [r for r in wandb_history(wandb_run) if "train/loss" in r]
    return pd.Series(
        [r["train/loss"] for r in rows], index=[int(r["trainer/global_step"]) for r in rows]
    ).sort_index()


def global_step(checkpoint: Path) -> int:
    return torch.load(checkpoint, weights_only=False, map_location="cpu")["global_step"]


def job_output(log: Path) -> str:
    return log.read_text() if log.exists() else "(no job output)"


def test_sbatch_runs_a_two_process_job_to_the_end(slurm: LocalSlurm, tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "job.out"
    steps = 20
    job = sbatch(
        slurm, ["--ntasks-per-node=2"], "slurm/train.sbatch",
        [*tiny_overrides(trainer="ddp"), *CPU_TRAINER, f"trainer.max_steps={steps}"], run_dir, log,
    )
    record = slurm.wait(job, timeout=420)
    assert record["JobState"] == "COMPLETED", job_output(log)
    assert_complete_run(run_dir, max_steps=steps)
    out = job_output(log)
    assert "Effective batch size 16 windows = 8 per device x 2 device(s)" in out
    # Two ranks started by srun, only rank 0 writes the W&B run and Hydra's config folder.
    assert "Starting with 2 processes" in out
    assert len(wandb_runs(run_dir)) == 1
    assert (run_dir / ".hydra" / "config.yaml").exists()


def test_time_limit_requeues_and_resumes_the_same_run(slurm: LocalSlurm, tmp_path: Path) -> None:
    # A one-minute limit. SLURM checks limits and warnings every 30 s and sends the warning
    # when the next check would be too late (measured here: USR1@10 of a 1-minute job arrives
    # 20-50 s after the start, whatever the number says), so it comes after Python's start-up
    # and Lightning's handler (~12 s in), never before it (SIGUSR1 would kill the job). Training
    # is bounded by trainer.max_time, 150 s of training time that Lightning's Timer keeps in the
    # checkpoint, so the first run is always interrupted and the rest takes 150 s at any speed.
    # The first start is killed by the clock: the limit (60 s) plus SLURM's 30 s check interval
    # plus KillWait (5 s) after the job's start, start-up included (Lightning ignores the
    # requeue's SIGTERM), so it uses at most ~95 s of the budget, saving last.ckpt on the way;
    # 150 s leaves the resumed start 55 s or more (at 90 s, a run beside two CPU-bound
    # processes left the resumed start no step).
    run_dir, log = tmp_path / "run", tmp_path / "job.out"
    max_steps, every = 10_000, 250
    overrides = [
        *tiny_overrides(trainer="ddp"), *CPU_TRAINER, f"trainer.max_steps={max_steps}",
        "trainer.val_check_interval=50", "trainer.log_every_n_steps=5",
        '+trainer.max_time="00:00:02:30"', f"probe.every_n_steps={every}",
        f"probe.log_spaced_until={every}", "probe.n_log_spaced=8",
    ]
    job = sbatch(
        slurm, ["--ntasks-per-node=1", "--time=1", "--signal=USR1@10"], "slurm/train.sbatch",
        overrides, run_dir, log,
    )
    # Once requeued, give the second run room, so that the test waits for one restart only.
    requeued = slurm.wait(job, timeout=150, until=lambda r: int(r.get("Restarts", 0)) >= 1)
    assert int(requeued.get("Restarts", 0)) >= 1, (requeued, job_output(log))
    slurm.run(["scontrol", "update", f"JobId={job}", "TimeLimit=10"])
    record = slurm.wait(job, timeout=420)
    out = job_output(log)
    assert record["JobState"] == "COMPLETED", out
    assert int(record["Restarts"]) == 1, out

    # Lightning saved a checkpoint on the signal, and the requeued job resumed from it (or
    # from last.ckpt, if a validation checkpoint came between the signal and the requeue).
    assert "Handling auto-requeue signal" in out
    (hpc,) = run_dir.glob("hpc_ckpt_*.ckpt")
    resumed = re.search(r"Resuming from (\S+) \(found in the run folder\)", out)
    assert resumed, out
    resumed_step = global_step(Path(resumed.group(1)))
    assert resumed_step >= global_step(hpc) > 0, out
    # last.ckpt is the state at the end of training, whether or not val/bpc still improved
    # after the resume (Lightning 2.6 alone kept the best state there: 9650 > 9650 failed)
    final = global_step(run_dir / "checkpoints" / "last.ckpt")
    assert final > resumed_step, (final, resumed_step, out[-3000:])

    # The same W&B run: one offline folder per start (`wandb sync` merges them into one run),
    # all with the run id kept in the run folder.
    runs = wandb_runs(run_dir)
    assert len(runs) == 2
    run_id = (run_dir / "wandb_run_id.txt").read_text().strip()
    assert {wandb_run_id(run) for run in runs} == {run_id}

    # The curve continues: the first start logged from step 0, the second from the checkpoint's
    # step on (not from 0, and not one step off: the requeue checkpoint is written mid-step),
    # with a loss no higher than before the requeue and far below the untrained model's
    # (~5.3 nats; a restart from scratch would log that again). The first start may log a step
    # or two past its requeue checkpoint before SIGTERM stops it, or miss its last rows: the
    # SIGTERM also stops W&B's writer process, which loses what it had not yet written.
    first, second = (wandb_losses(run) for run in runs)
    assert first.index.min() < 5 and first.index.max() < final
    assert second.index.min() >= resumed_step and second.index.max() >= final - 5
    # Per-step losses of 8-window batches of 32 characters scatter by ~0.15 nats, so the
    # continuity check compares 10-step means and allows 0.3; a restart from scratch would sit
    # at the untrained loss, several nats above.
    initial, before, after = first.iloc[0], first.tail(10).mean(), second.head(10).mean()
    assert after < before + 0.3 and after < initial - 0.5, (initial, before, after)
    # Each start logs to its own csv/version_N; stitched, the CSV curve runs from step 0 to the end.
    assert len(list(run_dir.glob("csv/version_*/metrics.csv"))) == 2
    steps = csv_metrics(run_dir).dropna(subset=["train/loss"])["step"]
    assert steps.min() < 5 and steps.max() >= final - 5 and steps.is_monotonic_increasing

    probes = probe_table(run_dir)
    if probes is not None:
        # Probes continue on the run's schedule: each scheduled step up to the end once.
        from repgeom.probes.run.schedule import probe_schedule

        schedule = probe_schedule(
            max_steps, every_n_steps=every, log_spaced_until=every, n_log_spaced=8, max_probes=40
        )
        # The run ends at max_time, after its last checkpoint: the end-of-training probe is at
        # the true last step, which is at or after last.ckpt's.
        end = int(probes["step"].max())
        assert end >= final
        expected = {s for s in schedule if s <= end} | {end}
        assert set(probes["step"]) == expected
        assert not probes.duplicated(["step", "layer", "head", "metric"]).any()


def test_submitit_sweep_of_two_jobs_completes(slurm: LocalSlurm, tmp_path: Path) -> None:
    sweep = tmp_path / "multirun" / "slurm-sweep"
    steps = 10
    proc = slurm.run(
        [PYTHON, "train.py", "-m", "hydra/launcher=slurm", "masking=causal,bidirectional",
         "hydra.launcher.partition=debug", "hydra.launcher.gpus_per_node=null",
         "hydra.launcher.tasks_per_node=1", "hydra.launcher.cpus_per_task=1",
         "hydra.launcher.mem_gb=1", "hydra.launcher.timeout_min=10", *tiny_overrides(),
         f"trainer.max_steps={steps}", "trainer.val_check_interval=5", f"hydra.sweep.dir={sweep}"],
        check=False, cwd=ROOT, env=subprocess_env(), timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [p.name for p in jobs] == ["0", "1"]
    ids = set()
    for job, masking in zip(jobs, ["causal", "bidirectional"], strict=True):
        assert_complete_run(job, max_steps=steps)
        last = torch.load(job / "checkpoints" / "last.ckpt", weights_only=False)
        hparams = last["hyper_parameters"]
        assert hparams["masking"]["name"] == masking
        (run,) = wandb_runs(job)
        ids.add(wandb_run_id(run))
        frame = csv_metrics(job)
        assert frame["step"].max() == steps - 1
    assert len(ids) == 2  # one W&B run per job (the group per sweep: tests/test_multirun.py)


def test_probe_shards_on_slurm_merge_to_the_single_job_table(
    slurm: LocalSlurm, tmp_path: Path, tiny_hf_folder, tiny_text
) -> None:
    """`probe.py -m ... shard=0,1,2 shards=3 hydra/launcher=slurm`: three SLURM jobs probe a hub
    model's revisions (the hub stand-in on 127.0.0.1, reached from the node), and the sweep's end
    merges them into the table a single job writes."""
    from hub_server import FakeHub

    from repgeom.probes.core import table
    from repgeom.probes.run.shards import KEYS

    text = tmp_path / "text.txt"
    text.write_text(tiny_text * 3)
    folders = {f"step{s}": tiny_hf_folder("gpt2" if i % 2 == 0 else "gpt2-scaled")
               for i, s in enumerate((10, 20, 30, 40))}
    common = ["hf=org/sharded", "hf_revisions=all", f"text_file={text}", "window=32",
              "n_states=128", "settings.state_batch_size=128", "settings.max_order=8",
              "settings.distributions=false", "metrics=[anisotropy,linear_cka]",
              "plot_metrics=[anisotropy]", "device=cpu"]
    launcher = ["hydra/launcher=slurm", "hydra.launcher.partition=debug",
                "hydra.launcher.gpus_per_node=null", "hydra.launcher.tasks_per_node=1",
                "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1",
                "hydra.launcher.timeout_min=10"]
    sweep, single = tmp_path / "sweep", tmp_path / "single"
    with FakeHub("org/sharded", folders) as hub:
        env = subprocess_env(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf_home"))
        proc = slurm.run([PYTHON, "probe.py", "-m", *common, *launcher, "shard=0,1,2",
                          "shards=3", f"hydra.sweep.dir={sweep}"],
                         check=False, cwd=ROOT, env=env, timeout=400)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        proc = slurm.run([PYTHON, "probe.py", *common, f"hydra.run.dir={single}"],
                         check=False, cwd=ROOT, env=env, timeout=400)
        assert proc.returncode == 0, proc.stderr[-3000:]
    owned = [sorted(table.read_table(sweep / str(k))["step"].unique()) for k in range(3)]
    assert owned == [[10, 40], [20], [30]]
    merged, whole = table.read_table(sweep / "merged"), table.read_table(single)
    keys = [k for k in KEYS if k in whole.columns]
    merged, whole = (f.sort_values(keys, na_position="first").reset_index(drop=True)
                     for f in (merged, whole))
    pd.testing.assert_frame_equal(merged[keys], whole[keys], check_dtype=False)
    # Other processes on the same CPU: float32 kernels only.
    assert (merged["value"] - whole["value"]).abs().max() <= 1e-6 * whole["value"].abs().max()


def test_a_probe_worker_job_follows_the_training_job(slurm: LocalSlurm, tmp_path: Path) -> None:
    # The companion job of README "Probes off the training clock": training writes snapshots,
    # a second job (started once training has) probes them into the training run's table.
    run_dir, log, worker_log = tmp_path / "run", tmp_path / "job.out", tmp_path / "worker.out"
    job = sbatch(
        slurm, ["--ntasks-per-node=1"], "slurm/train.sbatch",
        [*tiny_overrides(trainer="ddp"), *CPU_TRAINER, "probe.offload=snapshots"], run_dir, log,
    )
    worker = slurm.run(
        ["sbatch", "--parsable", *CPU_JOB, f"--output={worker_log}", f"--dependency=after:{job}",
         "slurm/probe_worker.sbatch", str(run_dir), "device=cpu"],
        cwd=ROOT, env=subprocess_env(),
    ).stdout.strip().split(";")[0]
    assert slurm.wait(job, timeout=240)["JobState"] == "COMPLETED", job_output(log)
    record = slurm.wait(worker, timeout=240)
    assert record["JobState"] == "COMPLETED", job_output(worker_log)
    assert sorted(probe_table(run_dir)["step"].unique()) == [0, 20]
    assert "is done" in job_output(worker_log)


def test_a_requeued_training_job_and_a_lagging_worker_end_with_the_in_process_table(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    # Issue 33, item 7: slurm/train.sbatch with probe.offload=snapshots and its companion
    # slurm/probe_worker.sbatch. The worker is suspended (it lags, snapshots pile up), training is
    # requeued mid-run (`scontrol requeue`: SIGTERM, back to the queue, the same job id and run
    # folder, resumed from last.ckpt, so it replays steps and rewrites their snapshots), then the
    # worker goes on. The final table is the one the in-process probe writes.
    import os
    import signal
    import socket
    import time

    import numpy as np
    from filelock import SoftFileLease

    from repgeom.probes.run.offload import lease, snapshots

    run_dir, log, worker_log = tmp_path / "run", tmp_path / "job.out", tmp_path / "worker.out"
    # Long enough that the worker job starts and probes before training ends: on one thread
    # (tests/conftest.py) the tiny model once ran 600 steps before the worker's first probe.
    # Probes and checkpoints every 50 steps, as before.
    steps = 1200
    overrides = [
        *tiny_overrides(trainer="ddp"), *CPU_TRAINER, f"trainer.max_steps={steps}",
        "trainer.val_check_interval=50", "trainer.log_every_n_steps=10",
        "probe.every_n_steps=50", "probe.log_spaced_until=50", "probe.n_log_spaced=3",
    ]
    # Lightning's SLURM port is 15000 + the job id's last digits; each test cluster numbers its
    # jobs from 1, so another session's job may hold it: a free port instead, kept on requeue.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    job = sbatch(slurm, ["--ntasks-per-node=1"], "slurm/train.sbatch",
                 [*overrides, "probe.offload=snapshots", "probe.worker.heartbeat_s=0.5"],
                 run_dir, log, MASTER_PORT=port)
    worker = slurm.run(
        ["sbatch", "--parsable", *CPU_JOB, f"--output={worker_log}", f"--dependency=after:{job}",
         "slurm/probe_worker.sbatch", str(run_dir), "device=cpu"],
        cwd=ROOT, env=subprocess_env(),
    ).stdout.strip().split(";")[0]
    folder = snapshots.snapshot_dir(run_dir)

    def wait_for(what: str, ready, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not within {timeout:.0f} s\n{job_output(log)}\n"
                                   f"{job_output(worker_log)}")
            time.sleep(0.2)

    def probed() -> int:
        return len((snapshots.read_json(folder / snapshots.WORKER) or {}).get("done", {}))

    def training_step() -> int:
        return int((snapshots.read_json(folder / snapshots.TRAINING) or {}).get("step", 0))

    wait_for("the worker's first probe", lambda: probed() >= 1)
    # The worker lags from here on: stopped (SIGSTOP). `scontrol suspend` would be the cluster's
    # way, but on this test node (proctrack/linuxproc, no cgroups) it leaves a batch job running.
    # The worker's pid: the holder filelock's lease names (offload.lease, issue 47).
    worker_pid = SoftFileLease(folder / lease.LEASE_NAME, lease_duration=lease.LEASE_STALE_S) \
        .owner.pid
    os.kill(worker_pid, signal.SIGSTOP)
    try:
        # Mid-run, after a checkpoint, with snapshots waiting for the stopped worker.
        wait_for("training past step 120", lambda: training_step() >= 120
                 and (run_dir / "checkpoints" / "last.ckpt").is_file())
        assert training_step() < steps, "training ended before the requeue; give it more steps"
        first_pid = snapshots.read_json(folder / snapshots.TRAINING)["pid"]
        slurm.run(["scontrol", "requeue", job])
        # Lightning turns the requeue's SIGTERM into SIGTERMException: the run is "stopped", not
        # "failed", and the worker, going on now, waits for it to come back.
        wait_for("the stopped state", lambda: (snapshots.read_json(folder / snapshots.TRAINING)
                                               or {}).get("state") == "stopped")
    finally:
        os.kill(worker_pid, signal.SIGCONT)
    wait_for("the requeued start", lambda: (snapshots.read_json(folder / snapshots.TRAINING)
                                            or {}).get("pid") not in (None, first_pid), 600)
    assert slurm.wait(job, timeout=600)["JobState"] == "COMPLETED", job_output(log)
    record = slurm.wait(worker, timeout=600)
    assert record["JobState"] == "COMPLETED", job_output(worker_log)
    assert int(slurm.job(job).get("Restarts", 0)) == 1
    assert "is done" in job_output(worker_log)

    # The in-process probe of the same run, uninterrupted (CPU training is deterministic, and
    # a resume from last.ckpt replays the same batches: the same weights at each step).
    reference = tmp_path / "reference"
    run_train([*overrides, "trainer.devices=1", "trainer.num_nodes=1",
               f"hydra.run.dir={reference}"], timeout=900)
    keys = ["step", "layer", "head", "metric"]
    got, want = (probe_table(d).sort_values(keys).reset_index(drop=True)
                 for d in (run_dir, reference))
    pd.testing.assert_frame_equal(got[keys], want[keys])  # each step once, none missing
    # rtol 1e-6: the same weights and probe code in other processes; float summation order only.
    np.testing.assert_allclose(got["value"], want["value"], rtol=1e-6, atol=1e-9)
    assert snapshots.snapshots(folder) == ([], [])
