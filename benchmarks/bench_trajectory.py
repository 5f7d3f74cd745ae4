"""A hub model's whole training history through `probe.py hf=... hf_revisions=all`: wall time,
per-revision costs, peak disk of the working folder, resident memory, and whether prefetching
hides the downloads.

A tiny Pythia-architecture model (GPT-NeoX, partial rotary; 4 layers of 256) published as N
step revisions (Pythia's schedule: step0, 1, 2, 4 ... 512, then every 1,000) by the tests' hub
stand-in on 127.0.0.1, throttled to a slow network. Run from the repository root::

    python benchmarks/bench_trajectory.py --revisions 154 --mbps 8
    python benchmarks/bench_trajectory.py --revisions 40              # quicker

Prints: the wall time; per revision the median seconds downloading, loading, in the forward
passes and in the metrics (``probes/timings.csv``); the bytes downloaded; the peak size of the
working folder against one revision's files; the resident memory after revisions 5 and 50 (or
the last) and its slope after the first three revisions (least squares, MB per revision); and
the wall time against the probe compute alone (download hidden by prefetch when the ratio is
near 1).

``--faults`` runs the same trajectory twice over revisions of distinct weights, one of them a
branch with its config only: once on a polite hub, once on a hub that injects the real hub's
faults at random moments (429 with ``Retry-After`` on the API and on files, 500s on the listing
and on ``model_info``, connections cut mid-file; seeded) and whose probe is killed with SIGKILL
once mid-run and started again with the same command. It prints, against the issue's targets:
every revision with weights probed; the two tables equal (rtol 1e-6); the bytes downloaded
again (faulty run's bytes sent over the polite run's, at most 10%); loop / compute (at most
1.3); the working folder's peak (at most two revisions); the memory slope::

    python benchmarks/bench_trajectory.py --faults --revisions 30
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hub_server import FakeHub, Fault, Request  # noqa: E402
from tiny_hf_models import build_tiny_hf  # noqa: E402

PYTHIA_STEPS = [0, *(2**i for i in range(10)), *range(1000, 143001, 1000)]
"""Pythia's 154 checkpoints (Biderman et al. 2023)."""


def build_model(folder: Path) -> int:
    """A GPT-NeoX with Pythia's layout, small enough for a CPU; returns its size in bytes."""
    from transformers import AutoModel, GPTNeoXConfig

    build_tiny_hf("gpt_neox", folder)  # the tokenizer, then a larger model over it
    tiny = GPTNeoXConfig.from_pretrained(folder)
    config = GPTNeoXConfig(vocab_size=tiny.vocab_size, hidden_size=256, num_hidden_layers=4,
                           num_attention_heads=4, intermediate_size=1024, rotary_pct=0.25,
                           max_position_embeddings=256, bos_token_id=tiny.bos_token_id,
                           eos_token_id=tiny.eos_token_id)
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(folder)
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def folder_bytes(folder: Path) -> int:
    """Bytes under `folder`, read while the probe deletes and writes files there."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:  # deleted meanwhile
                pass
    return total


def rss_slope(rss_mb) -> float:
    """MB per revision of the resident memory after the first three revisions (least squares)."""
    import numpy as np

    late = np.asarray(rss_mb, dtype=float)[3:]
    return float(np.polyfit(np.arange(len(late)), late, 1)[0]) if len(late) > 1 else float("nan")


def distinct_revisions(model: Path, root: Path, names: list[str]) -> dict[str, Path]:
    """One folder per revision, each with its own weights (the model's, every tensor shifted by
    a step-dependent amount), the config and tokenizer copied: revisions as a real trajectory
    has them, so no two share a weights file."""
    from safetensors.torch import load_file, save_file

    state = load_file(model / "model.safetensors")
    folders = {}
    for i, name in enumerate(names):
        folder = root / name
        folder.mkdir(parents=True)
        for path in model.iterdir():
            if path.is_file() and path.suffix != ".safetensors":
                shutil.copy(path, folder / path.name)
        save_file({k: v + 1e-3 * i for k, v in state.items()}, folder / "model.safetensors",
                  metadata={"format": "pt"})
        folders[name] = folder
    return folders


class RandomFaults:
    """The hub's faults at random moments (`FakeHub.hook`), seeded: what the real hub does."""

    def __init__(self, seed: int, file_size: int) -> None:
        self.random = random.Random(seed)
        self.file_size = file_size
        self.counts: dict[str, int] = {}

    def __call__(self, request: Request) -> Fault | None:
        draw = self.random.random()
        fault = None
        if request.kind in ("refs", "info") and draw < 0.15:
            fault = (Fault(on=request.kind, status=500) if draw < 0.10 else
                     Fault(on=request.kind, status=429, retry_after="1"))
        elif request.kind == "file" and request.method == "GET" and (
                request.filename or "").endswith(".safetensors") and draw < 0.25:
            if draw < 0.15:  # cut somewhere in the file
                cut = int(self.random.uniform(0.1, 0.9) * self.file_size)
                fault = Fault(on="file", cut_after=cut)
            elif draw < 0.20:
                fault = Fault(on="file", status=429, retry_after="1")
            else:
                fault = Fault(on="file", status=503)
        if fault is not None:
            where = "a file" if request.kind == "file" else request.kind
            kind = ("cut mid-file" if fault.cut_after is not None else
                    f"HTTP {fault.status} on {where}")
            self.counts[kind] = self.counts.get(kind, 0) + 1
        return fault


def probe_command(text: Path, out: Path, args) -> list[str]:
    return [sys.executable, "probe.py", "hf=bench/pythia-tiny", "hf_revisions=all",
            f"text_file={text}", "window=128", f"n_states={args.n_states}",
            f"metrics={args.metrics}", "plot_metrics=[anisotropy,twonn]",
            "settings.distributions=false", "settings.state_batch_size=256",
            "settings.attention=false", "device=cpu", f"hydra.run.dir={out}"]


def faults_run(args) -> None:
    """The trajectory on a polite hub and on a faulty one with a kill -9 (module docstring)."""
    import numpy as np

    from repgeom.probes.core import table

    steps = PYTHIA_STEPS[:: max(1, len(PYTHIA_STEPS) // args.revisions)][: args.revisions]
    steps[-1] = PYTHIA_STEPS[-1]
    names = [f"step{s}" for s in steps]
    config_only = names[len(names) // 3]  # a branch published without weights
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        build_model(tmp / "model")
        folders = distinct_revisions(tmp / "model", tmp / "revisions", names)
        (folders[config_only] / "model.safetensors").unlink()
        size = (tmp / "model" / "model.safetensors").stat().st_size
        text = tmp / "text.txt"
        text.write_text((ROOT / "README.md").read_text(encoding="utf-8"), encoding="utf-8")
        results = {}
        for label in ("polite", "faulty"):
            out, home = tmp / label, tmp / f"hf_home_{label}"
            hook = RandomFaults(args.seed, size) if label == "faulty" else None
            peak, running = [0], [True]

            def watch(out=out, peak=peak, running=running) -> None:
                while running[0]:
                    peak[0] = max(peak[0], folder_bytes(out / "work"))
                    time.sleep(0.05)

            with FakeHub("bench/pythia-tiny", folders, bytes_per_second=args.mbps * 1e6,
                         hook=hook) as hub:
                env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(home),
                       "WANDB_MODE": "offline"}
                env.pop("HF_HUB_OFFLINE", None)
                watcher = threading.Thread(target=watch, daemon=True)
                watcher.start()
                started = time.perf_counter()
                log = open(tmp / f"{label}.log", "w")
                command = probe_command(text, out, args)
                if label == "faulty":  # killed with SIGKILL once, mid-run, then rerun
                    kill_at = random.Random(args.seed).randint(3, max(4, len(names) // 2))
                    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log,
                                               stderr=log, start_new_session=True)
                    while process.poll() is None:
                        try:
                            if table.read_table(out)["step"].nunique() >= kill_at:
                                break
                        except (FileNotFoundError, ValueError, OSError):
                            pass
                        time.sleep(0.2)
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=log, stderr=log)
                wall = time.perf_counter() - started
                running[0] = False
                watcher.join()
                log.close()
            costs = pd.read_csv(out / "probes" / "timings.csv")
            results[label] = dict(out=out, wall=wall, sent=hub.bytes_sent, peak=peak[0],
                                  costs=costs, faults=dict(hook.counts) if hook else {},
                                  log=(tmp / f"{label}.log").read_text())
        polite, faulty = results["polite"], results["faulty"]
        a, b = (table.read_table(r["out"]) for r in (polite, faulty))
        keys = [c for c in ("revision", "step", "step_b", "layer", "layer_b", "head", "metric")
                if c in a.columns]
        a, b = (t.sort_values(keys).reset_index(drop=True) for t in (a, b))
        same_rows = a[keys].equals(b[keys])
        close = same_rows and np.allclose(a["value"], b["value"], rtol=1e-6, atol=0,
                                          equal_nan=True)
        with_weights = set(names) - {config_only}
        skipped = json.loads((faulty["out"] / "probes" / "skipped.json").read_text())
        again = (faulty["sent"] - polite["sent"]) / faulty["sent"]
        costs = faulty["costs"]
        compute = costs[["load_s", "forward_s", "metrics_s"]].sum(axis=1).sum()
        loop = compute + costs["wait_s"].sum()
        waits = [line for line in faulty["log"].splitlines() if line.startswith("waiting ")]
        print(f"{len(names)} revisions of a {size / 1e6:.1f} MB model (distinct weights; "
              f"{config_only} config only), hub at {args.mbps} MB/s, seed {args.seed}, "
              f"{torch.get_num_threads()} threads")
        print(f"faults served: {faulty['faults']}; the console said why it waited "
              f"{len(waits)} times, e.g. {waits[0] if waits else '-'}; one kill -9 mid-run")
        every = sorted(set(b["revision"]) & with_weights) == sorted(with_weights)
        print(f"every revision with weights probed: {every}"
              f" ({b['revision'].nunique()} of {len(with_weights)} with weights); skipped: "
              f"{ {k: v['reason'][:60] for k, v in skipped.items()} }")
        print(f"table equal to the polite run's (rtol 1e-6): {close} ({len(b)} rows)")
        print(f"bytes downloaded again: {again * 100:.1f}% ({faulty['sent'] / 1e6:.1f} MB sent, "
              f"{polite['sent'] / 1e6:.1f} MB on the polite hub; target <= 10%)")
        print(f"loop / compute: {loop / compute:.2f} (faulty, both processes; polite: "
              + "{:.2f}".format((polite['costs']['wait_s'].sum() + polite['costs'][
                  ['load_s', 'forward_s', 'metrics_s']].sum(axis=1).sum())
                  / polite['costs'][['load_s', 'forward_s', 'metrics_s']].sum(axis=1).sum())
              + "; target <= 1.3)")
        print(f"working folder peak: {faulty['peak'] / size:.2f} revisions faulty, "
              f"{polite['peak'] / size:.2f} polite (target <= 2)")
        print(f"resident memory slope after revision 3: {rss_slope(polite['costs']['rss_mb']):+.2f}"
              f" MB/revision (polite, one process; target < 0.5); wall {polite['wall']:.0f} s "
              f"polite, {faulty['wall']:.0f} s faulty")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--revisions", type=int, default=40, help="at most 154 (default: 40)")
    parser.add_argument("--mbps", type=float, default=8.0,
                        help="the hub's throughput in MB/s (default: %(default)s)")
    parser.add_argument("--n-states", type=int, default=512)
    parser.add_argument("--metrics", default="[anisotropy,intrinsic_dimension,linear_cka]",
                        help="probe.py's metrics= (default: %(default)s)")
    parser.add_argument("--faults", action="store_true",
                        help="a polite and a faulty hub (with a kill -9), compared")
    parser.add_argument("--seed", type=int, default=0, help="the faults' draws (--faults)")
    args = parser.parse_args()
    if args.faults:
        faults_run(args)
        return
    steps = PYTHIA_STEPS[:: max(1, len(PYTHIA_STEPS) // args.revisions)][: args.revisions]
    steps[-1] = PYTHIA_STEPS[-1]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        size = build_model(tmp / "model")
        text = tmp / "text.txt"
        text.write_text((ROOT / "README.md").read_text(encoding="utf-8"), encoding="utf-8")
        revisions = {f"step{s}": tmp / "model" for s in steps}
        out, work = tmp / "out", tmp / "out" / "work"
        peak = [0]
        running = [True]

        def watch() -> None:
            while running[0]:
                peak[0] = max(peak[0], folder_bytes(work))
                time.sleep(0.05)

        with FakeHub("bench/pythia-tiny", revisions, bytes_per_second=args.mbps * 1e6) as hub:
            env = {**os.environ, "HF_ENDPOINT": hub.url,
                   "HF_HOME": str(tmp / "hf_home"), "WANDB_MODE": "offline"}
            env.pop("HF_HUB_OFFLINE", None)
            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "probe.py", "hf=bench/pythia-tiny", "hf_revisions=all",
                 f"text_file={text}", "window=128", f"n_states={args.n_states}",
                 f"metrics={args.metrics}", "plot_metrics=[anisotropy,twonn]",
                 "settings.distributions=false", "settings.state_batch_size=256",
                 "settings.attention=false", "device=cpu", f"hydra.run.dir={out}"],
                cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
            wall = time.perf_counter() - started
            running[0] = False
            watcher.join()
        costs = pd.read_csv(out / "probes" / "timings.csv")  # in the order probed
        compute = costs[["load_s", "forward_s", "metrics_s"]].sum(axis=1)
        print(f"{len(costs)} revisions of a {size / 1e6:.1f} MB model, hub at {args.mbps} MB/s, "
              f"{torch.get_num_threads()} threads")
        print(f"wall {wall:.1f} s (the process, start-up and figures included); per revision "
              "median: " + ", ".join(f"{c.removesuffix('_s')} {costs[c].median():.2f} s"
                                     for c in ("download_s", "wait_s", "load_s", "forward_s",
                                               "metrics_s")))
        print(f"downloaded {costs['download_bytes'].sum() / 1e6:.0f} MB; working folder peak "
              f"{peak[0] / 1e6:.1f} MB = {peak[0] / size:.2f} revisions; left at the end: "
              f"{folder_bytes(work) / 1e6:.1f} MB")
        at = costs["rss_mb"].to_numpy()
        late = min(49, len(at) - 1)
        print(f"resident memory after revision 5: {at[4]:.0f} MB, after revision {late + 1}: "
              f"{at[late]:.0f} MB ({(at[late] / at[4] - 1) * 100:+.1f}%); slope after revision "
              f"3: {rss_slope(at):+.2f} MB/revision")
        loop = costs["wait_s"].sum() + compute.sum()
        print(f"loop {loop:.1f} s = compute {compute.sum():.1f} s + waiting for downloads "
              f"{costs['wait_s'].sum():.1f} s (downloads took {costs['download_s'].sum():.1f} s "
              f"in all): loop / compute = {loop / compute.sum():.2f}")
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
