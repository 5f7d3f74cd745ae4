"""Timings of repgeom.metrics (issue 3). Prints one line per measurement.

    python benchmarks/bench_metrics.py            # everything below (~5 min on 2 CPU cores)
    python benchmarks/bench_metrics.py --quick    # small sizes, a smoke run
    python benchmarks/bench_metrics.py --dadapy   # also DADApy's compute_id_2NN (~3 min more)

On a CUDA machine the kNN-based rows are repeated on the GPU.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import faiss
import numpy as np
import torch

from repgeom.metrics import (
    activation_distribution,
    anisotropy,
    attention_entropy,
    drift,
    faiss_has_gpu,
    intrinsic_dimension,
    mean_cosine_similarity,
    qk_alignment,
    twonn,
)


def timed(fn, *args, **kwargs):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t, out


def states(n, d, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    # low-dimensional structure plus noise and a common offset, like hidden states
    X = torch.randn(n, 32, generator=g) @ torch.randn(32, d, generator=g)
    X += 0.3 * torch.randn(n, d, generator=g) + 5.0
    return X.to(device)


def report(name, seconds, extra=""):
    print(f"{name:<58s} {seconds:9.2f} s  {extra}", flush=True)


def bench_knn(n, d, device, dadapy):
    X = states(n, d, device=device)
    tag = f"{n // 1000}k x {d} ({device})"
    if device == "cpu":
        Xc = (X - X.mean(0)).contiguous().numpy()
        t_faiss, _ = timed(faiss.knn, Xc, Xc, 3)
        report(f"faiss.knn exact, k=3, {tag}", t_faiss)
    else:
        t_faiss = None
    t_twonn, r = timed(twonn, X, batch_size=n)
    ratio = f"ratio to faiss.knn {t_twonn / t_faiss:.2f}" if t_faiss else ""
    report(f"twonn one batch, {tag}", t_twonn, f"d={r.dimension:.2f} {ratio}")
    if dadapy and device == "cpu":
        import importlib.util
        import types

        spec = importlib.util.find_spec("dadapy")
        pkg = types.ModuleType("dadapy")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules.setdefault("dadapy", pkg)
        from dadapy.id_estimation import IdEstimation

        Xn = X.numpy().astype(np.float64)
        t_d, ref = timed(lambda: IdEstimation(coordinates=Xn, maxk=3, verbose=False,
                                              n_jobs=os.cpu_count()).compute_id_2NN())
        report(f"dadapy compute_id_2NN, {tag}", t_d, f"d={ref[0]:.2f}")


def bench_paper_protocol(X, device, repeats):
    """TwoNN with batches of 4096, against FAISS's exact search alone on the same batches.

    Median of `repeats` runs: single runs of this ~5 s job scatter by +-15% on a shared CPU.
    """
    tag = f"{X.shape[0] // 1000}k x {X.shape[1]} ({device})"
    runs = [timed(twonn, X, batch_size=4096) for _ in range(repeats)]
    t, r = float(np.median([t for t, _ in runs])), runs[0][1]
    report(f"twonn paper protocol (batches of 4096), {tag}", t,
           f"median of {repeats}, {r.n_batches} batches, "
           f"d={r.dimension:.2f}+-{r.dimension_std:.2f}")
    if device == "cpu":
        Xc = (X - X.mean(0)).contiguous()
        batches = [b.contiguous().numpy() for b in torch.tensor_split(Xc, r.n_batches)]
        t_search = float(np.median(
            [timed(lambda: [faiss.knn(b, b, 3) for b in batches])[0] for _ in range(repeats)]
        ))
        report(f"faiss.knn alone on the same {r.n_batches} batches, {tag}", t_search,
               f"median of {repeats}, twonn/search {t / t_search:.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dadapy", action="store_true")
    args = ap.parse_args()
    big, d = (10_000, 128) if args.quick else (100_000, 768)
    sizes = [big] if args.quick else [16_384, 65_536, 100_000]
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPU threads, "
          f"torch {torch.__version__}, faiss {faiss.__version__}, "
          f"cuda={torch.cuda.is_available()}, faiss_gpu={faiss_has_gpu()}")
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        warm = states(600, 64, device=device)  # first-call costs (BLAS/LAPACK init) off the clock
        anisotropy(warm, method="covariance"), anisotropy(warm, method="svd")
        intrinsic_dimension(warm, max_order=8)
        for n in sizes:
            bench_knn(n, d, device, args.dadapy and n == big)
        X = states(big, d, device=device)
        bench_paper_protocol(X, device, repeats=1 if args.quick else 5)
        for method in ("covariance", "svd"):
            t, a = timed(anisotropy, X, method=method)
            report(f"anisotropy {method}, {big // 1000}k x {d} ({device})", t, f"A={a:.4f}")

        # one probe of gpt_small-sized states: 13 hidden-state layers x 8192 x 512, and the
        # 12 attention layers of 16 windows x 8 heads x 512 x 512
        L, n_tok, width, B, H, T = (3, 2048, 128, 4, 4, 512) if args.quick else (
            13, 8192, 512, 16, 8, 512)
        layers = [states(n_tok, width, seed=i, device=device) for i in range(L)]
        t_geom = t_dist = t_att = 0.0
        for X in layers:
            t_geom += timed(anisotropy, X)[0] + timed(mean_cosine_similarity, X)[0]
            t_geom += timed(drift, X)[0] + timed(intrinsic_dimension, X, max_order=64)[0]
            t_dist += timed(activation_distribution, X)[0]
        g = torch.Generator().manual_seed(0)
        for _ in range(L - 1):
            q = torch.randn(B, H, T, width // H, generator=g).to(device)
            k = torch.randn(B, H, T, width // H, generator=g).to(device)
            mask = torch.ones(T, T, dtype=torch.bool, device=device).tril()
            probs = (q @ k.transpose(-1, -2) / (width // H) ** 0.5).masked_fill(~mask, -1e9)
            probs = probs.softmax(-1)
            t_att += timed(attention_entropy, probs, causal=True)[0]
            t_att += timed(qk_alignment, q, k, causal=True)[0]
        tag = f"{L} x {n_tok} x {width} ({device})"
        report(f"probe: anisotropy+cosine+drift+ID(TwoNN,GRIDE64), {tag}", t_geom)
        report(f"probe: attention entropy + Q/K, {L - 1} x ({B},{H},{T},{T})", t_att)
        report(f"probe: activation_distribution (off in training), {tag}", t_dist)
        report(f"probe total ({device})", t_geom + t_att + t_dist)


if __name__ == "__main__":
    main()
