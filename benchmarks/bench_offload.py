"""Probes off the training clock: training wall time without probes, with in-process probes,
and with offloaded probes plus their worker, pinned to cores.

Each run is ``python train.py experiment=quickstart logger=csv`` in a fresh process, pinned with
``taskset`` to the training core with one torch thread; the offloaded runs start their worker
(``probe.offload=worker``) on the worker core with one thread (``probe.worker.cpus``) and do not
wait for it (``probe.worker.wait=false``), so the training wall is the training command's own;
how long after training the worker finished is printed beside it. One configuration at a time,
``--repeats`` runs each (the three configurations take turns, so a drift in the machine's load
touches all three alike); the ratios are of the medians.

    python benchmarks/bench_offload.py                          # quickstart length, 3 runs each
    python benchmarks/bench_offload.py --max-steps 60 --repeats 1   # a quick check that it works

Also printed: the worker's table against the in-process one (the same seed and weights: the
largest relative difference), and the extra memory of a snapshot (one copy of the weights,
reused: the buffer bytes) with the peak resident memory of the training process per
configuration (``/usr/bin/time``'s maximum RSS).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from work_folder import claim  # benchmarks/, beside this script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

CONFIGS = {
    "no probes": ["probe=none"],
    "in-process probes": [],
    "offloaded + worker": ["probe.offload=worker", "probe.worker.threads=1",
                           "probe.worker.wait=false"],
}


def run_once(name: str, extra: list[str], run_dir: Path, args: argparse.Namespace) -> dict:
    overrides = ["experiment=quickstart", "logger=csv", f"trainer.max_steps={args.max_steps}",
                 f"hydra.run.dir={run_dir}", *extra]
    if name == "offloaded + worker":
        overrides.append(f"probe.worker.cpus=[{args.worker_core}]")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "offline",
           "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = ["taskset", "-c", str(args.train_core), "/usr/bin/time", "-f", "maxrss_kb=%M",
               sys.executable, "train.py", *overrides]
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{name}: train.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rss = re.search(r"maxrss_kb=(\d+)", proc.stderr)
    result = {"wall": wall, "rss_mb": int(rss.group(1)) / 1024 if rss else float("nan")}
    if name == "offloaded + worker":  # the worker goes on alone: when is it done?
        log = run_dir / "probes" / "worker.log"
        deadline = time.perf_counter() + 1800
        while time.perf_counter() < deadline:
            if log.is_file() and "is done" in log.read_text():
                break
            time.sleep(0.2)
        else:
            raise SystemExit(f"the worker of {run_dir} did not finish; see {log}")
        result["worker_after"] = time.perf_counter() - started - wall
    return result


def snapshot_bytes(run_dir: Path) -> int:
    """Bytes of one copy of the weights (the snapshot buffers), from the final checkpoint."""
    import torch

    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu",
                       weights_only=True)["state_dict"]
    return sum(v.numel() * v.element_size() for k, v in state.items() if k.startswith("model."))


def compare_tables(in_process: Path, worker: Path) -> str:
    from repgeom.probes.core import table

    keys = ["step", "layer", "head", "metric"]
    a = table.read_table(in_process).sort_values(keys).reset_index(drop=True)
    b = table.read_table(worker).sort_values(keys).reset_index(drop=True)
    if not a[keys].equals(b[keys]):
        return f"rows differ: {len(a)} in-process, {len(b)} worker"
    x, y = a["value"].to_numpy(), b["value"].to_numpy()
    both = np.isfinite(x) & np.isfinite(y)
    rel = np.abs(x[both] - y[both]) / np.maximum(np.abs(x[both]), 1e-12)
    same_nan = bool((np.isnan(x) == np.isnan(y)).all())
    steps = sorted(int(s) for s in a["step"].unique())
    return (f"{len(a)} rows, steps {steps}; largest relative difference "
            f"{rel.max():.2e} (NaN in the same places: {same_nan})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=500, help="the quickstart's 500")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-core", type=int, default=0)
    parser.add_argument("--worker-core", type=int, default=1)
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the run folders here (a new or empty folder, or its own)")
    args = parser.parse_args()
    # its runs are deleted before each is made again: a --keep folder must be the benchmark's own
    base = (claim(args.keep, "bench_offload.py") if args.keep
            else Path(tempfile.mkdtemp(prefix="bench_offload_")))
    walls: dict[str, list[float]] = {name: [] for name in CONFIGS}
    rss: dict[str, list[float]] = {name: [] for name in CONFIGS}
    after: list[float] = []
    last: dict[str, Path] = {}
    for repeat in range(args.repeats):
        for name, extra in CONFIGS.items():
            run_dir = base / f"{name.split()[0]}-{repeat}"
            shutil.rmtree(run_dir, ignore_errors=True)
            result = run_once(name, extra, run_dir, args)
            walls[name].append(result["wall"])
            rss[name].append(result["rss_mb"])
            if "worker_after" in result:
                after.append(result["worker_after"])
            last[name] = run_dir
            print(f"  run {repeat + 1}/{args.repeats} {name}: {result['wall']:.1f} s", flush=True)
    print(f"quickstart (gpt_tiny, sample data), {args.max_steps} steps, 3 probes; training pinned "
          f"to core {args.train_core} with 1 thread, the worker to core {args.worker_core} with "
          f"1 thread; median of {args.repeats} run(s) each, wall of the train.py command")
    base_wall = statistics.median(walls["no probes"])
    for name in CONFIGS:
        median = statistics.median(walls[name])
        runs = " / ".join(f"{w:.1f}" for w in walls[name])
        line = (f"{name:<20} {median:7.1f} s  (runs {runs})  ratio to no probes "
                f"{median / base_wall:.3f}")
        if name == "offloaded + worker":
            line += f"; worker done {statistics.median(after):.1f} s after training"
        print(line)
    print("worker's table vs in-process table: "
          + compare_tables(last["in-process probes"], last["offloaded + worker"]))
    size = snapshot_bytes(last["no probes"])
    print(f"snapshot: {size / 2**20:.2f} MiB of buffers (one copy of the weights, reused); peak "
          "RSS of the training process: " + ", ".join(
              f"{name} {statistics.median(v):.0f} MB" for name, v in rss.items()))
    if args.keep is None:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
