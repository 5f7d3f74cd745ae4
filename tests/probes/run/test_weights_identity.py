"""Revisions that serve the same weights (`repgeom.probes.run.copies.copies`, `mark_copies`):
found from the weights' sha256, marked in the table and left out of phase detection."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from repgeom import files
from repgeom.probes.core import table
from repgeom.probes.core.spec import ProbeRequest
from repgeom.probes.report import phases
from repgeom.probes.run.copies import copies
from repgeom.probes.run.costs import TIMINGS
from repgeom.probes.run.trajectory import Trajectory


def test_copies_keep_the_latest_of_identical_weights_and_name_shared_shards() -> None:
    # Pythia-2.8b: final-era weights under earlier step names; Pythia-12b: one shared shard.
    weights = {
        "step1000": {"a.safetensors": "h1", "b.safetensors": "h2"},
        "step2000": {"a.safetensors": "final1", "b.safetensors": "final2"},
        "step3000": {"a.safetensors": "final1", "b.safetensors": "final2"},
        "step4000": {"a.safetensors": "final1", "b.safetensors": "h3"},
        "step5000": {"a.safetensors": "final1", "b.safetensors": "final2"},
    }
    found, shared = copies(weights)
    assert found == {"step2000": "step5000", "step3000": "step5000"}
    assert shared == {("step4000", "step5000"): ["a.safetensors"]}
    assert copies({"s1": {"m.bin": "x"}, "s2": {"m.bin": "y"}}) == ({}, {})
    # Equal sha256 under another file name is not the same file set: not a copy.
    assert copies({"s1": {"m.bin": "x"}, "s2": {"n.bin": "x"}})[0] == {}


def test_a_bin_only_revision_and_its_safetensors_conversion_are_one_checkpoint() -> None:
    """Weights are compared on a format both revisions have (`weights_rule.same_weights`): the
    last step's ``.bin`` and ``main`` holding the same ``.bin`` and the bot's safetensors
    conversion are one checkpoint. Before, the whole {file: sha256} sets were compared: never
    equal."""
    weights = {
        "step1": {"pytorch_model.bin": "b1"},
        "step2": {"pytorch_model.bin": "b2"},
        "main": {"pytorch_model.bin": "b2", "model.safetensors": "s2"},
    }
    assert copies(weights) == ({"step2": "main"}, {})
    # The same file name in another format is another file: not compared.
    assert copies({"s1": {"m.bin": "x"}, "s2": {"m.safetensors": "x"}})[0] == {}


def _rows(step: int, revision: str, value: float) -> list[dict]:
    return [{"step": step, "layer": layer, "metric": "twonn", "value": value + layer,
             "std": 0.01, "model": "org/m", "revision": revision} for layer in (1, 2)]


def test_copies_are_marked_in_the_table_warned_once_and_left_out_of_phases(tmp_path) -> None:
    """A stretch of final-weights copies in the middle of a trajectory is flat; unmarked, phase
    detection reads the flat stretch between real steps as a peak."""
    steps = {"step0": 0, "step10": 10, "step20": 20, "step30": 30, "step40": 40, "step50": 50}
    values = {"step0": 1.0, "step10": 9.0, "step20": 9.0, "step30": 9.0, "step40": 7.0,
              "step50": 9.0}
    sha = {"step0": "a", "step10": "z", "step20": "z", "step30": "z", "step40": "b",
           "step50": "z"}
    rows = [r for name, step in steps.items() for r in _rows(step, name, values[name])]
    table.write_table(table.rows_to_frame(rows), table.probe_dir(tmp_path))
    costs = pd.DataFrame({"step": list(steps.values()), "revision": list(steps),
                          "weights_sha256": [json.dumps({"model.safetensors": sha[n]})
                                             for n in steps]})
    costs.to_csv(table.probe_dir(tmp_path) / TIMINGS, index=False)
    loop = Trajectory(ProbeRequest(), torch.device("cpu"), tmp_path)
    with pytest.warns(UserWarning, match=r"step10, step20, step30 serve the weights of step50"):
        found = loop.mark_copies()
    assert found == {"step10": "step50", "step20": "step50", "step30": "step50"}
    marked = table.read_table(tmp_path)
    by_revision = marked.groupby("revision")[phases.COPY_COLUMN].first()
    assert by_revision.to_dict() == {"step0": "", "step10": "step50", "step20": "step50",
                                     "step30": "step50", "step40": "", "step50": ""}
    # Unmarked, the copies make a peak at step 10 and a fall to step 40; marked, the curve is
    # 0 -> 40 -> 50 (1, 7, 9): rising throughout, no peak before the last step.
    before = phases.find_phases(table.rows_to_frame(rows))
    after = phases.find_phases(marked)
    peak = lambda events: int(events.query("layer == -1 and event == 'peak'")["step"].iloc[0])  # noqa: E731
    assert peak(before) == 10
    assert peak(after) == 50
    assert "expansion_to_compression" in set(before["event"])
    assert "expansion_to_compression" not in set(after["event"])


def test_table_files_are_fsynced_before_they_are_renamed(tmp_path, monkeypatch) -> None:
    """A node crash after a rename that the disk has not seen leaves an empty table."""
    import os

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    table.write_table(table.rows_to_frame(_rows(0, "r", 1.0)), tmp_path)
    assert any(p.endswith(".tmp") and ".probes.csv." in p for p in synced)
    assert str(tmp_path) in synced  # the folder, after the renames
    files.atomic_write_text(tmp_path / "x.json", "{}")
    assert (tmp_path / "x.json").read_text() == "{}"
    assert any(".x.json." in p for p in synced)
