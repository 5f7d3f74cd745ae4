"""Chaos for probes off the training clock: kill -9 the trainer or its worker at random moments,
rerun the same command until it is done, and compare with the in-process run.

A small run (the tests' tiny model on the bundled sample, ``--max-steps`` steps, a probe every
``--every`` steps, a checkpoint at each validation) with ``probe.offload=worker``: train.py starts
its worker and waits for it at the end. Each round kills, ``--kills`` times, at a moment drawn
uniformly from the first 90% of the uninterrupted run's wall time, either the training process
alone (its worker must notice and exit by itself) or the worker alone (training goes on, and a
rerun's worker finishes the probes). Between kills and after the last one, the same train.py
command is rerun until it exits 0 with every scheduled step in the table (at most
``--max-reruns`` starts). Then:

- the table against the in-process table of the same run (probe.offload=null, uninterrupted):
  the same rows, and the largest relative difference of the values (the target is rtol 1e-6);
- processes left behind: any process whose command line names the round's run folder, looked
  for until ``--linger-s`` seconds after the round (an orphaned worker stops within its poll
  interval once its trainer's start lease shows its process gone).

    python benchmarks/bench_offload_chaos.py                        # 5 rounds, seed 0
    python benchmarks/bench_offload_chaos.py --rounds 1 --kills 1   # a quick check
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from work_folder import claim  # benchmarks/, beside this script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

KEYS = ["step", "layer", "head", "metric"]


def overrides(run_dir: Path, args: argparse.Namespace) -> list[str]:
    """The run: tiny model and data (tests/hydra_configs.TINY's sizes), dense probes."""
    return [
        "data=sample", "model.n_layer=2", "model.n_head=2", "model.n_embd=32",
        "model.block_size=32", "data.batch_size=8", "data.val_windows=16", "trainer=cpu",
        f"trainer.max_steps={args.max_steps}", f"trainer.val_check_interval={args.every}",
        "trainer.limit_val_batches=2", "optim.scheduler.warmup_steps=5", "logger=csv",
        "~callbacks.progress_bar", "probe.n_states=512", "probe.settings.max_order=16",
        f"probe.every_n_steps={args.every}", f"probe.log_spaced_until={args.every}",
        "probe.n_log_spaced=3", "probe.plot_every_n_probes=0", f"hydra.run.dir={run_dir}",
    ]


def environment() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1",
            "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def start(run_dir: Path, args: argparse.Namespace, extra: list[str]) -> subprocess.Popen:
    log = open(run_dir.parent / f"{run_dir.name}.log", "ab")  # noqa: SIM115 - the child's
    return subprocess.Popen([sys.executable, "train.py", *overrides(run_dir, args), *extra],
                            cwd=ROOT, env=environment(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def children(pid: int) -> list[int]:
    """The child processes of `pid` (``/proc/<pid>/task/*/children``)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def processes_naming(folder: Path) -> list[tuple[int, str]]:
    """Live processes whose command line names `folder` (train.py and its worker both do)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            raw = (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        command = raw.replace(b"\0", b" ").decode(errors="replace")
        if str(folder) in command and state != "Z":
            found.append((int(proc.name), command[:120]))
    return found


def read_table(run_dir: Path):
    from repgeom.probes.core import table

    try:
        return table.read_table(run_dir).sort_values(KEYS).reset_index(drop=True)
    except FileNotFoundError:
        return None


def complete(run_dir: Path, reference) -> bool:
    got = read_table(run_dir)
    return got is not None and set(got["step"]) == set(reference["step"])


def compare(run_dir: Path, reference) -> tuple[bool, float, int]:
    """(same rows, largest relative difference of the values, rows)."""
    got = read_table(run_dir)
    if got is None or not got[KEYS].equals(reference[KEYS]):
        return False, float("nan"), 0 if got is None else len(got)
    x, y = reference["value"].to_numpy(), got["value"].to_numpy()
    both = np.isfinite(x) & np.isfinite(y)
    rel = np.abs(x[both] - y[both]) / np.maximum(np.abs(x[both]), 1e-12)
    return bool((np.isnan(x) == np.isnan(y)).all()), float(rel.max(initial=0.0)), len(got)


def chaos_round(index: int, base: Path, args: argparse.Namespace, wall: float,
                reference) -> dict:
    rng = random.Random(args.seed * 1000 + index)
    run_dir = base / f"round{index}"
    shutil.rmtree(run_dir, ignore_errors=True)
    extra = ["probe.offload=worker", "probe.worker.heartbeat_s=0.5"]
    kills: list[str] = []
    starts = 0
    for _ in range(args.kills):
        target = rng.choice(["trainer", "worker"])
        delay = rng.uniform(0.05, 0.9) * wall
        process = start(run_dir, args, extra)
        starts += 1
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        if process.poll() is not None:
            kills.append(f"none (the start ended before {delay:.1f} s)")
            continue
        workers = children(process.pid)
        if target == "worker" and workers:
            os.kill(workers[0], signal.SIGKILL)
            kills.append(f"worker@{delay:.1f}s")
            process.wait(timeout=1800)  # training goes on to its end; its wait sees the worker gone
        else:
            os.kill(process.pid, signal.SIGKILL)
            kills.append(f"trainer@{delay:.1f}s" + (" (no worker yet)" if target == "worker"
                                                     else ""))
            process.wait()
    code = None
    while starts < args.max_reruns + args.kills:
        process = start(run_dir, args, extra)
        starts += 1
        code = process.wait(timeout=1800)
        if code == 0 and complete(run_dir, reference):
            break
    deadline = time.monotonic() + args.linger_s
    left = processes_naming(run_dir)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = processes_naming(run_dir)
    for pid, _ in left:  # ours: the benchmark's own run folder; then say so below
        os.kill(pid, signal.SIGKILL)
    same, rel, rows = compare(run_dir, reference)
    return {"kills": kills, "starts": starts, "code": code, "same_rows": same, "rel": rel,
            "rows": rows, "left": left}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kills", type=int, default=2, help="kills per round")
    parser.add_argument("--max-steps", type=int, default=120)
    parser.add_argument("--every", type=int, default=20, help="probe and checkpoint interval")
    parser.add_argument("--max-reruns", type=int, default=4, help="starts after the kills")
    parser.add_argument("--linger-s", type=float, default=30.0,
                        help="how long a round's processes may take to exit after it")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the run folders here (a new or empty folder, or its own)")
    args = parser.parse_args()
    base = (claim(args.keep, "bench_offload_chaos.py") if args.keep
            else Path(tempfile.mkdtemp(prefix="bench_offload_chaos_")))
    reference_dir = base / "in_process"
    shutil.rmtree(reference_dir, ignore_errors=True)
    started = time.monotonic()
    if start(reference_dir, args, []).wait(timeout=1800) != 0:
        raise SystemExit(f"the in-process run failed; its log: {base / 'in_process.log'}")
    reference = read_table(reference_dir)
    timing_dir = base / "uninterrupted"  # the offloaded run's wall: where kills may fall
    shutil.rmtree(timing_dir, ignore_errors=True)
    timed = time.monotonic()
    if start(timing_dir, args, ["probe.offload=worker"]).wait(timeout=1800) != 0:
        raise SystemExit(f"the uninterrupted offloaded run failed; {base / 'uninterrupted.log'}")
    wall = time.monotonic() - timed
    print(f"in-process: {len(reference)} rows, steps {sorted(set(reference['step']))}; "
          f"uninterrupted offloaded run {wall:.1f} s (reference runs took "
          f"{time.monotonic() - started:.0f} s)", flush=True)
    failures = 0
    for index in range(args.rounds):
        result = chaos_round(index, base, args, wall, reference)
        ok = result["same_rows"] and result["rel"] <= 1e-6 and not result["left"]
        failures += not ok
        print(f"round {index + 1}: kills {', '.join(result['kills'])}; {result['starts']} "
              f"starts in all, last exit {result['code']}; {result['rows']} rows, same rows "
              f"{result['same_rows']}, largest relative difference {result['rel']:.1e}; "
              f"processes left {len(result['left'])} {result['left'] or ''}"
              f"{'' if ok else '  <-- FAILED'}", flush=True)
    print(f"{args.rounds - failures}/{args.rounds} rounds ended with the in-process table "
          "(rtol 1e-6) and no process left behind")
    if args.keep is None:
        shutil.rmtree(base, ignore_errors=True)
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
