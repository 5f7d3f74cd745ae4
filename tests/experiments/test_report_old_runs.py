"""The 3-seed shape_of_learning runs committed under docs/results/runs (seeds 0, 1, 2; the
5-seed report adds seeds 3 and 4 beside them), read with the report's statistics (issue 37, "Old
runs"): a copy of them, so the committed files are never touched."""

import shutil

import pytest
from hydra_configs import ROOT

from repgeom.experiments import statistics as st
from repgeom.experiments.report_sections import sweep_findings

RUNS = ROOT / "docs" / "results" / "runs" / "shape_of_learning"


@pytest.fixture(scope="module")
def old(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not RUNS.is_dir():
        pytest.skip(f"{RUNS} is not in this checkout")
    copy = tmp_path_factory.mktemp("old_runs") / "shape_of_learning"
    copy.mkdir()
    for run in RUNS.iterdir():
        if run.name.endswith(("-seed0", "-seed1", "-seed2")):
            shutil.copytree(run, copy / run.name)
    findings, facts, _ = sweep_findings(copy)
    assert facts["causal"]["seeds"] == [0, 1, 2]
    return {f.claim: f for group in findings.values() for f in group}


def _one(every: dict, *words: str):
    (hit,) = [f for claim, f in every.items() if all(w in claim for w in words)]
    return hit


def test_the_plateau_rise_then_fall_of_the_old_runs_does_not_agree(old: dict) -> None:
    plateau = _one(old, "(id_plateau)", "(causal)")
    # Two seeds read no plateau at step 0: the start is not moved to step 200, as it once was.
    assert not plateau.agrees and plateau.verdict == "not measured"
    assert "step 0" in plateau.observed and "not moved" in plateau.observed


def test_every_agrees_of_the_old_runs_carries_an_adjusted_p_of_at_most_alpha(old: dict) -> None:
    assert len(old) == 17  # experiments 1-3: 4 profile, 7 intrinsic-dimension, 6 attention checks
    tested = [f for f in old.values() if f.testable]
    assert len(tested) == 15  # the plateau's two claims are not measured
    for finding in old.values():
        assert finding.agrees == (finding.testable and finding.adjusted <= st.ALPHA)
        if finding.testable:
            assert finding.adjusted >= finding.p
            assert f"adjusted p = {st.fmt_p(finding.adjusted)}" in finding.markdown()
    # TwoNN's rise then fall (causal) holds in 3 of 3 seeds, but its peak was chosen among 14
    # steps, and 3 seeds give its t tests 2 degrees of freedom: the Bonferroni bound over the 14
    # makes it not shown once Holm runs over experiment 2's 5 tested checks.
    twonn = _one(old, "(twonn)", "(causal)")
    assert twonn.seeds_holding == 3 and twonn.verdict == "not shown"
    assert "Bonferroni over 14 candidates" in twonn.observed
    assert twonn.family == "experiment 2" and twonn.family_size == 5
