"""Representation similarity across probe steps and runs: the pairwise catalogue entries
(``reads="pair"``: linear CKA, mutual k-NN) between two sets of states of the same probe set.

Within one probe step `measure` compares every two layers. Across steps and runs the states
must outlive the probe: when a pairwise metric is selected, each probe step's states are saved
as ``<run>/probes/states/step_<n>.pt`` (float16, (N, D) per layer, the probe set's rows in order),
and at the end

- `vs_final_rows`: each layer at each step against the same layer at the final step ("how far
  does each layer still move"), rows with ``step_b`` = the final step;
- `run_vs_run_rows`: each layer of run A against the same layer of run B at a step both probed
  (causal vs bidirectional on the same windows), rows with ``run_b``.

Values are the mean and std over the same shuffled batches of ``state_batch_size`` rows as every
other state metric (`repgeom.metrics.batch_indices`), with the permutation null's rows where
``permutations`` (``ProbeSettings.null_permutations``) asks (`repgeom.probes.core.pairwise.null`).
Float16 storage moves CKA by ~1e-4 (relative rounding 2^-11 of each state), far below the
differences between layers it shows.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch

from repgeom import metrics
from repgeom.files import atomic_write, stale_temporaries
from repgeom.probes.core import catalogue
from repgeom.probes.core.measure import ProbeSettings, pair_rows

STATES_DIR = "states"


def states_dir(probe_folder: str | os.PathLike) -> Path:
    """``<run>/probes/states``."""
    return Path(probe_folder) / STATES_DIR


def save_states(probe_folder: str | os.PathLike, step: int, states: Sequence[torch.Tensor],
                layer_names: Sequence[str]) -> Path:
    """Save one probe step's states (float16) for later comparison; returns the file."""
    folder = states_dir(probe_folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{int(step)}.pt"
    saved = {"states": [s.detach().half().cpu() for s in states], "layer_names": list(layer_names)}
    # whole or not at all: a kill mid-write leaves no file that looks whole, and its temporary
    # (a step's states: up to GBs) is removed by the next write of that step
    for stale in stale_temporaries(path):
        stale.unlink(missing_ok=True)
    atomic_write(path, lambda tmp: torch.save(saved, tmp))
    return path


def load_states(path: str | os.PathLike) -> tuple[list[torch.Tensor], list[str]]:
    saved = torch.load(path, map_location="cpu", weights_only=True)
    return [s.float() for s in saved["states"]], list(saved["layer_names"])


def saved_steps(probe_folder: str | os.PathLike) -> dict[int, Path]:
    """Step -> state file of every saved probe step."""
    folder = states_dir(probe_folder)
    found = {int(p.stem.removeprefix("step_")): p for p in folder.glob("step_*.pt")}
    return dict(sorted(found.items()))


def _compare(
    A: Sequence[torch.Tensor],
    B: Sequence[torch.Tensor],
    names: Sequence[str],
    entries: Sequence[catalogue.Metric],
    *,
    batch_size: int,
    seed: int,
    permutations: int = 0,
) -> list[dict]:
    if len(A) != len(B) or A[0].shape[0] != B[0].shape[0]:
        raise ValueError(
            f"the two state sets differ ({len(A)} vs {len(B)} layers, {A[0].shape[0]} vs "
            f"{B[0].shape[0]} states); compare probes of the same probe set and depth"
        )
    split = metrics.batch_indices(A[0].shape[0], batch_size, seed)
    rows = []
    for layer, (X, Y) in enumerate(zip(A, B, strict=True)):
        for entry in entries:
            for metric, value, std in pair_rows(entry, X, Y, split, permutations=permutations,
                                                seed=seed):
                rows.append({"layer": layer, "layer_name": names[layer], "layer_b": layer,
                             "metric": metric, "value": value, "std": std})
    return rows


def vs_final_rows(
    probe_folder: str | os.PathLike,
    entries: Sequence[catalogue.Metric],
    *,
    batch_size: int = ProbeSettings.state_batch_size,
    seed: int = ProbeSettings.seed,
    permutations: int = ProbeSettings.null_permutations,
) -> list[dict]:
    """Every saved step's layers against the same layers at the last saved step."""
    steps = saved_steps(probe_folder)
    if not steps or not entries:
        return []
    final = max(steps)
    B, names = load_states(steps[final])
    rows = []
    for step, path in steps.items():
        A, _ = load_states(path)
        for row in _compare(A, B, names, entries, batch_size=batch_size, seed=seed,
                        permutations=permutations):
            rows.append({"step": step, "step_b": final, **row})
    return rows


def vs_final_step_rows(
    states: Sequence[torch.Tensor],
    probe_folder: str | os.PathLike,
    entries: Sequence[catalogue.Metric],
    *,
    batch_size: int = ProbeSettings.state_batch_size,
    seed: int = ProbeSettings.seed,
    permutations: int = ProbeSettings.null_permutations,
) -> list[dict]:
    """One step's layers (`states`, just probed) against the same layers at the last step saved
    in `probe_folder`: `vs_final_rows` for one step, without keeping its states. The states are
    rounded to float16 as saved ones are, so the numbers equal `vs_final_rows`'."""
    steps = saved_steps(probe_folder)
    if not steps or not entries:
        return []
    final = max(steps)
    B, names = load_states(steps[final])
    A = [s.detach().half().float().cpu() for s in states]
    return [{"step_b": final, **row}
            for row in _compare(A, B, names, entries, batch_size=batch_size, seed=seed,
                        permutations=permutations)]


def run_vs_run_rows(
    folder_a: str | os.PathLike,
    folder_b: str | os.PathLike,
    entries: Sequence[catalogue.Metric],
    *,
    run_b: str,
    step: int | None = None,
    batch_size: int = ProbeSettings.state_batch_size,
    seed: int = ProbeSettings.seed,
    permutations: int = ProbeSettings.null_permutations,
) -> list[dict]:
    """Run A's layers against run B's at `step` (default: the last step both saved)."""
    steps_a, steps_b = saved_steps(folder_a), saved_steps(folder_b)
    common = sorted(set(steps_a) & set(steps_b))
    if not common:
        raise ValueError(
            f"no probe step has saved states in both {folder_a} and {folder_b}; probe both runs "
            "with a pairwise metric (metrics=[...,linear_cka]) on the same windows"
        )
    step = common[-1] if step is None else step
    A, names = load_states(steps_a[step])
    B, _ = load_states(steps_b[step])
    return [{"step": step, "run_b": run_b, **row}
            for row in _compare(A, B, names, entries, batch_size=batch_size, seed=seed,
                        permutations=permutations)]
