"""Saved probe states (`repgeom.probes.core.pairwise.similarity.save_states`)."""

from __future__ import annotations

import torch

from repgeom.probes.core.pairwise import similarity


def test_a_killed_writes_temporaries_of_a_step_go_with_its_next_write(tmp_path) -> None:
    # A kill -9 while a step's states were written leaves a hidden temporary (a step's whole
    # states: GBs for a large model); the rerun's write of that step removes it, so repeated
    # kills do not pile them up. Another step's temporaries and the saved files stay.
    folder = similarity.states_dir(tmp_path)
    folder.mkdir(parents=True)
    for name in (".step_10.pt.0a1b2c3d.tmp", ".step_10.pt.99887766.tmp",
                 ".step_20.pt.1234abcd.tmp"):
        (folder / name).write_bytes(b"half a step")
    similarity.save_states(tmp_path, 20, [torch.zeros(2, 3)], ["embedding"])
    similarity.save_states(tmp_path, 10, [torch.ones(4, 3)], ["embedding"])
    assert sorted(p.name for p in folder.iterdir()) == ["step_10.pt", "step_20.pt"]
    states, names = similarity.load_states(folder / "step_10.pt")
    assert names == ["embedding"] and torch.equal(states[0], torch.ones(4, 3))
