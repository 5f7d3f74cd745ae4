"""The numbers of `gpu_check.sh` (run that script, not this file): stages, each in its own process.

Each stage (`gpu_stages.py`) runs in a process of its own with its own time budget, writes its
lines to the results file as it goes, and, if it fails or runs out of time, leaves its last 40
stderr lines there; the next stage runs anyway. The stages share one Inductor cache
(``TORCHINDUCTOR_CACHE_DIR``), so a graph compiled by one is read by the next; the timing runs
write no checkpoints. In order, with their budgets on a GPU (`BUDGETS_S`, 400 s in all, so that
the whole check fits in gpu_check.sh's 420 s):

0. ``device`` (45 s): torch, CUDA, the GPU's name, a bf16 matmul's TFLOP/s, the compile of
   gpt_tiny's training loss;
1. ``training`` (100 s): gpt_small at batch 16 x 512 through today's path (`recipe=off`), the new
   default (conf/recipe/default.yaml) and a plain PyTorch loop (`bench_train_throughput.py`):
   tokens/s, ms/step, MFU and peak memory each; their ratios;
2. ``knee`` (80 s): the new default at 16, 32, 64 and 128 windows of 512, a line (and a
   process) each, then the knee;
3. ``band`` (55 s): two 200-step runs of today's path on the bundled sample differ by a band;
   the new default's run against their mean, within it or not;
4. ``share`` (75 s): the training probe's share of the wall time at gpt_small's default schedule,
   in-process and offloaded (``probe.offload=worker``, the worker on the same GPU): runs of the
   same length with no probe, in-process probes and offloaded ones give each probe's extra wall
   seconds, which the default schedule's probe count and step time turn into a share;
5. ``knn`` (20 s): exact k nearest neighbours on 100k x 768, repgeom's GPU search against FAISS
   on the CPU (its first 2,000 queries), and the share of neighbours both find;
6. ``hub`` (25 s): one revision of a tiny Pythia from the tests' hub stand-in through
   ``probe.py hf=... hf_revisions=[...]``, and its seconds.

One definition of tokens/s in every line (`benchmarks/train_timing.py`): the timed steps' tokens
over the seconds between a device sync before the first timed step and one after the last,
warm-up steps (compilation) untimed.

``--cpu-smoke`` runs the same stages at toy sizes on the CPU (a test and the rehearsal run it);
its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for folder in ("tests", "src", "benchmarks"):  # hub stand-in; this checkout; train_timing
    sys.path.insert(0, str(ROOT / folder))

BUDGETS_S = {"device": 45, "training": 100, "knee": 80, "band": 55, "share": 75, "knn": 20,
             "hub": 25}
"""Each stage's seconds on a GPU; their sum (400 s) leaves gpu_check.sh's 420 s some margin."""
SMOKE_BUDGET_S = 300
"""Each stage's seconds at toy sizes on a (loaded, 2-core) CPU."""
STDERR_LINES = 40
KILL_GRACE_S = 5
"""SIGTERM, then SIGKILL this much later: Lightning only notes a SIGTERM during a fit."""

FULL = {
    "model": "gpt_small", "device": "cuda", "compile_block": 256, "compile_backend": "inductor",
    # --symbols 200: the bundled sample's vocabulary, which the train.py runs read, so that
    # every stage's gpt_small at 16 x 512 is one compiled graph (the shared Inductor cache)
    "throughput": ["--model", "gpt_small", "--batch-size", "16", "--steps", "20", "--rounds", "3",
                   "--warmup", "3", "--knee-steps", "10", "--symbols", "200"],
    "knee": "16,32,64,128", "band_steps": 200,
    "share_steps": 200, "share_probe_every": 100, "timer_warmup": 10, "worker_wait_s": 10,
    "share_overrides": ["model=gpt_small", "data=sample", "data.batch_size=16",
                        "trainer.limit_val_batches=0", "trainer.val_check_interval=100000"],
    "share_probe": [],
    "knn": (100_000, 768),
}
SMOKE = {
    "model": "gpt_tiny", "device": "cpu", "compile_block": 32, "compile_backend": "aot_eager",
    "throughput": ["--cpu-smoke"], "knee": "1,2", "band_steps": 6,
    "share_steps": 6, "share_probe_every": 3, "timer_warmup": 1, "worker_wait_s": 120,
    "share_overrides": ["model=gpt_tiny", "model.n_layer=2", "model.n_head=2", "model.n_embd=32",
                        "model.block_size=32", "data=sample", "data.batch_size=4",
                        "data.val_windows=16", "trainer=cpu", "trainer.limit_val_batches=0",
                        "trainer.val_check_interval=100000", "trainer.log_every_n_steps=1"],
    "share_probe": ["probe.n_states=256", "probe.settings.state_batch_size=128",
                    "probe.settings.max_order=16"],
    "knn": (2_000, 64),
}


def _writer(results: Path):
    def emit(line: str) -> None:
        with open(results, "a", encoding="utf-8") as f:
            f.write(line + "\n")
        print(line, flush=True)
    return emit


def run_stage(name: str, smoke: bool, results: Path, tmp: Path) -> None:
    """The body of one stage, in this process (`--stage`)."""
    import torch  # noqa: F401 - before the stages' imports, as in every run of the project
    from gpu_stages import STAGES

    folder = tmp / name
    folder.mkdir(parents=True, exist_ok=True)
    STAGES[name](SMOKE if smoke else FULL, folder, _writer(results))


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the stage's process group, SIGKILL after KILL_GRACE_S."""
    for sig, wait_s in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_budgeted(command: list[str], budget_s: float, emit, label: str) -> tuple[str, float]:
    """Run `command` in a process group of its own within `budget_s` seconds; if it fails or
    runs out of time, `emit` its last STDERR_LINES stderr lines. Return its outcome and
    seconds."""
    started = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as err:
        proc = subprocess.Popen(command, cwd=ROOT, stderr=err, start_new_session=True)
        try:
            code = proc.wait(timeout=budget_s)
            outcome = "ok" if code == 0 else f"failed (exit {code})"
        except subprocess.TimeoutExpired:
            _stop(proc)
            outcome = f"stopped at its {budget_s:g} s budget"
        seconds = time.perf_counter() - started
        if outcome != "ok":
            err.seek(0)
            tail = deque(err, maxlen=STDERR_LINES)
            emit(f"{label} {outcome} after {seconds:.0f} s; its last {len(tail)} stderr lines:")
            for line in tail:
                emit(f"  | {line.rstrip()}")
    return outcome, seconds


def spawn(name: str, smoke: bool, results: Path, tmp: Path, budget_s: float) -> tuple[str, float]:
    """Stage `name` in a process of its own (`run_budgeted`)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--stage", name,
               "--results", str(results), "--tmp", str(tmp), *(["--cpu-smoke"] if smoke else [])]
    return run_budgeted(command, budget_s, _writer(results), f"stage {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="toy sizes on the CPU")
    parser.add_argument("--results", type=Path,
                        default=Path(os.environ.get("GPU_CHECK_RESULTS",
                                                    ROOT / "outputs" / "gpu_check.txt")),
                        help="the file every stage appends its lines to")
    parser.add_argument("--stages", default=",".join(BUDGETS_S), help="which, in this order")
    parser.add_argument("--stage", help=argparse.SUPPRESS)  # one stage, in this process
    parser.add_argument("--tmp", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage:
        run_stage(args.stage, args.cpu_smoke, args.results, args.tmp)
        return
    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        raise SystemExit("gpu_check.sh: no CUDA device here; run it on a GPU node, or with "
                         "--cpu-smoke for a run at toy sizes on the CPU")
    stages = args.stages.split(",")
    unknown = sorted(set(stages) - set(BUDGETS_S))
    if unknown:
        raise SystemExit(f"gpu_check.py: no stage {unknown}; the stages are {list(BUDGETS_S)}")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    emit = _writer(args.results)
    # One Inductor cache for every stage: a graph one compiles, the next reads.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(
        Path(tempfile.gettempdir()) / "repgeom-gpu-check-inductor"))
    started = time.perf_counter()
    mode = "cpu smoke" if args.cpu_smoke else "GPU"
    emit(f"repgeom GPU check ({mode}) {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
         f"stages {', '.join(stages)}, results {args.results}")
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        for name in stages:
            budget = SMOKE_BUDGET_S if args.cpu_smoke else BUDGETS_S[name]
            outcome, seconds = spawn(name, args.cpu_smoke, args.results, Path(tmp), budget)
            outcomes.append(f"{name} {seconds:.0f} s" + ("" if outcome == "ok" else " FAILED"))
    emit(f"total: {time.perf_counter() - started:.0f} s ({'; '.join(outcomes)})")


if __name__ == "__main__":
    main()
