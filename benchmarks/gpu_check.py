"""The numbers of `gpu_check.sh` (run that script, not this file): one line per check.

1. ``training:`` gpt_small at batch 16 x 512 through three paths side by side in one process
   (`bench_train_throughput.py`): today's path (`recipe=off`), the new default (the GPU
   recipe, conf/recipe/default.yaml) and a plain PyTorch loop with the same recipe; tokens/s,
   ms/step, MFU (its FLOP count written out) and peak memory each; then ``training ratios:``
   and ``micro-batch knee:`` (the new default at 16, 32, 64 and 128 windows of 512);
2. ``loss band:`` two 300-step runs of today's path on the bundled sample differ by a band; the
   new default's loss over the same steps against today's, within it or not (issue 34, item 3);
3. ``probe share:`` the training probe's share of the wall time at gpt_small's default schedule
   (trainer.max_steps of conf/trainer/default.yaml, the probe schedule of conf/probe/default.yaml),
   in-process and offloaded (``probe.offload=worker``, the worker on the same GPU), at the new
   default's speed: three short runs of the same length and the same probe steps (none,
   in-process, offloaded) give each probe's extra wall seconds, which the default schedule's
   probe count and step time turn into a share;
4. ``knn exact:`` exact k nearest neighbours on 100k x 768: repgeom's GPU search (``faiss.knn_gpu``,
   or torch matmul+topk where FAISS has no GPU build) against FAISS on the CPU, and the share
   of neighbours both find;
5. ``hub trajectory:`` one revision of a tiny Pythia (GPT-NeoX) from the tests' hub stand-in
   through ``probe.py hf=... hf_revisions=[...]``, and its seconds.

One definition of tokens/s in every line (`benchmarks/train_timing.py`): the timed steps' tokens
over the seconds between a device sync before the first timed step and one after the last,
warm-up steps (compilation) untimed. The probe-share line's step time is the no-probe run's,
timed so (`train_timing.StepTimer` in train.py's own loop), not its wall time over its steps.

``--cpu-smoke`` runs the same code at toy sizes on the CPU (a test runs it, so the script is
known to run before a GPU is lent); its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))  # train_timing, for train.py's runs here

FULL = {
    "model": "gpt_small", "batch": 16,
    "throughput": ["--model", "gpt_small", "--batch-size", "16", "--steps", "20", "--rounds", "3",
                   "--warmup", "3", "--knee", "16,32,64,128", "--knee-steps", "10"],
    "share_steps": 300, "share_probe_every": 100, "timer_warmup": 10,
    "share_overrides": ["model=gpt_small", "data=sample", "data.batch_size=16",
                        "trainer.limit_val_batches=0", "trainer.val_check_interval=100000"],
    "share_probe": [],
    "knn": (100_000, 768), "device": "cuda",
}
SMOKE = {
    "model": "gpt_tiny", "batch": 2, "throughput": ["--cpu-smoke"],
    "share_steps": 6, "share_probe_every": 3, "timer_warmup": 1,
    "share_overrides": ["model=gpt_tiny", "model.n_layer=2", "model.n_head=2", "model.n_embd=32",
                        "model.block_size=32", "data=sample", "data.batch_size=4",
                        "data.val_windows=16", "trainer=cpu", "trainer.limit_val_batches=0",
                        "trainer.val_check_interval=100000", "trainer.log_every_n_steps=1"],
    "share_probe": ["probe.n_states=256", "probe.settings.state_batch_size=128",
                    "probe.settings.max_order=16"],
    "knn": (2_000, 64), "device": "cpu",
}


def training(opts: dict, tmp: Path) -> list[str]:
    """Three lines from `bench_train_throughput.py`'s numbers (its --json)."""
    out = tmp / "throughput.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_train_throughput.py"),
               *opts["throughput"], "--json", str(out)]
    subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    r = json.loads(out.read_text())
    f = r["flops_per_token"]

    def path(name: str) -> str:
        p = r["paths"][name]
        mfu = f"{p['mfu']:.3f}" if p["mfu"] is not None else "n/a"
        mem = f"{p['peak_gib']:.2f} GiB" if p["peak_gib"] is not None else "n/a"
        return (f"{name} {p['tokens_per_s']:,.0f} tokens/s ({p['ms_per_step']:.2f} ms/step, "
                f"MFU {mfu}, peak {mem})")

    paths = r["paths"]
    knee = "; ".join(
        f"{k['batch']}: out of memory" if k["tokens_per_s"] is None else
        f"{k['batch']}: {k['tokens_per_s']:,.0f} tokens/s"
        + (f" ({k['peak_gib']:.2f} GiB)" if k["peak_gib"] is not None else "")
        for k in r["knee"])
    return [
        f"training: {r['model']} {r['precision']}, batch {r['batch']} x {r['block']}, N "
        f"{f['n_params']:,}, {f['total']:,} FLOPs/token (6N + 12 L d T): "
        + "; ".join(path(p) for p in ("today", "new default", "plain loop")),
        f"training ratios: new default / today "
        f"{paths['new default']['tokens_per_s'] / paths['today']['tokens_per_s']:.2f}x, "
        f"Lightning (new default) / plain loop "
        f"{paths['new default']['tokens_per_s'] / paths['plain loop']['tokens_per_s']:.3f}",
        f"micro-batch knee (new default, windows of {r['block']}): {knee}; knee "
        f"{r['knee_batch']}",
    ]


def _train_seconds(overrides: list[str], run_dir: Path):
    """The wall seconds of `train(cfg)` with `overrides`, and what it returned."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from repgeom.train import train

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, f"output_dir={run_dir}", "logger=csv",
                                          "~callbacks.progress_bar"])
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # its console; only the check's lines
        result = train(cfg)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - started, result


def _wait_for_worker(run_dir: Path, limit_s: float = 300) -> None:
    log = run_dir / "probes" / "worker.log"
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if log.is_file() and ("is done" in log.read_text() or "Error" in log.read_text()):
            return
        time.sleep(0.2)


def probe_share(opts: dict, tmp: Path) -> list[str]:
    """The loss band line and the probe share line (the same 300-step runs)."""
    from omegaconf import OmegaConf
    from train_timing import StepTimer

    from repgeom.probes.core.spec import ProbeCallbackConf
    from repgeom.probes.run.callback import probe_schedule
    from repgeom.train import read_csv_metrics

    steps, every = opts["share_steps"], opts["share_probe_every"]
    probes = probe_schedule(steps, every_n_steps=every, log_spaced_until=0, n_log_spaced=0)
    length = [f"trainer.max_steps={steps}"]
    schedule = [f"probe.every_n_steps={every}", "probe.n_log_spaced=0",
                "probe.plot_every_n_probes=0", *opts["share_probe"]]
    device = [] if opts["device"] == "cpu" else ["probe.worker.device=cuda"]
    base = [*opts["share_overrides"], *length]
    timer = ["+callbacks.step_timer._target_=train_timing.StepTimer",
             f"+callbacks.step_timer.warmup={opts['timer_warmup']}"]
    _train_seconds([*base, "probe=none"], tmp / "warm")  # compilation, kernels, caches, data
    none, result = _train_seconds([*base, "probe=none", *timer], tmp / "none")
    step_timer = next(c for c in result.trainer.callbacks if isinstance(c, StepTimer))
    inproc, _ = _train_seconds([*base, *schedule], tmp / "inproc")
    offloaded, _ = _train_seconds([*base, *schedule, *device, "probe.offload=worker",
                                   "probe.worker.wait=false"], tmp / "offload")
    _wait_for_worker(tmp / "offload")
    for i in (1, 2):  # today's path twice: the band two runs of it differ by
        _train_seconds([*base, "probe=none", "recipe=off"], tmp / f"today_{i}")
    losses = [read_csv_metrics(tmp / name).dropna(subset=["train/loss"]).set_index("step")[
        "train/loss"] for name in ("today_1", "today_2", "none")]
    band = (losses[0] - losses[1]).abs()
    new = (losses[2] - (losses[0] + losses[1]) / 2).abs()
    within = "within the band" if new.max() <= band.max() else "OUTSIDE the band"
    loss_line = (f"loss band ({opts['model']}, {steps} steps on the sample, {len(band)} logged "
                 f"steps): two runs of today differ by at most {band.max():.2e} (mean "
                 f"{band.mean():.2e}); the new default differs from their mean by at most "
                 f"{new.max():.2e} (mean {new.mean():.2e}): {within}")
    n = len(probes)
    step_s = step_timer.ms_per_step / 1000
    per_in, per_off = max(0.0, (inproc - none) / n), max(0.0, (offloaded - none) / n)
    trainer = OmegaConf.load(ROOT / "conf" / "trainer" / "default.yaml")
    default_steps = int(trainer.max_steps)
    conf = ProbeCallbackConf()
    n_default = len(probe_schedule(default_steps, every_n_steps=conf.every_n_steps,
                                   log_spaced_until=conf.log_spaced_until,
                                   n_log_spaced=conf.n_log_spaced, max_probes=conf.max_probes))

    def share(per_probe: float) -> float:
        spent = n_default * per_probe
        return 100 * spent / (default_steps * step_s + spent)

    return [loss_line, (
        f"probe share ({opts['model']} new default, default schedule: {n_default} probes in "
        f"{default_steps} steps): in-process {share(per_in):.1f}% ({per_in:.2f} s per probe), "
        f"offloaded {share(per_off):.1f}% ({per_off:.2f} s per probe), step "
        f"{step_s * 1000:.1f} ms ({step_timer.tokens_per_s:,.0f} tokens/s)")]


def knn(opts: dict) -> str:
    import faiss

    from repgeom.metrics.neighbors import faiss_has_gpu, nearest_neighbors

    n, d = opts["knn"]
    k = 10
    X = torch.randn(n, d, generator=torch.Generator().manual_seed(0))
    started = time.perf_counter()
    _, cpu_idx = faiss.knn(X.numpy(), X.numpy(), k + 1)  # k + 1: each row finds itself first
    cpu_s = time.perf_counter() - started
    cpu = f"FAISS CPU {cpu_s:.2f} s ({torch.get_num_threads()} threads)"
    if not torch.cuda.is_available():
        return f"knn exact {n} x {d}, k={k}: {cpu}; no GPU here"
    # repgeom's own GPU search: faiss.knn_gpu with a GPU build of FAISS, else torch matmul+topk
    backend = "faiss.knn_gpu" if faiss_has_gpu() else "torch matmul+topk (no GPU build of FAISS)"
    Xg = X.cuda()
    nearest_neighbors(Xg[:1000], k)  # warm-up: kernels, handles
    torch.cuda.synchronize()
    started = time.perf_counter()
    _, gpu_idx = nearest_neighbors(Xg, k)
    torch.cuda.synchronize()
    gpu_s = time.perf_counter() - started
    # the same neighbours? share of the first 1000 rows' k neighbours that FAISS CPU also finds
    head = gpu_idx[:1000].cpu().numpy()
    pairs = zip(head, cpu_idx[:1000], strict=True)
    same = sum(len(set(a) & set(b[1:])) for a, b in pairs) / (1000 * k)
    return (f"knn exact {n} x {d}, k={k}: repgeom on the GPU ({backend}) {gpu_s:.2f} s, {cpu} "
            f"({cpu_s / gpu_s:.0f}x); neighbours shared with FAISS CPU {100 * same:.2f}%")


def hub_trajectory(opts: dict, tmp: Path) -> str:
    import pandas as pd
    from hub_server import FakeHub
    from tiny_hf_models import build_tiny_hf

    folder = tmp / "pythia"
    build_tiny_hf("gpt_neox", folder)
    text = tmp / "text.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8"), encoding="utf-8")
    out = tmp / "trajectory"
    with FakeHub("check/pythia-tiny", {"step1000": folder}) as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp / "hf_home"),
               "WANDB_MODE": "offline"}
        env.pop("HF_HUB_OFFLINE", None)
        env.pop("TRANSFORMERS_OFFLINE", None)
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "probe.py", "hf=check/pythia-tiny", "hf_revisions=[step1000]",
             f"text_file={text}", "window=64", "n_states=512", "settings.state_batch_size=256",
             "plot_metrics=[]", f"device={opts['device']}", f"hydra.run.dir={out}"],
            cwd=ROOT, env=env, check=True, capture_output=True)
        wall = time.perf_counter() - started
    costs = pd.read_csv(out / "probes" / "timings.csv").iloc[0]
    parts = ", ".join(f"{c.removesuffix('_s')} {costs[c]:.2f}"
                      for c in ("download_s", "load_s", "forward_s", "metrics_s"))
    per = sum(costs[c] for c in ("download_s", "load_s", "forward_s", "metrics_s"))
    return (f"hub trajectory (tiny Pythia, 1 revision): {per:.2f} s per revision ({parts}); "
            f"the probe.py process {wall:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="toy sizes on the CPU")
    args = parser.parse_args()
    opts = SMOKE if args.cpu_smoke else FULL
    if not args.cpu_smoke and not torch.cuda.is_available():
        raise SystemExit("gpu_check.sh: no CUDA device here; run it on a GPU node, or with "
                         "--cpu-smoke for a run at toy sizes on the CPU")
    import faiss

    started = time.perf_counter()
    where = torch.cuda.get_device_name() if opts["device"] == "cuda" else "cpu (smoke)"
    print(f"repgeom GPU check: device {where}, torch {torch.__version__}, faiss "
          f"{faiss.__version__}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        tmp = Path(tmp)
        for check in (lambda: training(opts, tmp), lambda: probe_share(opts, tmp),
                      lambda: [knn(opts)], lambda: [hub_trajectory(opts, tmp)]):
            for line in check():
                print(line, flush=True)
    print(f"total: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
