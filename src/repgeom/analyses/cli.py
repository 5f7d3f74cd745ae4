"""Command lines of the analyses: ``key=value`` words (as in ``probe.py``) or ``--key value``.

``python -m repgeom.analyses.<name> hf=gpt2 csv=data.csv out=results`` and
``python -m repgeom.analyses.<name> --hf gpt2 --csv data.csv --out results`` are the same.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

__all__ = ["parse", "model_arguments"]


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Rewrite each ``key=value`` word to ``--key value`` and parse with `parser`."""
    import sys

    words = list(sys.argv[1:] if argv is None else argv)
    out: list[str] = []
    for w in words:
        if not w.startswith("-") and "=" in w:
            key, value = w.split("=", 1)
            out += [f"--{key.replace('_', '-')}", value]
        else:
            out.append(w)
    return parser.parse_args(out)


def model_arguments(parser: argparse.ArgumentParser) -> None:
    """``hf=``, ``ckpt=``, ``tokenizer=``, ``max-tokens=``: which model to read."""
    parser.add_argument("--hf", help="Hugging Face hub name or folder (save_pretrained)")
    parser.add_argument("--ckpt", help="a repgeom checkpoint (.ckpt)")
    parser.add_argument("--tokenizer", help="tokenizer name or folder, for hf folders without one")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="tokens per window; a longer text is read in several windows")
    parser.add_argument("--name", help="model label in tables and figures (default: hf/ckpt)")
