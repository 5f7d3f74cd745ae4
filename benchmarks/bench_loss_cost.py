"""What the loss rows, alpha-ReQ and the per-token values add to one training probe.

On the quickstart's probe set (gpt_tiny, the bundled sample's validation windows, the default
probe config), one whole probe (`probe_gpt`: forward passes and every default metric, the
lm_loss/bpc rows and alpha-ReQ included) against the parts this issue added, timed alone on
the same states: the LM head on the captured final states (`lm_loss.gpt_state_loss`),
alpha-ReQ on the probe's batches, and the per-token local IDs (`settings.per_token`: one more
whole probe, the difference). Minimum over repetitions, alternating, in one process.

    python benchmarks/bench_loss_cost.py [--ckpt last.ckpt] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch
from bench_probe_forward import build

from repgeom import metrics
from repgeom.probes.core.prediction import lm_loss
from repgeom.probes.core.targets import probe_gpt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model, probes, spec = build(args.ckpt, None, None)
    settings = spec.probe_settings()
    with_tokens = replace(settings, per_token=True)
    times: dict[str, list[float]] = {"probe": [], "probe, per_token": [], "lm head": [],
                                     "alpha_req": []}
    with torch.no_grad():
        capture = model.capture_positions(probes.windows, probes.positions,
                                          batch_size=spec.batch_size)
    final = capture.final_norm[0]
    split = metrics.batch_indices(final.shape[0], settings.state_batch_size, settings.seed)
    for _ in range(args.repeats):
        for name, run in (
            ("probe", lambda: probe_gpt(model, probes, batch_size=spec.batch_size,
                                        settings=settings)),
            ("probe, per_token", lambda: probe_gpt(model, probes, batch_size=spec.batch_size,
                                                   settings=with_tokens)),
            ("lm head", lambda: lm_loss.gpt_state_loss(model, capture, probes.windows,
                                                       probes.positions)),
            ("alpha_req", lambda: [metrics.alpha_req(final[i]) for i in split]),
        ):
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    best = {k: min(v) for k, v in times.items()}
    n_layers = len(capture.hidden) + 1
    print(f"[gpt_tiny, {probes.n_states} states, {n_layers} layers, CPU threads "
          f"{torch.get_num_threads()}] one probe {best['probe']:.2f} s; with per_token "
          f"{best['probe, per_token']:.2f} s (+{best['probe, per_token'] - best['probe']:.2f} s)")
    print(f"  lm head on the captured final states: {1e3 * best['lm head']:.1f} ms "
          f"({100 * best['lm head'] / best['probe']:.2f}% of the probe)")
    print(f"  alpha-ReQ, one layer's batches: {1e3 * best['alpha_req']:.1f} ms; x {n_layers} "
          f"layers = {100 * n_layers * best['alpha_req'] / best['probe']:.2f}% of the probe")


if __name__ == "__main__":
    main()
