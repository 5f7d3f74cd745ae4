"""How far the probe set's numbers are from a large decorrelated reference, per metric and layer.

On a trained checkpoint, each candidate probe set (windows x positions per window, batches of
4096 states, mean over batches) is compared with a reference of 50,000 states from 5,000
windows (10 random positions each, 12 batches). The bundled sample's validation split holds
only 810 windows of 256 characters, so the reference windows come from the training split;
the default set is measured on both splits, which separates the split from the protocol.

    python benchmarks/bench_probe_protocol.py CKPT [--metrics twonn anisotropy ...]

Prints, per metric and candidate, the value per block, the reference, and the largest bias
over blocks in units of the candidate's own std over batches and in percent.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
import torch

from repgeom.data.datamodule import Enwik8DataModule
from repgeom.data.tokens import choose_windows
from repgeom.models.lightning_module import CharLM
from repgeom.probes.core.measure import ProbeSettings, measure_states
from repgeom.probes.core.sampling import choose_positions, windows_needed
from repgeom.probes.core.targets import gpt_captures

METRICS = ("twonn", "gride_k16", "anisotropy", "mean_cosine", "drift_ratio")


def split_windows(datamodule: Enwik8DataModule, split: str, n: int, seed: int) -> torch.Tensor:
    """`n` aligned windows of `split`, drawn as the probe draws them (`choose_windows`)."""
    tokens = datamodule.tokens[split]
    T = datamodule.block_size
    slots = choose_windows(len(tokens) // T, n, seed)
    if len(slots) < n:
        raise ValueError(f"the {split} split holds {len(slots)} windows, {n} asked for")
    return torch.from_numpy(tokens[slots[:, None] * T + np.arange(T)].astype(np.int64))


def probe_table(model, windows, per_window: int | None, seed: int) -> pd.DataFrame:
    positions = choose_positions(torch.ones(windows.shape, dtype=torch.bool), per_window, seed)
    settings = ProbeSettings(attention=False, seed=seed)
    captures = gpt_captures(model, windows, positions, batch_size=64, attention=False)
    with torch.no_grad():
        out = measure_states(captures, settings)
    frame = pd.DataFrame(out.rows)
    return frame.loc[frame["layer_name"].str.startswith("block")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ckpt")
    parser.add_argument("--metrics", nargs="+", default=list(METRICS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(0)
    charlm = CharLM.load_from_checkpoint(args.ckpt, map_location="cpu", weights_only=True).eval()
    model = charlm.model
    T = model.config.block_size
    dm = Enwik8DataModule(source="sample", block_size=T, batch_size=16, num_workers=0)
    dm.prepare_data()
    dm.setup("fit")
    step = torch.load(args.ckpt, weights_only=False)["global_step"]
    print(f"checkpoint: {args.ckpt} (step {step}); torch threads {torch.get_num_threads()}")

    def windows_for(split: str, n_states: int, per_window: int | None, seed: int):
        return split_windows(dm, split, windows_needed(n_states, per_window, T), seed)

    candidates = {
        # name: (split, n_states, positions per window)
        "before: 4096 states, 16 whole windows": ("valid", 4096, None),
        "8192: 32 whole windows": ("valid", 8192, None),
        "8192: 128 windows x 64": ("valid", 8192, 64),
        "8192: 512 windows x 16": ("valid", 8192, 16),
        "8192: 512 windows x 16, train split": ("train", 8192, 16),
        "sample fallback: 811 windows x 11": ("valid", 8921, 11),
        "default: 2048 windows x 4 (train split)": ("train", 8192, 4),
    }
    start = time.perf_counter()
    reference = probe_table(model, split_windows(dm, "train", 5000, args.seed + 1), 10, args.seed)
    print(f"reference: 50,000 states from 5,000 train windows x 10 positions, 12 batches "
          f"({time.perf_counter() - start:.0f} s)")
    tables = {}
    for name, (split, n_states, per_window) in candidates.items():
        start = time.perf_counter()
        tables[name] = probe_table(model, windows_for(split, n_states, per_window, args.seed),
                                   per_window, args.seed)
        print(f"  {name}: {time.perf_counter() - start:.1f} s")
    for metric in args.metrics:
        ref = reference.loc[reference["metric"] == metric].set_index("layer")
        print(f"\n{metric}: reference per block "
              + " / ".join(f"{v:.3f}" for v in ref["value"]) + " (std over batches "
              + " / ".join(f"{v:.3f}" for v in ref["std"]) + ")")
        for name, frame in tables.items():
            rows = frame.loc[frame["metric"] == metric].set_index("layer")
            bias = rows["value"] - ref["value"]
            in_std = (bias.abs() / rows["std"]).max()
            pct = (100 * bias / ref["value"]).abs().max()
            values = " / ".join(f"{v:.3f}" for v in rows["value"])
            stds = " / ".join("-" if np.isnan(v) else f"{v:.3f}" for v in rows["std"])
            print(f"  {name:45s} {values}  (std {stds}); max |bias| {pct:5.1f}%"
                  + ("" if np.isnan(in_std) else f" = {in_std:.1f} std"))


if __name__ == "__main__":
    main()
