"""One training probe, this tree's code against an earlier commit's: seconds and the table.

What `ProbeCallback` spends per probe on the quickstart (`probe_gpt` on all 811 validation
windows of the bundled sample: the forward pass, every default metric, attention and Q/K), and
what it spends once at the end of the run on the figures (`plots.save_figures` with the
quickstart's ``plot_metrics`` and the W&B charts, on a three-step table). The earlier commit's
``src/repgeom`` is extracted (``git archive``) and imported as the package ``repgeom_before``,
so both versions run in one process on the same weights and the same probe set, alternating
after one warm-up round each, and the minimum over the repetitions is reported (wall and CPU
seconds): on a shared machine the ratio holds where absolute seconds do not. The two probe
tables are compared value by value (largest relative difference).

    python benchmarks/bench_probe_speed.py --before <commit> --ckpt runs/qs/checkpoints/last.ckpt
    python benchmarks/bench_probe_speed.py --before <commit> --repeats 5 --threads 1
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
PLOT_METRICS = ["anisotropy", "mean_cosine", "twonn", "gride_k16", "attention_entropy",
                "qk_cosine"]  # conf/probe/default.yaml's plot_metrics
BEFORE = "repgeom_before"


def import_commit(commit: str, folder: Path):
    """The `repgeom` package of `commit`, importable as `BEFORE` (its imports renamed)."""
    archive = subprocess.run(["git", "archive", commit, "src/repgeom"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    package = folder / BEFORE
    (folder / "src" / "repgeom").rename(package)
    pattern = re.compile(r"\brepgeom(?=[. ]|$)", re.M)
    for path in package.rglob("*.py"):
        text = path.read_text()
        path.write_text(pattern.sub(BEFORE, text))
    sys.path.insert(0, str(folder))
    return importlib.import_module(BEFORE)


def version(name: str, model: torch.nn.Module, spec):
    """`probe_gpt`, the figures' functions, the model and the settings of package `name`."""
    gpt = importlib.import_module(f"{name}.models.gpt")
    measure = importlib.import_module(f"{name}.probes.core.measure")
    targets = importlib.import_module(f"{name}.probes.core.targets")
    same = gpt.GPT(gpt.GPTConfig(**dataclasses.asdict(model.config))).eval()
    same.load_state_dict(model.state_dict())
    options = dataclasses.asdict(spec.probe_settings())
    known = {f.name for f in dataclasses.fields(measure.ProbeSettings)}
    settings = measure.ProbeSettings(**{k: v for k, v in options.items() if k in known})
    modules = {m: importlib.import_module(f"{name}.probes.{m}")
               for m in ("report.aggregate", "report.plots", "core.table", "report.wandb_charts")}
    modules = {m.rpartition(".")[2]: module for m, module in modules.items()}
    return targets.probe_gpt, modules, same, settings


def clocked(fn) -> tuple[float, float, object]:
    start, start_cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - start, time.process_time() - start_cpu, out


def one_round(parts, probe_set, batch_size: int):
    """(wall, CPU) seconds of one probe and of the end figures, and the probe's rows."""
    probe_gpt, modules, model, settings = parts
    probe = clocked(lambda: probe_gpt(model, probe_set, batch_size=batch_size, settings=settings))
    rows = probe[2].rows
    frame = modules["table"].rows_to_frame(
        [{"step": step, **row} for step in (0, 125, 500) for row in rows])

    def figures() -> None:
        with tempfile.TemporaryDirectory() as folder:
            modules["plots"].save_figures(frame, folder, metrics=PLOT_METRICS)
        modules["wandb_charts"].charts(modules["aggregate"].single_set(frame))

    return probe[:2], clocked(figures)[:2], rows


def largest_difference(before: list[dict], now: list[dict]) -> tuple[float, int]:
    if [(r["layer"], r["head"], r["metric"]) for r in before] != [
        (r["layer"], r["head"], r["metric"]) for r in now
    ]:
        raise SystemExit("the two versions write different rows")
    worst, n = 0.0, 0
    for a, b in zip((r["value"] for r in before), (r["value"] for r in now), strict=True):
        if math.isnan(a) and math.isnan(b):
            continue
        n += 1
        worst = max(worst, abs(a - b) / max(abs(a), 1e-12))
    return worst, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="commit of the version to compare with")
    parser.add_argument("--ckpt", help="a quickstart checkpoint (default: the untrained model)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_probe_forward import build

    torch.manual_seed(0)  # the untrained model: fixed weights
    model, probe_set, spec = build(args.ckpt, None, None)
    with tempfile.TemporaryDirectory() as folder:
        import_commit(args.before, Path(folder))
        versions = {f"before ({args.before[:10]})": version(BEFORE, model, spec),
                    "now": version("repgeom", model, spec)}
        seconds = {name: {"probe": [], "figures": []} for name in versions}
        rows = {}
        for parts in versions.values():  # warm-up: first calls, fonts, caches
            one_round(parts, probe_set, spec.batch_size)
        for _ in range(args.repeats):
            for name, parts in versions.items():
                probe, figures, rows[name] = one_round(parts, probe_set, spec.batch_size)
                seconds[name]["probe"].append(probe)
                seconds[name]["figures"].append(figures)
    described = probe_set.describe()
    print(f"torch threads {torch.get_num_threads()}; {described['n_windows']} windows x "
          f"{described['positions_per_window']} positions; checkpoint "
          f"{args.ckpt or 'none (untrained)'}; min of {args.repeats}, alternating")
    best = {}
    for name, parts in seconds.items():
        best[name] = {f"{part}{clock}": min(t[i] for t in times) for part, times in parts.items()
                      for i, clock in enumerate(("", "_cpu"))}
        low = best[name]
        walls = ", ".join(f"{t[0]:.2f}" for t in parts["probe"])
        print(f"{name:18s} probe {low['probe']:6.2f} s wall, {low['probe_cpu']:6.2f} s CPU "
              f"(walls: {walls}); end figures {low['figures']:5.2f} s wall, "
              f"{low['figures_cpu']:5.2f} s CPU")
    old, now = best.values()
    for clock in ("", "_cpu"):
        probe, figures = f"probe{clock}", f"figures{clock}"
        before, after = (3 * b[probe] + b[figures] for b in (old, now))
        print(f"{'CPU' if clock else 'wall'}: per probe {now[probe] / old[probe]:.2f}x, figures "
              f"{now[figures] / old[figures]:.2f}x; three probes and the figures {before:.1f} s "
              f"-> {after:.1f} s ({after / before:.2f}x)")
    worst, n = largest_difference(*rows.values())
    print(f"probe table, before vs now: {n} values, largest relative difference {worst:.1e}")


if __name__ == "__main__":
    main()
