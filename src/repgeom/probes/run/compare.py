"""probe.py's compare mode: per-layer pooled cosine of two texts (every probed layer, the final
norm included where the model has one) and the last block's token x token cosine map, for one
target (`repgeom.probes.core.targets`), its texts read by `repgeom.models.text_states`.

`Comparison` runs it over a job's targets, as `repgeom.probes.run.trajectory.Trajectory` runs
the probes: ``loop.run(subjects)`` gives the table, and ``loop.figures`` the figures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from repgeom import metrics
from repgeom.models.capture import FINAL_NORM
from repgeom.models.text_states import read_text_states
from repgeom.probes.report import console, plots
from repgeom.probes.run.job import CompareTexts


def compare(
    texts: CompareTexts, subject, loaded: Any, output_dir: Path, *, include_special: bool,
    several: bool
) -> tuple[pd.DataFrame, list[Path]]:
    """``compare.text_a``/``text_b`` (`texts`) read by the `loaded` model of `subject`: its
    per-layer pooled cosine (returned, and in ``compare/pooled_cosine*.csv``) and the last
    block's token x token cosines; `include_special` keeps BOS/CLS/SEP positions."""
    a = read_text_states(loaded, texts.text_a, include_special=include_special)
    b = read_text_states(loaded, texts.text_b, include_special=include_special)
    A, B, tokens_a, tokens_b, names = a.states, b.states, a.tokens, b.tokens, a.layer_names
    pooled = metrics.layer_pooled_similarity(A, B)
    last = max(i for i, name in enumerate(names) if name != FINAL_NORM)  # the last block
    n = A[last].shape[0]
    # Cross cosines from the one-text matrix of both texts stacked: rows A, columns B.
    matrix = metrics.token_cosine_matrix(torch.cat([A[last], B[last]]))[:n, n:].numpy()
    folder = output_dir / "compare"
    folder.mkdir(parents=True, exist_ok=True)
    suffix = (f"_step{subject.step}" if several else "") + (
        f"_{subject.stack}" if subject.stack else ""
    )
    frame = pd.DataFrame(
        {
            "layer": range(len(pooled)),
            "layer_name": names,
            "pooled_cosine": pooled,
            "step": subject.step,
            **subject.id_columns(),
            "kind": subject.kind,
        }
    )
    frame.to_csv(folder / f"pooled_cosine{suffix}.csv", index=False)
    pd.DataFrame(
        matrix,
        index=pd.Index([f"{i}:{t}" for i, t in enumerate(tokens_a)], name="text_a_token"),
        columns=[f"{j}:{t}" for j, t in enumerate(tokens_b)],
    ).to_csv(folder / f"token_cosine_last_layer{suffix}.csv")
    fig = plots.compare_texts(pooled, matrix, [*tokens_a, *tokens_b])
    fig.suptitle(f"{subject.label} ({subject.kind})")
    path = folder / f"compare{suffix}.png"
    fig.savefig(path, dpi=plots.DPI, facecolor="white")
    fig.clear()
    return frame, [path]


@dataclass
class Comparison:
    """Compare mode over a job's targets: each is loaded, reads both texts (`compare`), is
    printed and let go before the next loads."""

    texts: CompareTexts
    device: torch.device
    output_dir: Path
    include_special: bool = False
    figures: list[Path] = field(default_factory=list)

    def run(self, subjects: Sequence) -> pd.DataFrame:
        """The per-layer pooled cosines of every subject, one table (also in
        ``compare/pooled_cosine*.csv``); the figures go to `figures`."""
        frames = []
        for subject in subjects:
            loaded = subject.load(self.device)
            pooled, paths = compare(self.texts, subject, loaded, self.output_dir,
                                    include_special=self.include_special,
                                    several=len(subjects) > 1)
            frames.append(pooled)
            self.figures += paths
            console.print_compare(subject, pooled)
            del loaded
        return pd.concat(frames, ignore_index=True)
