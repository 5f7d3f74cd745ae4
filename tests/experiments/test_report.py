"""Experiments 1-3 in the report: seeds, intervals and verdicts on a planted synthetic sweep, and
(slow) the sweep preset run in miniature with the report rebuilt from its files."""

import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from cli_runs import PYTHON, run_train, subprocess_env, tiny_overrides
from hydra_configs import ROOT

from repgeom.cli.report import main as report
from repgeom.experiments import report as report_module
from repgeom.experiments import seeds
from repgeom.experiments import statistics as st
from repgeom.experiments.report import find_runs, shape_of_learning
from repgeom.probes.core.table import append_rows, probe_dir, read_table

T_975_2 = 4.302652729911275
"""t_{0.975, 2}: the 95% two-sided Student-t quantile for 3 seeds (tables: 4.303)."""

# ---------------------------------------------------------------------------------------------
# A planted sweep: 2 maskings x 3 seeds, 4 probe steps, embedding + 4 blocks + a final norm.

STEPS = (0, 10, 100, 1000)
BLOCKS = (1, 2, 3, 4)
FINAL = 5  # the final norm's layer
OFFSETS = (-0.1, 0.0, 0.25)  # per seed; unequal, so the seeds' std is not trivial
TWONN = {"causal": (1.0, 9.0, 7.0, 6.0), "bidirectional": (0.8, 5.0, 4.0, 3.5)}
"""Layer mean of TwoNN at each step; seed k adds OFFSETS[k] at the peak (step 10) only."""
GRIDE = {"causal": (20.0, 25.0, 15.0, 10.0), "bidirectional": (20.13, 20.17, 12.0, 5.0)}
"""The bidirectional GRIDE curve is the +0.2% rise the old report called a rise: 20.13 -> 20.17;
seed k adds GRIDE_SPREAD * OFFSETS[k] at the peak (step 10), more than that rise."""
GRIDE_SPREAD = 0.3
ID_STD = {"twonn": 0.05, "gride_k16": 0.1}
"""Batch std of every block's ID (the probe's std over batches of 4096 states)."""
ANISO = {"causal": (0.2, 0.4, 0.3, 0.25), "bidirectional": (0.2, 0.22, 0.21, 0.2)}
"""Final anisotropy per block: a bell for the decoder, nearly flat for the encoder."""
FINAL_NORM_ANISO = 0.99  # larger than every block: it would be "the peak" if it were a block
ENTROPY = {"causal": (2.0, 2.5, 3.0, 3.5), "bidirectional": (3.0, 3.2, 3.4, 3.6)}
QK = (0.5, 0.1, -0.2, -0.5)
COSINE_SLOPE = {"causal": 0.1, "bidirectional": -0.1}
"""Mean cosine = 0.5 + slope * drift norm over the blocks (drift norm = the block index): the
decoder's drift and cosine rise together (Spearman = Pearson = 1), the encoder's oppose (-1)."""


PLATEAU = {"causal": (3.0, 12.0, 9.0, 8.0), "bidirectional": (3.0, 4.0, 5.0, 6.0)}
"""Layer mean of the plateau's ID (`id_plateau`) where a sweep has it: the decoder rises and
falls, the encoder only rises. Block 1 of the decoder at step 0 is guarded (NaN, a note)."""


def _rows(masking: str, o: float, plateau: bool = False) -> list[dict]:
    rows = []
    for i, step in enumerate(STEPS):
        frac = i / (len(STEPS) - 1)
        for layer in (0, *BLOCKS, FINAL):
            name = "embedding" if layer == 0 else "final_norm" if layer == FINAL else None
            base = dict(step=step, layer=layer, layer_name=name)
            spread = 0.05 * (layer - 2.5)  # sums to 0 over blocks 1..4: the layer mean is planted
            for metric, curve in (("twonn", TWONN), ("gride_k16", GRIDE)):
                value = curve[masking][i] + spread + (o if i == 1 and metric == "twonn" else 0.0)
                if metric == "gride_k16" and i == 1:
                    value += GRIDE_SPREAD * o
                if layer == FINAL:
                    value = 50.0  # would move every layer mean if the final norm were averaged
                rows.append(dict(base, metric=metric, value=value, std=ID_STD[metric]))
            if layer in BLOCKS:
                final = ANISO[masking][layer - 1] + 0.01 * o
            else:
                final = FINAL_NORM_ANISO if layer == FINAL else 0.1
            rows.append(dict(base, metric="anisotropy", value=0.08 + frac * (final - 0.08),
                             std=0.002))
            drift = float(layer) if layer in BLOCKS else 100.0  # embedding, final norm: ignored
            cosine = 0.5 + COSINE_SLOPE[masking] * layer + 0.01 * o if layer in BLOCKS else -9.0
            rows.append(dict(base, metric="drift_norm", value=drift))
            rows.append(dict(base, metric="mean_cosine", value=cosine))
            if plateau and layer in BLOCKS:
                guarded = masking == "causal" and step == 0 and layer == 1
                value = math.nan if guarded else PLATEAU[masking][i] + spread + 0.1 * o
                rows.append(dict(base, metric="id_plateau", value=value, std=0.1,
                                 note="copies: 60% of the states" if guarded else ""))
            share = 0.3 if (masking == "causal" and step == 0 and layer == 1) else 0.0
            rows.append(dict(base, metric="near_duplicate_share", value=share))
            if layer in BLOCKS:
                for head in (0, 1):
                    sign = 1 if head else -1
                    entropy = 4.5 + frac * (ENTROPY[masking][layer - 1] - 4.5) + 0.05 * o
                    rows.append(dict(base, head=head, metric="attention_entropy",
                                     value=entropy + 0.1 * sign))
                    rows.append(dict(base, head=head, metric="qk_cosine",
                                     value=frac * QK[layer - 1] + 0.01 * o + 0.02 * sign))
    return rows


def _config(masking: str, seed: int) -> dict:
    return {
        "seed": seed,
        "model": {"name": "gpt_tiny", "n_layer": 4, "n_embd": 128, "block_size": 256},
        "masking": {"name": masking},
        "data": {"source": "sample", "clean": True, "batch_size": 16},
        "trainer": {"max_steps": 1000, "accelerator": "cpu"},
        "probe": {"n_states": 8192, "positions_per_window": 4,
                  "settings": {"state_batch_size": 4096, "near_duplicate_threshold": 0.005}},
    }


def make_sweep(folder: Path, *, hparams: bool = True, plateau: bool = False,
               offsets: tuple[float, ...] = OFFSETS) -> Path:
    """The layout `scripts/make_report.sh` reads: <masking>-seed<k>/ with probes/probes.parquet and
    .hydra/config.yaml, and (if `hparams`) the training run's csv/version_0/hparams.yaml."""
    for masking in ("causal", "bidirectional"):
        for k, o in enumerate(offsets):
            run = folder / f"{masking}-seed{k}"
            append_rows(probe_dir(run), _rows(masking, o, plateau))
            (run / "probes" / "probes.csv").unlink()  # only the parquet is committed
            (run / ".hydra").mkdir(parents=True)
            (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(_config(masking, k)))
            if hparams:
                (run / "csv" / "version_0").mkdir(parents=True)
                (run / "csv" / "version_0" / "hparams.yaml").write_text(
                    yaml.safe_dump({"model": {"vocab_size": 200}, "seed": k})
                )
    return folder


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory):
    """The planted sweep and what `shape_of_learning` makes of it."""
    sweep = make_sweep(tmp_path_factory.mktemp("planted"))
    images, findings, facts = shape_of_learning(sweep, sweep.parent / "figures")
    every = {f.claim: f for group in findings.values() for f in group}
    return sweep, images, every, facts


def _finding(every: dict, *words: str):
    (hit,) = [f for claim, f in every.items() if all(w in claim for w in words)]
    return hit


def test_t_interval_is_the_hand_computed_student_interval() -> None:
    values = [2.9, 3.0, 3.25]
    mean = sum(values) / 3
    s = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
    half = T_975_2 * s / math.sqrt(3)
    ci = seeds.t_interval(values)
    assert (ci.mean, ci.low, ci.high, ci.n) == pytest.approx((mean, mean - half, mean + half, 3))
    # One seed: a mean, no interval.
    one = seeds.t_interval([4.0])
    assert one.mean == 4.0 and math.isnan(one.low) and "no interval" in one.format()
    # Welch against a group with no spread reduces to the one-sample interval (df = n_a - 1).
    welch = seeds.welch_interval(values, [1.0, 1.0, 1.0])
    assert (welch.low, welch.high) == pytest.approx((mean - 1 - half, mean - 1 + half))


def test_aggregate_gives_per_layer_means_intervals_and_rms_batch_std(tmp_path: Path) -> None:
    tables = [read_table(run.path) for run in find_runs(make_sweep(tmp_path))["causal"]]
    agg = seeds.aggregate(tables, "twonn")
    row = agg.loc[(agg["step"] == 10) & (agg["layer"] == 2)].iloc[0]
    values = [9.0 - 0.025 + o for o in OFFSETS]  # TWONN at step 10 + block 2's spread + seed
    ci = seeds.t_interval(values)
    assert (row["value"], row["low"], row["high"]) == pytest.approx((ci.mean, ci.low, ci.high))
    assert row["n_seeds"] == 3 and row["std"] == pytest.approx(ID_STD["twonn"])
    # Per-head metrics are averaged over heads first (heads planted at ±0.1 around the mean).
    ent = seeds.aggregate(tables, "attention_entropy")
    last = ent.loc[(ent["step"] == 1000) & (ent["layer"] == 1)].iloc[0]
    assert last["value"] == pytest.approx(2.0 + 0.05 * np.mean(OFFSETS))


def test_steps_must_align_across_seeds(tmp_path: Path) -> None:
    sweep = make_sweep(tmp_path)
    run = sweep / "causal-seed2"
    frame = read_table(run)
    (run / "probes" / "probes.parquet").unlink()
    append_rows(probe_dir(run), frame.loc[frame["step"] < 1000])
    with pytest.raises(ValueError, match=r"causal: .*causal-seed2 lacks steps \[1000\]"):
        shape_of_learning(sweep, tmp_path / "figures")


def test_findings_count_seeds_and_give_hand_computed_intervals(planted) -> None:
    _, _, every, facts = planted
    assert facts["causal"]["seeds"] == [0, 1, 2] and facts["causal"]["vocab"] == [200]
    rise = _finding(every, "(twonn)", "(causal)")
    assert rise.agrees and (rise.seeds_holding, rise.n_seeds) == (3, 3)
    assert "the sign holds in 3 of 3 seeds" in rise.markdown()
    # The peak is step 10, and the verdict's p the Bonferroni bound over the 2 candidates: twice
    # the t test of peak - end = 3 + o (the larger p of the intersection-union test), by hand.
    ends = [3.0 + o for o in OFFSETS]
    t = np.mean(ends) / (np.std(ends, ddof=1) / math.sqrt(3))
    from scipy import stats

    assert rise.p == pytest.approx(2 * stats.t.sf(t, 2))
    assert (f"p = {st.fmt_p(rise.p)}, adjusted p = {st.fmt_p(rise.adjusted)} (Holm over the 5 "
            "tested checks of experiment 2)") in rise.markdown()
    # peak - end per seed = 9 + o - 6; its interval, computed by hand:
    diffs = [3.0 + o for o in OFFSETS]
    mean = float(np.mean(diffs))
    half = T_975_2 * float(np.std(diffs, ddof=1)) / math.sqrt(3)
    assert f"peak − end = {mean:.3f} [{mean - half:.3f}, {mean + half:.3f}]" in rise.observed
    # Its start is in a flagged layer (near-duplicate share 0.3 in block 1 at step 0).
    assert "TwoNN at step 0 reads layers the report flags as near-duplicates" in rise.observed
    assert "near-duplicates" not in _finding(every, "(twonn)", "(bidirectional)").observed


def test_every_id_claim_is_stated_at_each_scale(planted, tmp_path: Path) -> None:
    _, _, every, _ = planted
    for masking in ("causal", "bidirectional"):
        for scale, metric in (("the smallest scale", "twonn"), ("the plateau", "id_plateau"),
                              ("GRIDE k16", "gride_k16")):
            finding = _finding(every, f"at {scale} (", f"({metric})", f"({masking})")
            # Runs probed before the scale profile: the plateau is "not measured", not a verdict.
            assert finding.measured == (metric != "id_plateau")
    missing = _finding(every, "(id_plateau)", "(causal)")
    assert "**not measured**" in missing.markdown() and "id_scales" in missing.observed
    assert "family: experiment 2, not counted by its Holm correction" in missing.markdown()
    # A sweep with the profile: the plateau's claim is decided like the others, the guarded
    # block left out of the mean with the count said.
    sweep = make_sweep(tmp_path / "sweep", plateau=True)
    _, findings, _ = shape_of_learning(sweep, tmp_path / "figures")
    every = {f.claim: f for f in findings["id"]}
    causal = _finding(every, "(id_plateau)", "(causal)")
    assert causal.measured and causal.agrees and "peak 12." in causal.observed
    assert "NaN readings: 3 of 48 (block, step, seed)" in causal.observed  # 1 per seed
    encoder = _finding(every, "(id_plateau)", "(bidirectional)")
    assert encoder.measured and not encoder.agrees  # a rise without a fall
    text = report_module.id_scale_lines(sweep)[0]
    assert "smallest-scale reading" in text and "plateau 3.0 → 8.0" in text


def test_the_old_tiny_rise_is_not_shown(planted) -> None:
    _, _, every, _ = planted
    tiny = _finding(every, "(gride_k16)", "(bidirectional)")
    assert tiny.verdict == "not shown" and "→ **not shown**" in tiny.markdown()
    assert "start 20.130" in tiny.observed and f"peak {20.17 + 0.3 * np.mean(OFFSETS):.3f}" in (
        tiny.observed)
    assert _finding(every, "(gride_k16)", "(causal)").agrees


def test_the_final_norm_never_enters_a_verdict(planted) -> None:
    _, _, every, _ = planted
    bell = _finding(every, "bell-shaped")
    # The final norm (0.99) is above every block: as a block it would be the last-layer peak.
    assert bell.agrees and "peak at block 2" in bell.observed
    assert f"final-norm output {FINAL_NORM_ANISO:.3f}" in bell.observed
    assert "last block (block 4)" in bell.observed
    # The final norm's TwoNN (50) would lift every layer mean by 10 if it were averaged.
    assert "start 1.000" in _finding(every, "(twonn)", "(causal)").observed


def test_every_family_of_checks_is_there_and_decided(planted) -> None:
    _, images, every, _ = planted
    expected_true = [
        ("flatter",), ("grows", "(causal)"), ("grows", "(bidirectional)"),
        ("entropy falls", "(causal)"), ("more sharply", "(causal)"),
        ("align", "(causal)"), ("align", "(bidirectional)"),
    ]
    for words in expected_true:
        finding = _finding(every, *words)
        assert finding.agrees, (words, finding.observed)
    assert _finding(every, "flatter").unit == "seed pairs"
    assert "the sign holds in 3 of 3 seed pairs" in _finding(every, "flatter").markdown()
    # Holm within each experiment: the adjusted p's are Holm's over the family's tested p's.
    tested = [f for f in every.values() if f.testable]
    assert len(tested) == 15  # 17 checks; the plateau's two are not measured (no id_scales)
    sizes = {"experiment 1": 4, "experiment 2": 5, "experiment 3": 6}
    for family, size in sizes.items():
        mine = [f for f in tested if f.family == family]
        assert len(mine) == size and all(f.family_size == size for f in mine)
        np.testing.assert_allclose([f.adjusted for f in mine], st.holm([f.p for f in mine]))
        assert all(f"tested checks of {family})" in f.markdown() for f in mine)
    assert all(f.adjusted <= st.ALPHA for f in every.values() if f.agrees)
    # The near-duplicate shares are 0 at the last probe in all 6 runs: the sign test's p is 2^-6.
    assert _finding(every, "near-duplicates").p == pytest.approx(2**-6)
    names = {Path(i).name for i in images}
    assert {"anisotropy_profiles.png", "twonn_vs_step.png", "gride_k16_vs_step.png",
            "anisotropy_vs_step_causal.png", "qk_cosine_bidirectional.png"} <= names


def test_render_states_seeds_vocabulary_and_protocol(tmp_path: Path) -> None:
    sweep = make_sweep(tmp_path / "runs")
    notes = tmp_path / "notes.md"
    notes.write_text("Closing notes.")
    out = tmp_path / "docs"
    text = report(["--shape-of-learning", str(sweep), "--notes", str(notes), "--out", str(out)])
    text = text.read_text()
    assert "3 causal (seeds 0, 1, 2), 3 bidirectional (seeds 0, 1, 2)" in text
    assert "vocabulary ours 200, paper 205" in text
    assert "4 positions from each of 2048 windows" in text and "batches of 4096" in text
    assert "mean over batches, with the std over batches" in text
    assert "of 3 seeds" in text and text.rstrip().endswith("Closing notes.")
    # The statistics section names each test and its reference, and the size of Holm's family.
    for words in ("Student's t test over seeds", "Welch 1947", "Berger 1982",
                  "Bonferroni over the candidates", "Westfall and Young (1993", "Hothorn, Bretz",
                  "Holm 1979", "one family per experiment",
                  "(experiment 1: 4, experiment 2: 5, experiment 3: 6 tested here)"):
        assert words in text, words
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (out / image).stat().st_size > 5_000, image


def test_hand_written_analyses_sit_between_the_generated_sections_and_the_notes(
    tmp_path: Path,
) -> None:
    out = tmp_path / "docs"
    (out / "results" / "analyses").mkdir(parents=True)
    (out / "results" / "analyses" / "means.png").write_bytes(b"png")
    analyses = tmp_path / "analyses.md"
    analyses.write_text("## 6. Analyses\n\n![means](results/analyses/means.png)\n")
    notes = tmp_path / "notes.md"
    notes.write_text("Closing notes.")
    common = ["--analyses", str(analyses), "--notes", str(notes), "--out", str(out)]
    text = report(common).read_text()
    assert text.index("## 6. Analyses") < text.index("## Scale and what it would take")
    assert "![means](results/analyses/means.png)" in text
    assert text.rstrip().endswith("Closing notes.")
    # rewriting the report keeps the hand-written section: it is read again, not edited in place
    assert report(common).read_text() == text

    analyses.write_text("## 6. Analyses\n\n![gone](results/analyses/gone.png)\n")
    with pytest.raises(FileNotFoundError, match=r"gone\.png.*relative to the report's folder"):
        report(common)


def test_drift_cosine_correlation_per_masking_in_godeys_section(tmp_path: Path) -> None:
    sweep = make_sweep(tmp_path / "runs")
    corr = report_module.drift_cosine(sweep)
    assert corr.loc["causal", "spearman rho"] == pytest.approx(1.0)
    assert corr.loc["causal", "pearson r"] == pytest.approx(1.0)
    assert corr.loc["bidirectional", "spearman rho"] == pytest.approx(-1.0)
    assert corr.loc["bidirectional", "pearson r"] == pytest.approx(-1.0)
    assert corr["step"].tolist() == [STEPS[-1]] * 2 and corr["blocks"].tolist() == [4, 4]
    assert corr["seeds"].tolist() == [3, 3]
    # 4 blocks: Spearman's exact p is at least 2/24 = 0.083 (rho = +-1); Pearson's reaches 0
    assert corr["spearman p<0.05"].tolist() == [0, 0] and corr["pearson p<0.05"].tolist() == [3, 3]
    text = report(["--shape-of-learning", str(sweep), "--out", str(tmp_path / "docs")]).read_text()
    godey = text.split("## 3. Attention sharpening")[1]
    assert "| causal | 1000 | 4 | 3 | 1.000 | 0 | 1.000 | 3 |" in godey
    assert "| bidirectional | 1000 | 4 | 3 | -1.000 | 0 | -1.000 | 3 |" in godey


def test_the_committed_layout_reads_without_hparams(tmp_path: Path) -> None:
    # Only probes/probes.parquet and .hydra/config.yaml per run: the vocabulary is then unknown,
    # and the report says so instead of typing a number.
    sweep = make_sweep(tmp_path / "runs", hparams=False)
    runs = find_runs(sweep)
    assert [r.path.name for r in runs["causal"]] == ["causal-seed0", "causal-seed1",
                                                     "causal-seed2"]
    assert report_module.vocab_size(runs["causal"][0]) is None
    text = report(["--shape-of-learning", str(sweep), "--out", str(tmp_path / "docs")]).read_text()
    assert "vocabulary ours not recorded in the run folders" in text


# ---------------------------------------------------------------------------------------------
# The real preset, trained in miniature (slow)


def run_probe(args: list[str]) -> None:
    """`python probe.py ARGS` as a user runs it."""
    proc = subprocess.run(
        [PYTHON, "probe.py", *args],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("shape_of_learning")
    run_train(
        [
            "-m",
            "experiment=shape_of_learning",
            "masking=causal,bidirectional",
            "seed=0",
            *tiny_overrides(),
            "trainer.max_steps=12",
            "trainer.val_check_interval=6",
            "probe.every_n_steps=4",
            "probe.log_spaced_until=4",
            "probe.n_log_spaced=3",
            f"hydra.sweep.dir={folder}",
        ]
    )
    return folder


@pytest.mark.slow
def test_the_preset_writes_one_run_per_masking(sweep: Path) -> None:
    for masking in ("causal", "bidirectional"):
        frame = read_table(sweep / f"{masking}-seed0")
        assert sorted(frame["step"].unique()) == [0, 1, 2, 4, 8, 12]
        assert {"anisotropy", "twonn", "attention_entropy", "qk_cosine"} <= set(frame["metric"])


@pytest.mark.slow
def test_report_has_every_experiment_with_figures_and_numbers_from_the_tables(
    sweep: Path, tmp_path: Path
) -> None:
    path = report(["--shape-of-learning", str(sweep), "--out", str(tmp_path)])
    text = path.read_text()
    for title in ("1. Decoder vs encoder", "2. Intrinsic dimension", "3. Attention sharpening"):
        assert f"## {title}" in text
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(images) >= 7
    for image in images:
        assert (tmp_path / image).stat().st_size > 5_000, image
    verdicts = re.findall(r"→ \*\*(agrees|not shown|not testable|not measured)\*\*", text)
    assert len(verdicts) >= 10 and "agrees" not in verdicts  # one seed: nothing is tested
    assert "not testable" in verdicts and "holds in" in text and "of 1 seeds" in text
    # The numbers in the report are the tables' numbers.
    causal = read_table(sweep / "causal-seed0")
    stacked = seeds.per_seed([causal], "anisotropy")
    end, _ = seeds.grid(stacked, step=int(causal["step"].max()))
    start, _ = seeds.grid(stacked, step=0)
    assert f"block 1 {end.iloc[0, 0] - start.iloc[0, 0]:.3f}" in text  # "anisotropy grows"
    # Two blocks have no interior block: the bell shape is reported as untestable.
    assert "the model has 2 blocks: no interior block" in text
    assert "gpt_tiny (2 layers, d=32), data=sample, 12 steps" in text
    assert re.search(r"vocabulary ours \d+, paper 205", text)


@pytest.mark.slow
def test_distributions_experiment_reports_the_best_family_per_layer(
    sweep: Path, tmp_path: Path
) -> None:
    # Experiment 5: probe.py on the decoder's last checkpoint (distribution fits on by default).
    run_probe(
        [
            f"ckpt={sweep / 'causal-seed0' / 'checkpoints' / 'last.ckpt'}",
            "settings.distribution_samples=500",
            f"hydra.run.dir={tmp_path / 'probe'}",
        ]
    )
    path = report(["--distributions", str(tmp_path / "probe"), "--out", str(tmp_path / "docs")])
    text = path.read_text()
    assert "## 5. Activation distributions" in text
    table = [line for line in text.splitlines() if line.startswith("| ") and "layer" not in line]
    # embedding + 2 blocks of the tiny model + its final norm, named
    assert len(table) == 4 and "| final_norm |" in table[-1]
    from repgeom.metrics.distributions import FAMILIES

    families = set(FAMILIES)  # genlogistic and crystalball joined the five first families
    for line in table:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2] in families and cells[3] in families
        assert int(cells[5]) >= 1


def test_the_scale_sentence_reads_the_steps_every_seed_reads(tmp_path: Path) -> None:
    """One seed without a plateau at step 0 (every block NaN there): the sentence's plateau
    reading starts at the first step every seed reads, and says so; the claim's start is not
    moved there: the claim is not measured."""
    import pandas as pd

    sweep = make_sweep(tmp_path / "sweep", plateau=True)
    table_path = sweep / "causal-seed0" / "probes" / "probes.parquet"
    frame = pd.read_parquet(table_path)
    first = int(frame["step"].min())
    gone = frame["metric"].str.startswith("id_plateau") & (frame["step"] == first)
    frame.loc[gone, "value"] = float("nan")
    frame.to_parquet(table_path)
    _, findings, _ = shape_of_learning(sweep, tmp_path / "figures")
    claim = _finding({f.claim: f for f in findings["id"]}, "(id_plateau)", "(causal)")
    second = sorted(frame["step"].unique())[1]
    # The claim's start is not moved to the first step every seed reads: it is not measured.
    assert claim.verdict == "not measured" and "not moved to a later step" in claim.observed
    assert "→ **not measured**" in claim.markdown()
    text = report_module.id_scale_lines(sweep)[0]
    assert f"(steps {second} → " in text and "smallest scale" in text
