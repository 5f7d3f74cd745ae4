"""What probing costs: seconds per probe and its share of a run's wall time.

1. The gpt_tiny quickstart (`experiment=quickstart`, default probe config), trained for real:
   the callback's own clock (capture, metrics, table, W&B, plots) against the fit's wall time.
2. gpt_small at the default probe config (13 layers + final norm x 8,192 states x 512 dims, from
   2,048 windows): seconds per probe and per training step on this machine, and from them the
   share for the default schedule of a 20,000-step run (for a GPU; on a CPU skip it).

``--probe-only`` prints one line instead: `time_one_probe`, one in-process probe of the model at
its default probe config, split into the capture forward and the rest (the metrics, on the
probe's device), for the GPU check (`gpu_check.py` may import `time_one_probe` or run this).

    python benchmarks/bench_probe_cost.py [--skip-quickstart] [--skip-gpt-small] [--device cuda]
    python benchmarks/bench_probe_cost.py --probe-only --device cuda [--model gpt_small]
    python benchmarks/bench_probe_cost.py --probe-only --device cpu --model gpt_tiny  # a smoke
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from repgeom.models.gpt import GPT
from repgeom.probes.core.sampling import ProbeSet, choose_positions, windows_needed
from repgeom.probes.run.callback import ProbeCallback
from repgeom.probes.run.schedule import probe_schedule
from repgeom.train import train

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train", overrides=overrides)


def quickstart_share() -> None:
    with tempfile.TemporaryDirectory() as out:
        cfg = _compose(
            ["experiment=quickstart", f"output_dir={out}", "logger=csv", "~callbacks.progress_bar"]
        )
        start = time.perf_counter()
        result = train(cfg)
        wall = time.perf_counter() - start
    probe = next(cb for cb in result.trainer.callbacks if isinstance(cb, ProbeCallback))
    n = len(probe.done)
    print(
        f"[quickstart gpt_tiny, CPU] {result.trainer.global_step} steps, "
        f"train() wall {wall:.1f} s; "
        f"{n} probes took {probe.seconds:.1f} s ({probe.seconds / n:.2f} s per probe incl. plots) "
        f"= {100 * probe.seconds / wall:.1f}% of the wall time"
    )


def _probed_model(model_name: str, device: torch.device):
    """The untrained model on `device`, its composed config and a `ProbeCallback` at the
    default probe config holding a probe set of random windows."""
    cfg = _compose([f"model={model_name}", "data=sample", "output_dir=/tmp"])
    model_config = instantiate(cfg.model, vocab_size=207, causal=True)
    model = GPT(model_config).to(device)
    block = model_config.block_size
    probe_cfg = {k: v for k, v in cfg.probe.items() if k != "_target_"}
    callback = ProbeCallback(**probe_cfg)
    n_windows = windows_needed(callback.spec.n_states, callback.spec.positions_per_window, block)
    windows = torch.randint(0, 205, (n_windows, block), generator=torch.Generator().manual_seed(0))
    positions = choose_positions(torch.ones(windows.shape, dtype=torch.bool),
                                 callback.spec.positions_per_window, seed=0)
    callback.probes = ProbeSet(windows, positions, callback.spec.attention_windows)
    return model, cfg, callback


def _synced_seconds(fn, device: torch.device) -> tuple[float, object]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, out


def time_one_probe(model_name: str = "gpt_small", device: str | torch.device = "cuda",
                   repeats: int = 2) -> dict[str, float]:
    """Seconds of one in-process training probe of `model_name` (untrained, random windows) at
    the default probe config on `device`: the whole probe (`ProbeCallback.run`, the minimum of
    `repeats` after a warm-up), its capture forward alone (`GPT.capture_positions` of the
    state windows, timed apart, the minimum likewise) and the rest (``probe - forward``: the
    metrics, attention and Q/K). CUDA work is synchronised before each clock reads."""
    device = torch.device(device)
    model, _, callback = _probed_model(model_name, device)
    probes = callback.probes
    callback.run(model)  # warm-up: CUDA context, kernels, FAISS
    probe = min(_synced_seconds(lambda: callback.run(model), device)[0] for _ in range(repeats))
    with torch.no_grad():
        model.eval()
        forward = min(_synced_seconds(lambda: model.capture_positions(
            probes.windows, probes.positions, batch_size=callback.spec.batch_size), device)[0]
            for _ in range(repeats))
    return {"probe_s": probe, "forward_s": forward, "rest_s": probe - forward,
            "n_states": probes.n_states, "n_windows": int(probes.windows.shape[0])}


def gpt_small_share(device: torch.device) -> None:
    model, cfg, callback = _probed_model("gpt_small", device)
    model_config = model.config
    block = model_config.block_size
    n_windows = int(callback.probes.windows.shape[0])
    callback.run(model)  # warm-up
    start = time.perf_counter()
    output = callback.run(model)
    probe_seconds = time.perf_counter() - start

    batch = torch.randint(0, 205, (cfg.data.batch_size, block + 1), device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    steps = 3
    for i in range(steps + 1):
        if i == 1:
            start = time.perf_counter()
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    if device.type == "cuda":
        torch.cuda.synchronize()
    step_seconds = (time.perf_counter() - start) / steps
    max_steps = cfg.trainer.max_steps
    schedule = probe_schedule(max_steps, **callback.schedule_options)
    share = (
        len(schedule) * probe_seconds / (len(schedule) * probe_seconds + max_steps * step_seconds)
    )
    print(
        f"[gpt_small, {device}] one probe "
        f"({callback.probes.n_states} states from {n_windows} windows of {block}, "
        f"{model_config.n_layer + 1} layers, {len(output.rows)} numbers): {probe_seconds:.1f} s; "
        f"one training step (batch {cfg.data.batch_size} x {block}): {step_seconds:.2f} s; "
        f"{len(schedule)} probes over {max_steps} steps = {100 * share:.2f}% of the wall time"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-quickstart", action="store_true")
    parser.add_argument("--skip-gpt-small", action="store_true",
                        help="on a CPU one gpt_small probe (2048 windows of 512) takes minutes")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--probe-only", action="store_true",
                        help="time one probe of --model (time_one_probe) and print one line")
    parser.add_argument("--model", default="gpt_small", help="conf/model/<name>.yaml")
    args = parser.parse_args()
    print(f"torch threads: {torch.get_num_threads()}")
    if args.probe_only:
        t = time_one_probe(args.model, args.device)
        print(f"probe: {args.model} at the default probe config on {args.device} "
              f"({t['n_states']} states from {t['n_windows']} windows): {t['probe_s']:.2f} s per "
              f"probe (capture forward {t['forward_s']:.2f} s, metrics, attention and Q/K "
              f"{t['rest_s']:.2f} s)")
        return
    if not args.skip_quickstart:
        quickstart_share()
    if not args.skip_gpt_small:
        gpt_small_share(torch.device(args.device))


if __name__ == "__main__":
    main()
