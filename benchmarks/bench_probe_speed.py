"""One training probe, this tree's code against an earlier commit's: seconds and the table.

What `ProbeCallback` spends per probe on the quickstart (`probe_gpt` on all 811 validation
windows of the bundled sample: the forward pass, every default metric, attention and Q/K), and
what it spends once at the end of the run on the figures (`plots.save_figures` with the
quickstart's ``plot_metrics`` and the W&B charts, on a three-step table). Each version runs in
its own process (the earlier one from ``git archive <commit> src``), the two alternating so
that both see the same machine load; the minimum over the repetitions is reported. The probe
tables of the two versions are compared value by value (largest relative difference).

    python benchmarks/bench_probe_speed.py --before <commit> --ckpt runs/qs/checkpoints/last.ckpt
    python benchmarks/bench_probe_speed.py --before <commit> --repeats 3 --threads 1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLOT_METRICS = ["anisotropy", "mean_cosine", "twonn", "gride_k16", "attention_entropy",
                "qk_cosine"]  # conf/probe/default.yaml's plot_metrics


def worker(ckpt: str | None, probes: int, threads: int | None) -> dict:
    """Time `probes` probes and the end-of-run figures in this process (its `repgeom`)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_probe_forward import build

    from repgeom.probes import aggregate, plots, table, wandb_charts
    from repgeom.probes.targets import probe_gpt

    torch.manual_seed(0)  # the untrained model: the same weights in both processes
    model, probe_set, spec = build(ckpt, None, None)
    settings = spec.probe_settings()
    seconds, cpu, output = [], [], None
    for _ in range(probes):
        start, start_cpu = time.perf_counter(), time.process_time()
        output = probe_gpt(model, probe_set, batch_size=spec.batch_size, settings=settings)
        seconds.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    rows = output.rows
    frame = table.rows_to_frame([{"step": step, **row} for step in (0, 125, 500) for row in rows])
    figures, figures_cpu = [], []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(2):
            start, start_cpu = time.perf_counter(), time.process_time()
            plots.save_figures(frame, folder, metrics=PLOT_METRICS)
            wandb_charts.charts(aggregate.single_set(frame))
            figures.append(time.perf_counter() - start)
            figures_cpu.append(time.process_time() - start_cpu)
    return {"probe": seconds, "probe_cpu": cpu, "figures": figures, "figures_cpu": figures_cpu,
            "rows": rows, "threads": torch.get_num_threads()}


def run_version(src: Path, args) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, __file__, "--worker", out.name, "--probes", str(args.probes)]
        command += ["--ckpt", args.ckpt] if args.ckpt else []
        command += ["--threads", str(args.threads)] if args.threads else []
        env = {**os.environ, "PYTHONPATH": str(src)}
        subprocess.run(command, check=True, env=env, cwd=ROOT, stderr=subprocess.DEVNULL)
        return json.loads(Path(out.name).read_text())


def largest_difference(before: list[dict], now: list[dict]) -> tuple[float, int]:
    key = lambda r: (r["layer"], r["head"], r["metric"])  # noqa: E731
    old = {key(r): r["value"] for r in before}
    worst, n = 0.0, 0
    for row in now:
        a, b = old.get(key(row)), row["value"]
        if a is None:
            raise SystemExit(f"row {key(row)} is new: the two versions do not write one table")
        if math.isnan(a) and math.isnan(b):
            continue
        n += 1
        worst = max(worst, abs(a - b) / max(abs(a), 1e-12))
    if n != sum(1 for r in before if not math.isnan(r["value"])):
        raise SystemExit("the two versions write different rows")
    return worst, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="commit of the version to compare with")
    parser.add_argument("--ckpt", help="a quickstart checkpoint (default: the untrained model)")
    parser.add_argument("--repeats", type=int, default=2, help="processes per version")
    parser.add_argument("--probes", type=int, default=2, help="probes per process")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        Path(args.worker).write_text(json.dumps(worker(args.ckpt, args.probes, args.threads)))
        return
    if not args.before:
        parser.error("--before is required")
    with tempfile.TemporaryDirectory() as folder:
        archive = subprocess.run(["git", "archive", args.before, "src"], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
        versions = {f"before ({args.before[:10]})": Path(folder) / "src", "now": ROOT / "src"}
        results: dict[str, list[dict]] = {name: [] for name in versions}
        for _ in range(args.repeats):
            for name, src in versions.items():
                results[name].append(run_version(src, args))
    first = next(iter(results.values()))[0]
    print(f"torch threads {first['threads']}; {args.repeats} processes per version, "
          f"{args.probes} probes each; checkpoint {args.ckpt or 'none (untrained)'}")
    best = {}
    for name, runs in results.items():
        low = {k: min(s for r in runs for s in r[k])
               for k in ("probe", "probe_cpu", "figures", "figures_cpu")}
        best[name] = low
        every = ", ".join(f"{s:.2f}" for r in runs for s in r["probe"])
        print(f"{name:18s} probe {low['probe']:6.2f} s wall, {low['probe_cpu']:6.2f} s CPU "
              f"(walls: {every}); end figures {low['figures']:5.2f} s wall, "
              f"{low['figures_cpu']:5.2f} s CPU")
    old, now = best.values()
    for clock in ("", "_cpu"):
        probe, figures = f"probe{clock}", f"figures{clock}"
        before, after = (3 * b[probe] + b[figures] for b in (old, now))
        print(f"{'CPU' if clock else 'wall'}: per probe {now[probe] / old[probe]:.2f}x, figures "
              f"{now[figures] / old[figures]:.2f}x; three probes and the figures {before:.1f} s "
              f"-> {after:.1f} s ({after / before:.2f}x)")
    worst, n = largest_difference(first["rows"], results["now"][0]["rows"])
    print(f"probe table, before vs now: {n} values, largest relative difference {worst:.1e}")


if __name__ == "__main__":
    main()
