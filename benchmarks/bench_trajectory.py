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
the last); and the wall time against the probe compute alone (download hidden by prefetch when
the ratio is near 1).
"""

from __future__ import annotations

import argparse
import os
import shutil
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

from hub_server import FakeHub  # noqa: E402
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--revisions", type=int, default=40, help="at most 154 (default: 40)")
    parser.add_argument("--mbps", type=float, default=8.0,
                        help="the hub's throughput in MB/s (default: %(default)s)")
    parser.add_argument("--n-states", type=int, default=512)
    parser.add_argument("--metrics", default="[anisotropy,intrinsic_dimension,linear_cka]",
                        help="probe.py's metrics= (default: %(default)s)")
    args = parser.parse_args()
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
              f"{at[late]:.0f} MB ({(at[late] / at[4] - 1) * 100:+.1f}%)")
        loop = costs["wait_s"].sum() + compute.sum()
        print(f"loop {loop:.1f} s = compute {compute.sum():.1f} s + waiting for downloads "
              f"{costs['wait_s'].sum():.1f} s (downloads took {costs['download_s'].sum():.1f} s "
              f"in all): loop / compute = {loop / compute.sum():.2f}")
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
