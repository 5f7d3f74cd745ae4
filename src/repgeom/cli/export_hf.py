"""``repgeom-export-hf``: export a repgeom checkpoint as a Hugging Face model folder
(GPT2LMHeadModel, BertModel or XLMRobertaXLModel, with a byte tokenizer;
`repgeom.models.export_hf`).

    repgeom-export-hf ckpt=outputs/.../checkpoints/last.ckpt out_dir=exported/
    repgeom-export-hf outputs/.../checkpoints/last.ckpt exported/      (the same)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import MISSING

from repgeom.cli.command import console, run_command


@dataclass
class ExportHFConfig:
    ckpt: str = MISSING
    """Checkpoint written by train.py (e.g. .../last.ckpt)."""
    out_dir: str = MISSING
    """Folder to write (save_pretrained layout)."""


def task(cfg: ExportHFConfig) -> Path:
    from repgeom.models.export_hf import export_hf

    out = export_hf(cfg.ckpt, cfg.out_dir)
    print(f"Exported {cfg.ckpt} to {out}")
    return out


def main(argv: Sequence[str] | None = None) -> Path | None:
    return run_command("export_hf", ExportHFConfig, task, argv, positional=("ckpt", "out_dir"))


if __name__ == "__main__":
    raise SystemExit(console(main))
