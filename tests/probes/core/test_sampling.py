"""The probe set: positions drawn among candidates, and the fallback on a short text."""

import pytest
import torch

from repgeom.probes.core.sampling import choose_positions, fit_to_text, windows_needed


def test_positions_are_k_random_candidates_per_window_and_fixed_by_the_seed():
    candidates = torch.ones(50, 32, dtype=torch.bool)
    candidates[:, :3] = False  # e.g. special tokens
    candidates[7, 3:] = False  # a window with no candidate at all
    chosen = choose_positions(candidates, 4, seed=1)
    assert not (chosen & ~candidates).any()
    counts = chosen.sum(1)
    assert counts[7] == 0 and (counts[torch.arange(50) != 7] == 4).all()
    assert torch.equal(chosen, choose_positions(candidates, 4, seed=1))
    assert not torch.equal(chosen, choose_positions(candidates, 4, seed=2))
    # every candidate position is drawn somewhere: the draw is spread, not a fixed offset
    assert chosen[:, 3:].any(0).all()
    assert torch.equal(choose_positions(candidates, None, seed=0), candidates)


def test_a_window_with_fewer_candidates_keeps_all_of_them():
    candidates = torch.zeros(2, 16, dtype=torch.bool)
    candidates[0, :2] = True
    candidates[1] = True
    assert choose_positions(candidates, 4, seed=0).sum(1).tolist() == [2, 4]


def test_enough_text_keeps_the_requested_set():
    assert windows_needed(8192, 4, 256) == 2048
    assert fit_to_text(8192, 4, 19_531, 256) == (2048, 4)


def test_short_text_takes_every_window_at_more_positions_and_says_so():
    with pytest.warns(UserWarning, match=r"811 windows of 256.*every window at 11 positions"):
        assert fit_to_text(8192, 4, 811, 256) == (811, 11)
    with pytest.warns(UserWarning):  # never more positions than a window has
        assert fit_to_text(8192, 4, 10, 256) == (10, 256)


def test_bad_positions_per_window_is_refused():
    with pytest.raises(ValueError, match="positions_per_window .* exceeds the window length"):
        windows_needed(100, 300, 256)
    with pytest.raises(ValueError, match="positions_per_window must be a positive integer"):
        choose_positions(torch.ones(2, 8, dtype=torch.bool), 0, seed=0)
