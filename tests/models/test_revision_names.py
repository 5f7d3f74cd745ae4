"""Which hub revisions make a training trajectory (`repgeom.models.revision_names`): steps read
from revision names, OLMo's and SmolLM3's stages, explicit lists; rules of names, no hub."""

from __future__ import annotations

import doctest

import pytest

from repgeom.models import revision_names


def test_step_names() -> None:
    named = ["step0", "step_1000", "step-7", "global_step12", "checkpoint-20", "ckpt_3",
             "iter_0001000", "run1/step5", "step1000-tokens4B", "stage1-step140000-tokens294B",
             "stage2-ingredient3-step11931-tokens50B", "step20-tokens84M"]
    assert [revision_names.step_of(n) for n in named] == [0, 1000, 7, 12, 20, 3, 1000, 5,
                                                          1000, 140000, 11931, 20]
    assert [revision_names.stage_of(n) for n in named[-3:]] == [1, 2, 1]
    for other in ("main", "v1.0", "v2", "stepwise", "1000", "step10-extra", "tokens4B"):
        assert revision_names.step_of(other) is None, other


def test_all_reads_smollm3_stages_as_one_trajectory() -> None:
    """SmolLM3's checkpoints (HuggingFaceTB/SmolLM3-3B-checkpoints, model card: "stage1-step-40000";
    stage 1 to step 3,450,000, stage 2 to 4,200,000, stage 3 to 4,720,000) count one run's steps
    across its stages: every stage is listed. A step-named name without a stage beside them,
    whose count is not known, is left out and said."""
    names = ["stage1-step-0", "stage1-step-40000", "stage1-step-3440000", "stage2-step-3480000",
             "stage2-step-4200000", "stage3-step-4240000", "stage3-step-4720000", "lc-step-4000"]
    listing = revision_names.trajectory(names, "test", "HuggingFaceTB/smollm3-like")
    assert listing.found == sorted((revision_names.step_of(n), n) for n in names[:-1])
    [(reason, left_out)] = listing.ignored.items()
    assert left_out == ["lc-step-4000"] and reason.startswith("no stage in the name")
    assert listing.stages_left_out == reason  # a main after the long-context stage: left out
    # A stage that counts anew ends the trajectory there, the stages after it included.
    names = ["stage1-step0", "stage1-step900", "stage2-step1000", "stage3-step5", "stage4-step10"]
    listing = revision_names.trajectory(names, "test", "olmo-like")
    assert [n for _, n in listing.found] == names[:3]
    assert listing.ignored == {"a later training stage than stage 2 (steps counted anew: give "
                               "one stage at a time as a list)": names[3:]}
    assert listing.stages_left_out == next(iter(listing.ignored))  # `main` is left out too
    whole = revision_names.trajectory(names[:3], "test", "smollm3-like")
    assert not whole.stages_left_out and not whole.ignored


def test_all_cuts_a_stage_of_several_runs_side_by_side() -> None:
    """stage2-ingredient1 and stage2-ingredient2 both going on from stage 1's count would
    interleave into one trajectory of two runs: the trajectory ends before them, and they (and
    the stages after them) are left out, said; with nothing else, the refusal says why."""
    names = ["stage1-step0-tokens0B", "stage1-step1000-tokens4B",
             "stage2-ingredient1-step1100-tokens5B", "stage2-ingredient2-step1200-tokens5B",
             "stage2-ingredient1-step1300-tokens6B", "stage3-step1400-tokens7B"]
    listing = revision_names.trajectory(names, "test", "olmo-like")
    assert [n for _, n in listing.found] == names[:2]
    [(reason, left_out)] = listing.ignored.items()
    assert left_out == names[2:]
    assert "stage 2 has 2 runs side by side (stage2-ingredient1, stage2-ingredient2)" in reason
    with pytest.raises(ValueError, match=r"3 left out, stage 2 or later: stage 2 has 2 runs"):
        revision_names.trajectory(names[2:5], "test", "olmo-like")


def test_list_steps_of_mixed_or_repeated_names_are_refused_naming_them() -> None:
    assert revision_names.list_steps(["iter_0000100", "iter_0000200", "main"]) == [
        (100, "iter_0000100"), (200, "iter_0000200"), (201, "main")]
    # Today one name without a step turned every step into a list index; now it is named.
    with pytest.raises(ValueError, match=r"v2 carry no training step in the name"):
        revision_names.list_steps(["step100", "v2", "step300"])
    with pytest.raises(ValueError, match=r"step100 and checkpoint-100 carry the same step 100"):
        revision_names.list_steps(["step100", "checkpoint-100"])


def test_docstring_examples() -> None:
    result = doctest.testmod(revision_names, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0  # examples ran, and all held
