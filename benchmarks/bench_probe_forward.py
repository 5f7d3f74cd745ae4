"""The probe's forward pass over its state probe set: whole windows against causal windows cut
after their last sampled position.

On the quickstart's probe set (gpt_tiny, the bundled sample's validation windows, the default
probe config), three ways of running the windows through the model, alternating in one process
so that all see the same machine load (minimum over repetitions):

- whole: every window whole, in probe-set order (the probe before `GPT.capture_positions`);
- cut per batch: micro-batches in probe-set order, each cut at its longest window's last
  sampled position;
- sorted and cut: windows in order of their last sampled position, each micro-batch cut at its
  longest (`GPT.capture_positions`, what the probe does).

It also prints the largest relative difference of the state metrics' table between whole and
sorted-and-cut windows (float rounding only: another batch shape, another summation order).

    python benchmarks/bench_probe_forward.py [--ckpt last.ckpt]
    python benchmarks/bench_probe_forward.py --positions-per-window 4 --n-states 3244
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from repgeom.models.gpt import GPT, GPTConfig
from repgeom.probes.core.measure import measure_states
from repgeom.probes.core.sampling import probe_set
from repgeom.probes.core.spec import ProbeSpec
from repgeom.probes.core.targets import gpt_captures

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


def build(ckpt: str | None, positions_per_window: int | None, n_states: int | None):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["experiment=quickstart", "output_dir=/tmp"])
    datamodule = instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    options = {k: v for k, v in cfg.model.items() if k != "_target_"}
    model = GPT(GPTConfig(**options, vocab_size=datamodule.vocab.size, causal=True))
    if ckpt:
        state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
        model.load_state_dict({k[6:]: v for k, v in state.items() if k.startswith("model.")})
    spec = ProbeSpec(**{k: v for k, v in cfg.probe.items() if k in ProbeSpec.__dataclass_fields__})
    if positions_per_window is not None:
        spec.positions_per_window = positions_per_window
    if n_states is not None:
        spec.n_states = n_states
    probes = probe_set(datamodule.validation_windows(), spec)
    return model.eval(), probes, spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", help="a quickstart checkpoint (default: the untrained model)")
    parser.add_argument("--positions-per-window", type=int)
    parser.add_argument("--n-states", type=int,
                        help="e.g. 3244 with 4 positions: the sample's 811 windows at the default")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    model, probes, spec = build(args.ckpt, args.positions_per_window, args.n_states)
    windows, positions, size = probes.windows, probes.positions, spec.batch_size

    def whole():
        for _ in gpt_captures(model, windows, positions, batch_size=size, attention=False):
            pass

    def cut_per_batch():
        for start in range(0, len(windows), size):
            part = slice(start, start + size)
            model.capture_positions(windows[part], positions[part], batch_size=size)

    def sorted_and_cut():
        model.capture_positions(windows, positions, batch_size=size)

    ways = {"whole": whole, "cut per batch": cut_per_batch, "sorted and cut": sorted_and_cut}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    with torch.no_grad():
        sorted_and_cut()  # warm-up
        for _ in range(args.repeats):
            for name, run in ways.items():
                start = time.perf_counter()
                run()
                seconds[name].append(time.perf_counter() - start)
        settings = spec.probe_settings()
        reference = measure_states(
            gpt_captures(model, windows, positions, batch_size=size, attention=False), settings
        )
        cut = measure_states([model.capture_positions(windows, positions, batch_size=size)],
                             settings)
    worst = max(
        abs(a["value"] - b["value"]) / abs(a["value"])
        for a, b in zip(reference.rows, cut.rows, strict=True)
        if a["value"] != 0
    )
    described = probes.describe()
    tokens = len(windows) * windows.shape[1]
    print(f"torch threads {torch.get_num_threads()}; {described['n_windows']} windows of "
          f"{described['window']} at {described['positions_per_window']} positions "
          f"({described['n_states']} states), batches of {size}; min of {args.repeats}")
    base = min(seconds["whole"])
    for name, values in seconds.items():
        print(f"{name:15s} {min(values):6.2f} s  ({base / min(values):.2f}x)")
    last = torch.where(positions, torch.arange(windows.shape[1]), -1).amax(dim=1)
    print(f"tokens run: whole {tokens:,}; cut {int((last + 1).sum()):,}")
    print(f"state metrics, whole vs sorted and cut: {len(reference.rows)} numbers, largest "
          f"relative difference {worst:.1e}")


if __name__ == "__main__":
    main()
