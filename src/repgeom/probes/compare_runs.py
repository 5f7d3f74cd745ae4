"""Compare the layer profiles of several runs side by side, in one figure.

The one command to lay a causal and a bidirectional run beside each other::

    python -m repgeom.probes.compare_runs outputs/causal outputs/bidirectional \\
        --metric anisotropy --labels causal bidirectional --out compare.png

Each RUN is a run folder (its table is ``<run>/probes/probes.parquet`` or ``.csv``), a ``probes``
folder, or a table file. Every panel shows one run's layer profile at its last probe step (or at
``--step``), on a shared y axis.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from repgeom.probes.plots import DPI, profiles_side_by_side
from repgeom.probes.table import PROBE_DIR, read_table


def _labels(runs: Sequence[str]) -> list[str]:
    """Default labels: each run folder's name, or its last two parts where names repeat."""
    paths = []
    for run in runs:
        path = Path(run).resolve()
        if path.is_file():  # <run>/probes/probes.csv -> <run>/probes
            path = path.parent
        if path.name == PROBE_DIR:  # <run>/probes -> <run>
            path = path.parent
        paths.append(path)
    names = [p.name for p in paths]
    if len(set(names)) < len(names):
        names = [f"{p.parent.name}/{p.name}" for p in paths]
    return names


def _step(text: str) -> int | str:
    if text == "last":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer or 'last', got {text!r}"
        ) from None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m repgeom.probes.compare_runs",
        description="Layer profiles of several probed runs, side by side, in one PNG.",
    )
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="run folder, its probes/ folder, or a probes.parquet/.csv file")
    parser.add_argument("--metric", default="anisotropy",
                        help="metric to compare (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("compare.png"),
                        help="PNG to write (default: %(default)s)")
    parser.add_argument("--labels", nargs="+", metavar="LABEL",
                        help="one label per run (default: the run folders' names)")
    parser.add_argument("--step", type=_step, default="last",
                        help="probe step drawn in every panel, or 'last' for each run's own last")
    parser.add_argument("--dpi", type=int, default=DPI, help="resolution (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.labels is not None and len(args.labels) != len(args.runs):
        parser.error(f"--labels: got {len(args.labels)} labels for {len(args.runs)} runs")
    if args.labels is not None and len(set(args.labels)) != len(args.labels):
        parser.error(f"--labels: labels must differ, got {args.labels}")
    return args


def main(argv: Sequence[str] | None = None) -> Path:
    """Read each run's table, draw `profiles_side_by_side`, write it to ``--out``; return the path.

    Raises
    ------
    FileNotFoundError
        When a run has no probe table (naming where it looked).
    ValueError
        When a run lacks the metric (naming it and listing the metrics present) or the step.
    """
    args = parse_args(argv)
    labels = args.labels or _labels(args.runs)
    frames = {label: read_table(run) for label, run in zip(labels, args.runs, strict=True)}
    fig = profiles_side_by_side(frames, args.metric, step=args.step)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=args.dpi, facecolor="white")
    print(f"wrote {args.out}")
    return args.out


if __name__ == "__main__":
    try:
        main()
    except (FileNotFoundError, ValueError) as err:  # a message, not a traceback, on the console
        sys.exit(f"compare_runs: error: {err}")
