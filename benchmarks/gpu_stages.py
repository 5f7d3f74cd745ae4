"""The stages of `gpu_check.py`, each run in a process of its own (see that file for the order).

Each function takes the stage's options (`gpu_check.FULL` or `gpu_check.SMOKE`), a scratch
folder and `emit`, which writes one line to the results file and the console as soon as it is
known; a stage that dies has already written every line before the failure.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
Emit = Callable[[str], None]
NO_CHECKPOINTS = ["~callbacks.checkpoint", "~callbacks.last_checkpoint",
                  "++trainer.enable_checkpointing=false"]
"""A timing run writes no checkpoint (a gpt_small one is ~460 MB, written at each validation)."""


def device(opts: dict, tmp: Path, emit: Emit) -> None:
    """torch, CUDA, the device, a matmul's TFLOP/s, and the compile of gpt_tiny's training loss."""
    cuda = opts["device"] == "cuda"
    name = torch.cuda.get_device_name() if cuda else "cpu (smoke)"
    emit(f"device: {name}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
         f"python {sys.version.split()[0]}")
    n, dtype = (8192, torch.bfloat16) if cuda else (256, torch.float32)
    a = torch.randn(n, n, device=opts["device"], dtype=dtype)
    b = torch.randn(n, n, device=opts["device"], dtype=dtype)
    for _ in range(3):
        a @ b  # warm-up: cuBLAS's choice of kernel
    if cuda:
        torch.cuda.synchronize()
    started, repeats = time.perf_counter(), 20
    for _ in range(repeats):
        a @ b
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    emit(f"matmul {n}^3 {str(dtype).removeprefix('torch.')}: "
         f"{2 * n**3 * repeats / seconds / 1e12:.1f} TFLOP/s")
    from repgeom.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=207, block_size=opts["compile_block"], n_layer=2,
                          n_head=2, n_embd=64)).to(opts["device"])
    x = torch.randint(0, 207, (4, opts["compile_block"]), device=opts["device"])
    loss_fn = torch.compile(lambda idx: model(idx).float().logsumexp(-1).mean(),
                            backend=opts["compile_backend"], dynamic=False)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)
    started = time.perf_counter()
    with autocast:
        loss = loss_fn(x)
    loss.backward()
    if cuda:
        torch.cuda.synchronize()
    emit(f"compile (gpt_tiny 2 x 64, forward and backward, backend {opts['compile_backend']}, "
         f"Inductor cache {os.environ.get('TORCHINDUCTOR_CACHE_DIR', 'default')}): "
         f"{time.perf_counter() - started:.1f} s")


def _throughput(opts: dict, tmp: Path, extra: list[str]) -> dict:
    out = tmp / "throughput.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_train_throughput.py"),
               *opts["throughput"], *extra, "--json", str(out)]
    proc = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"bench_train_throughput.py exited with {proc.returncode}")
    return json.loads(out.read_text())


def training(opts: dict, tmp: Path, emit: Emit) -> None:
    """Today's path, the new default and the plain loop (`bench_train_throughput.py`)."""
    r = _throughput(opts, tmp, ["--knee", ""])
    f = r["flops_per_token"]

    def path(name: str) -> str:
        p = r["paths"][name]
        mfu = f"{p['mfu']:.3f}" if p["mfu"] is not None else "n/a"
        mem = f"{p['peak_gib']:.2f} GiB" if p["peak_gib"] is not None else "n/a"
        return (f"{name} {p['tokens_per_s']:,.0f} tokens/s ({p['ms_per_step']:.2f} ms/step, "
                f"MFU {mfu}, peak {mem})")

    paths = r["paths"]
    emit(f"training: {r['model']} {r['precision']}, batch {r['batch']} x {r['block']}, N "
         f"{f['n_params']:,}, {f['total']:,} FLOPs/token (6N + 12 L d T): "
         + "; ".join(path(p) for p in ("today", "new default", "plain loop")))
    emit(f"training ratios: new default / today "
         f"{paths['new default']['tokens_per_s'] / paths['today']['tokens_per_s']:.2f}x, "
         f"Lightning (new default) / plain loop "
         f"{paths['new default']['tokens_per_s'] / paths['plain loop']['tokens_per_s']:.3f}")


def knee(opts: dict, tmp: Path, emit: Emit) -> None:
    """The new default at each micro-batch of `opts["knee"]`, one process and one line each
    (each is a compile of its own: a stage that runs out of time keeps the sizes it measured)."""
    measured, block = [], None
    for size in opts["knee"].split(","):
        r = _throughput(opts, tmp, ["--rounds", "0", "--knee", size])
        k, block = r["knee"][0], r["block"]
        measured.append(k)
        emit(f"micro-batch {k['batch']} x {block} (new default): out of memory"
             if k["tokens_per_s"] is None else
             f"micro-batch {k['batch']} x {block} (new default): {k['tokens_per_s']:,.0f} "
             f"tokens/s" + (f", peak {k['peak_gib']:.2f} GiB" if k["peak_gib"] is not None
                           else ""))
    fitting = [k for k in measured if k["tokens_per_s"] is not None]
    best = max((k["tokens_per_s"] for k in fitting), default=0.0)
    knee_batch = next((k["batch"] for k in fitting if k["tokens_per_s"] >= 0.95 * best), None)
    emit(f"micro-batch knee (new default, windows of {block}): {knee_batch} (the smallest "
         f"within 5% of the best, {best:,.0f} tokens/s)")


def _train_seconds(overrides: list[str], run_dir: Path):
    """The wall seconds of `train(cfg)` with `overrides`, and what it returned."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from repgeom.train import train

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, *NO_CHECKPOINTS, f"output_dir={run_dir}",
                                          "logger=csv", "~callbacks.progress_bar"])
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # its console; only the check's lines
        result = train(cfg)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    # (the offload's snapshots, probes/.../weights.ckpt, are the probes' input, not checkpoints)
    written = sorted(p.name for p in (run_dir / "checkpoints").glob("*.ckpt"))
    if written:
        raise RuntimeError(f"a timing run wrote checkpoints ({written}): they are not timed here")
    return seconds, result


def band(opts: dict, tmp: Path, emit: Emit) -> None:
    """Two runs of today's path give a band; the new default's run against their mean."""
    from repgeom.train import read_csv_metrics

    steps = opts["band_steps"]
    base = [*opts["share_overrides"], f"trainer.max_steps={steps}", "probe=none"]
    _train_seconds([*base], tmp / "new")
    for i in (1, 2):
        _train_seconds([*base, "recipe=off"], tmp / f"today_{i}")
    losses = [read_csv_metrics(tmp / name).dropna(subset=["train/loss"]).set_index("step")[
        "train/loss"] for name in ("today_1", "today_2", "new")]
    spread = (losses[0] - losses[1]).abs()
    new = (losses[2] - (losses[0] + losses[1]) / 2).abs()
    within = "within the band" if new.max() <= spread.max() else "OUTSIDE the band"
    emit(f"loss band ({opts['model']}, {steps} steps on the sample, {len(spread)} logged "
         f"steps): two runs of today differ by at most {spread.max():.2e} (mean "
         f"{spread.mean():.2e}); the new default differs from their mean by at most "
         f"{new.max():.2e} (mean {new.mean():.2e}): {within}")


def _wait_for_worker(run_dir: Path, limit_s: float) -> float | None:
    """Seconds until the offload worker says it is done, None if not within `limit_s`."""
    log = run_dir / "probes" / "worker.log"
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        text = log.read_text() if log.is_file() else ""
        if "is done" in text or "Error" in text:
            return time.monotonic() - started
        time.sleep(0.2)
    return None


def share(opts: dict, tmp: Path, emit: Emit) -> None:
    """The training probe's share of the wall time at gpt_small's default schedule."""
    from omegaconf import OmegaConf
    from train_timing import StepTimer

    from repgeom.probes.core.spec import ProbeCallbackConf
    from repgeom.probes.run.schedule import probe_schedule

    steps, every = opts["share_steps"], opts["share_probe_every"]
    probes = probe_schedule(steps, every_n_steps=every, log_spaced_until=0, n_log_spaced=0)
    schedule = [f"probe.every_n_steps={every}", "probe.n_log_spaced=0",
                "probe.plot_every_n_probes=0", *opts["share_probe"]]
    device_ = [] if opts["device"] == "cpu" else ["probe.worker.device=cuda"]
    base = [*opts["share_overrides"], f"trainer.max_steps={steps}"]
    timer = ["+callbacks.step_timer._target_=train_timing.StepTimer",
             f"+callbacks.step_timer.warmup={opts['timer_warmup']}"]
    warm = [*opts["share_overrides"], f"trainer.max_steps={opts['timer_warmup'] + 1}"]
    _train_seconds([*warm, "probe=none"], tmp / "warm")  # compilation, kernels, caches, data
    none, result = _train_seconds([*base, "probe=none", *timer], tmp / "none")
    step_timer = next(c for c in result.trainer.callbacks if isinstance(c, StepTimer))
    inproc, _ = _train_seconds([*base, *schedule], tmp / "inproc")
    offloaded, _ = _train_seconds([*base, *schedule, *device_, "probe.offload=worker",
                                   "probe.worker.wait=false"], tmp / "offload")
    waited = _wait_for_worker(tmp / "offload", opts["worker_wait_s"])
    n = len(probes)
    step_s = step_timer.ms_per_step / 1000
    per_in, per_off = max(0.0, (inproc - none) / n), max(0.0, (offloaded - none) / n)
    trainer = OmegaConf.load(ROOT / "conf" / "trainer" / "default.yaml")
    default_steps = int(trainer.max_steps)
    conf = ProbeCallbackConf()
    n_default = len(probe_schedule(default_steps, every_n_steps=conf.every_n_steps,
                                   log_spaced_until=conf.log_spaced_until,
                                   n_log_spaced=conf.n_log_spaced, max_probes=conf.max_probes))

    def percent(per_probe: float) -> float:
        spent = n_default * per_probe
        return 100 * spent / (default_steps * step_s + spent)

    worker = (f"the worker done {waited:.0f} s after the run" if waited is not None else
              f"the worker not done {opts['worker_wait_s']} s after the run")
    emit(f"probe share ({opts['model']} new default, default schedule: {n_default} probes in "
         f"{default_steps} steps): in-process {percent(per_in):.1f}% ({per_in:.2f} s per probe), "
         f"offloaded {percent(per_off):.1f}% ({per_off:.2f} s per probe; {worker}), step "
         f"{step_s * 1000:.1f} ms ({step_timer.tokens_per_s:,.0f} tokens/s)")


def knn(opts: dict, tmp: Path, emit: Emit) -> None:
    """Exact kNN: repgeom's GPU search against FAISS on the CPU (its first queries only)."""
    import faiss

    from repgeom.metrics.neighbors import faiss_has_gpu, nearest_neighbors

    n, d = opts["knn"]
    k, queries = 10, min(n, 2000)
    X = torch.randn(n, d, generator=torch.Generator().manual_seed(0))
    started = time.perf_counter()
    # k + 1: each row finds itself first. Only the first `queries` rows: all 100k take ~80 s
    # on 16 CPU threads, which the check's budget cannot hold
    _, cpu_idx = faiss.knn(X[:queries].numpy(), X.numpy(), k + 1)
    cpu_s = time.perf_counter() - started
    cpu = (f"FAISS CPU {cpu_s:.2f} s for {queries} queries ({torch.get_num_threads()} threads, "
           f"~{cpu_s * n / queries:.0f} s for all)")
    if not torch.cuda.is_available():
        emit(f"knn exact {n} x {d}, k={k}: {cpu}; no GPU here")
        return
    backend = "faiss.knn_gpu" if faiss_has_gpu() else "torch matmul+topk (no GPU build of FAISS)"
    Xg = X.cuda()
    nearest_neighbors(Xg[:1000], k)  # warm-up: kernels, handles
    torch.cuda.synchronize()
    started = time.perf_counter()
    _, gpu_idx = nearest_neighbors(Xg, k)
    torch.cuda.synchronize()
    gpu_s = time.perf_counter() - started
    head = gpu_idx[:queries].cpu().numpy()
    same = sum(len(set(a) & set(b[1:])) for a, b in zip(head, cpu_idx, strict=True))
    emit(f"knn exact {n} x {d}, k={k}: repgeom on the GPU ({backend}) {gpu_s:.2f} s for all, "
         f"{cpu}; neighbours shared with FAISS CPU {100 * same / (queries * k):.2f}%")


def hub(opts: dict, tmp: Path, emit: Emit) -> None:
    """One revision of a tiny Pythia from the tests' hub stand-in through probe.py."""
    import pandas as pd
    from hub_server import FakeHub
    from tiny_hf_models import build_tiny_hf

    folder = tmp / "pythia"
    build_tiny_hf("gpt_neox", folder)
    text = tmp / "text.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8"), encoding="utf-8")
    out = tmp / "trajectory"
    with FakeHub("check/pythia-tiny", {"step1000": folder}) as fake:
        env = {**os.environ, "HF_ENDPOINT": fake.url, "HF_HOME": str(tmp / "hf_home"),
               "WANDB_MODE": "offline"}
        env.pop("HF_HUB_OFFLINE", None)
        env.pop("TRANSFORMERS_OFFLINE", None)
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "probe.py", "hf=check/pythia-tiny", "hf_revisions=[step1000]",
             f"text_file={text}", "window=64", "n_states=512", "settings.state_batch_size=256",
             "plot_metrics=[]", f"device={opts['device']}", f"hydra.run.dir={out}"],
            cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - started
    costs = pd.read_csv(out / "probes" / "timings.csv").iloc[0]
    names = ("download_s", "load_s", "forward_s", "metrics_s")
    parts = ", ".join(f"{c.removesuffix('_s')} {costs[c]:.2f}" for c in names)
    emit(f"hub trajectory (tiny Pythia, 1 revision): {sum(costs[c] for c in names):.2f} s per "
         f"revision ({parts}); the probe.py process {wall:.1f} s")


STAGES = {"device": device, "training": training, "knee": knee, "band": band, "share": share,
          "knn": knn, "hub": hub}
