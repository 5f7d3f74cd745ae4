"""The metrics of one training probe at a model's default probe config, this tree against an
earlier commit's: seconds per probe, per entry, and the table.

The states are made, not captured (on a CPU the capture forward of gpt_small's 2,048 windows of
512 takes minutes; `bench_probe_cost.py` times the whole probe where a GPU is at hand): L + 2
layers of ``n_states`` float32 rows (gpt_small: 14 x 8,192 x 512), Gaussian with a decaying
spectrum (condition number 1e3) under a common offset 3x the spread that grows with depth, as
hidden states have. Both versions run `measure_states` (every training-default state metric
in batches of ``state_batch_size``, as the callback does) on the same tensors, alternating
after one warm-up round each; the minimum over the repetitions is reported. The earlier commit's
``src/repgeom`` is extracted (``git archive``) and imported as ``repgeom_before``
(`bench_probe_speed.import_commit`). Then each catalogue entry alone, this tree's and the
earlier one's, on one layer's states (seconds per layer of two batches), and the two tables
value by value (largest relative difference).

    python benchmarks/bench_probe_metrics.py --before 2235cd6
    python benchmarks/bench_probe_metrics.py --before 2235cd6 --model gpt_tiny --device cuda
    python benchmarks/bench_probe_metrics.py --before 2235cd6 --metrics effective_rank rankme
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from repgeom.probes.core.spec import ProbeSpec

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = str(ROOT / "conf")


def default_config(model: str) -> tuple[ProbeSpec, int, int]:
    """The training probe's spec for `model`, its number of probed layers and its width."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[f"model={model}", "output_dir=/tmp"])
    spec = ProbeSpec(**{k: v for k, v in cfg.probe.items() if k in ProbeSpec.__dataclass_fields__})
    return spec, cfg.model.n_layer + 2, cfg.model.n_embd  # embedding, blocks, final norm


def made_states(n_layers: int, n: int, d: int, device: str) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    spread = torch.logspace(0, -3, d)  # singular values down to 1e-3 of the largest
    states = []
    for layer in range(n_layers):
        offset = 3.0 * (1 + layer / n_layers) * torch.randn(d, generator=generator)
        X = torch.randn(n, d, generator=generator) * spread @ torch.linalg.qr(
            torch.randn(d, d, generator=generator))[0] + offset
        states.append(X.float().to(device))
    return states


def measure_of(name: str):
    module = importlib.import_module(f"{name}.probes.core.measure")
    capture = importlib.import_module(f"{name}.models.capture")
    return module, capture


def one_probe(package: str, states: list[torch.Tensor], options: dict) -> tuple[float, float,
                                                                                list]:
    """Wall and CPU seconds of `package`'s `measure_states` on `states`, and its rows."""
    measure, capture = measure_of(package)
    settings = measure.ProbeSettings(**options)
    captures = [capture.Capture(hidden=[X[None] for X in states[:-1]], final_norm=states[-1][None])]
    sync(states[0].device)
    start, start_cpu = time.perf_counter(), time.process_time()
    out = measure.measure_states(captures, settings)
    sync(states[0].device)
    return time.perf_counter() - start, time.process_time() - start_cpu, out.rows


def per_entry(package: str, X: torch.Tensor, options: dict, repeats: int) -> dict[str, float]:
    """Seconds of each training-default state entry on one layer (its two batches)."""
    measure, _ = measure_of(package)
    catalogue = importlib.import_module(f"{package}.probes.core.catalogue")
    spectrum = importlib.import_module(f"{package}.metrics._spectrum")
    metrics = importlib.import_module(f"{package}.metrics")
    settings = measure.ProbeSettings(**options)
    split = metrics.batch_indices(X.shape[0], settings.state_batch_size, settings.seed)
    batches = [X[index.to(X.device)] for index in split]
    seconds = {}
    for entry in catalogue.select(settings).states:
        best = math.inf
        for _ in range(repeats + 1):  # the first is a warm-up
            with spectrum.shared_spectrum():  # alone: nothing shared with another entry
                sync(X.device)
                start = time.perf_counter()
                if entry.batched:
                    measure.per_batch(entry, batches)
                else:
                    entry.fn(X, settings)
                sync(X.device)
                best = min(best, time.perf_counter() - start)
        seconds[entry.name] = best
    return seconds


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def largest_difference(before: list[dict], now: list[dict]) -> tuple[float, int]:
    if [(r["layer"], r["metric"]) for r in before] != [(r["layer"], r["metric"]) for r in now]:
        raise SystemExit("the two versions write different rows")
    worst, n = 0.0, 0
    for a, b in zip(before, now, strict=True):
        for column in ("value", "std"):
            x, y = a[column], b[column]
            if math.isnan(x) and math.isnan(y):
                continue
            n += 1
            worst = max(worst, abs(x - y) / max(abs(x), 1e-12))
    return worst, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="commit of the version to compare with")
    parser.add_argument("--model", default="gpt_small", help="conf/model/<name>.yaml")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--metrics", nargs="*",
                        help="catalogue entries to run (default: the training probe's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_probe_speed import BEFORE, import_commit

    spec, n_layers, width = default_config(args.model)
    options = dataclasses.asdict(spec.probe_settings())  # the training probe's settings
    if args.metrics:
        options["metrics"] = tuple(args.metrics)
    states = made_states(n_layers, spec.n_states, width, args.device)
    with tempfile.TemporaryDirectory() as folder:
        import_commit(args.before, Path(folder))
        packages = {f"before ({args.before[:10]})": BEFORE, "now": "repgeom"}
        seconds = {name: [] for name in packages}
        rows = {}
        for package in packages.values():  # warm-up: first calls, FAISS, LAPACK workspaces
            one_probe(package, states, options)
        for _ in range(args.repeats):
            for name, package in packages.items():
                wall, cpu, rows[name] = one_probe(package, states, options)
                seconds[name].append((wall, cpu))
        entries = {name: per_entry(package, states[n_layers // 2], options, args.repeats)
                   for name, package in packages.items()}
    print(f"{args.model} default probe, metrics {', '.join(options['metrics'])}: {n_layers} "
          f"layers x {spec.n_states} states "
          f"x {width} on {args.device}, batches of {options['state_batch_size']}; torch threads "
          f"{torch.get_num_threads()}; min of {args.repeats}, alternating")
    for name, clocks in seconds.items():
        listed = ", ".join(f"{wall:.2f}" for wall, _ in clocks)
        print(f"{name:22s} {min(w for w, _ in clocks):7.2f} s wall, "
              f"{min(c for _, c in clocks):7.2f} s CPU per probe (walls: {listed})")
    (old, now) = ([min(clock) for clock in zip(*clocks, strict=True)]
                  for clocks in seconds.values())
    print(f"per probe: wall {now[0] / old[0]:.2f}x, CPU {now[1] / old[1]:.2f}x")
    print(f"{'entry (one layer, s)':22s} " + " ".join(f"{n:>22s}" for n in entries))
    (first, second) = entries.values()
    for entry in first:
        print(f"{entry:22s} {first[entry]:22.4f} {second.get(entry, math.nan):22.4f}")
    worst, n = largest_difference(*rows.values())
    print(f"probe table, before vs now: {n} values (value and std), largest relative difference "
          f"{worst:.1e}")


if __name__ == "__main__":
    main()
