"""What probing costs: seconds per probe and its share of a run's wall time.

1. The gpt_tiny quickstart (`experiment=quickstart`, default probe config), trained for real:
   the callback's own clock (capture, metrics, table, W&B, plots) against the fit's wall time.
2. gpt_small at the default probe config (13 layers + final norm x 8,192 states x 512 dims, from
   2,048 windows): seconds per probe and per training step on this machine, and from them the
   share for the default schedule of a 20,000-step run (for a GPU; on a CPU skip it).

    python benchmarks/bench_probe_cost.py [--skip-quickstart] [--skip-gpt-small] [--device cuda]
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
from repgeom.probes.run.callback import ProbeCallback, probe_schedule
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


def gpt_small_share(device: torch.device) -> None:
    cfg = _compose(["model=gpt_small", "data=sample", "output_dir=/tmp"])
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
    args = parser.parse_args()
    print(f"torch threads: {torch.get_num_threads()}")
    if not args.skip_quickstart:
        quickstart_share()
    if not args.skip_gpt_small:
        gpt_small_share(torch.device(args.device))


if __name__ == "__main__":
    main()
