"""Survey across models: `probe.py -m hf=a,b` probes each model and, when the sweep ends, draws
all of them on relative depth (`repgeom.probes.report.survey`); the CLI redraws from the folders."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cli_runs import run_probe_py
from probe_runs import SMALL

from repgeom.cli import survey as survey_command
from repgeom.probes.core import table
from repgeom.probes.report import plots, survey
from repgeom.probes.report.drift_cosine import CSV_NAME, drift_cosine_correlation

KIND = {"gpt2": "decoder", "bert": "encoder"}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, tiny_hf_folder, tiny_text) -> tuple[Path, dict[str, str]]:
    """One multirun over a tiny GPT-2 (2 blocks + ln_f) and a tiny BERT (2 blocks, post-LN)."""
    root = tmp_path_factory.mktemp("survey")
    text = root / "text.txt"
    text.write_text(tiny_text * 3)
    folders = {family: tiny_hf_folder(family) for family in KIND}
    args = ["-m", f"hf={folders['gpt2']},{folders['bert']}", f"text_file={text}", "window=32",
            *SMALL, "settings.intrinsic_dimension=false", "settings.distributions=false",
            "plot_metrics=[anisotropy,mean_cosine,twonn]", f"hydra.sweep.dir={root / 'sweep'}"]
    done = run_probe_py(args, COLUMNS="160")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Survey of 2 probe folders" in done.stdout
    assert done.stdout.count("Godey 2024") == 2  # each model's console summary
    return root / "sweep", folders


@pytest.mark.slow
def test_the_sweep_writes_one_table_of_every_model_on_relative_depth(sweep) -> None:
    root, folders = sweep
    frame = pd.read_csv(root / "survey" / "survey.csv")
    kinds = frame.drop_duplicates("model").set_index("model")["kind"].to_dict()
    assert kinds == {folders["gpt2"]: "decoder", folders["bert"]: "encoder"}
    for family, model in folders.items():
        rows = frame[(frame["model"] == model) & (frame["metric"] == "anisotropy")]
        rows = rows.sort_values("layer")
        blocks = rows[rows["layer_name"] != "final_norm"]
        assert blocks["depth"].tolist() == [0.0, 0.5, 1.0]  # embedding, block 1 of 2, block 2
        final = rows[rows["layer_name"] == "final_norm"]
        assert len(final) == (1 if family == "gpt2" else 0) and final["depth"].isna().all()
        # The values are the model's own table's.
        own = table.read_table(root / ("0" if family == "gpt2" else "1"))
        own = own.query("metric == 'anisotropy'").sort_values("layer")
        np.testing.assert_allclose(rows["value"], own["value"])
    # twonn was asked for but not probed (intrinsic_dimension=false): skipped, not an error.
    assert sorted(p.name for p in (root / "survey").glob("*.png")) == [
        "survey_anisotropy.png", "survey_mean_cosine.png"]


@pytest.mark.slow
def test_the_figure_has_one_line_per_model_solid_decoder_dashed_encoder(sweep) -> None:
    root, folders = sweep
    frame = survey.survey_table(survey.probe_folders([root]))
    ax = plots.survey_profile(frame, "mean_cosine").axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()
             if not line.get_label().startswith("_")}
    short = {f: "/".join(Path(folders[f]).parts[-2:]) for f in KIND}  # local folders
    gpt2, bert = f"{short['gpt2']} (decoder)", f"{short['bert']} (encoder)"
    assert set(lines) == {gpt2, bert}
    assert lines[gpt2].get_linestyle() == "-" and lines[bert].get_linestyle() == "--"
    for line in lines.values():
        assert list(line.get_xdata()) == [0.0, 0.5, 1.0]
    expected = frame[(frame["model"] == folders["bert"]) & (frame["metric"] == "mean_cosine")]
    np.testing.assert_allclose(lines[bert].get_ydata(), expected.sort_values("layer")["value"])
    # GPT-2's final norm: one open marker, apart from the blocks at 1 + FINAL_NORM_GAP.
    apart = [line for line in ax.get_lines()
             if list(line.get_xdata()) == [1 + plots.FINAL_NORM_GAP]]
    assert len(apart) == 1 and apart[0].get_markerfacecolor() == "white"
    assert [t.get_text() for t in ax.get_xticklabels()][-1] == "final\nnorm"


@pytest.mark.slow
def test_drift_cosine_is_written_per_probe_and_per_model(sweep) -> None:
    root, folders = sweep
    for sub in ("0", "1"):
        written = pd.read_csv(root / sub / "probes" / CSV_NAME)
        expected = drift_cosine_correlation(table.read_table(root / sub))
        assert written["n_layers"].tolist() == expected["n_layers"].tolist() == [2]
        assert written["spearman_rho"].isna().all()  # two blocks: below the test's 3 points
    both = pd.read_csv(root / "survey" / CSV_NAME)
    assert sorted(both["model"]) == sorted(folders.values())


def test_relative_depth_of_models_of_different_depths(tmp_path) -> None:
    # A 4-block decoder with a final norm and a 2-block encoder, written as probe.py writes them;
    # the 4-block model was probed at two steps: its last one is surveyed.
    for name, blocks, kind, final in (("deep", 4, "decoder", True), ("flat", 2, "encoder", False)):
        folder = tmp_path / name
        rows = [dict(step=step, layer=layer, metric="anisotropy", value=10 * step + layer,
                     model=name, layer_name="final_norm" if layer == blocks + 1 else None)
                for step in ((0, 7) if name == "deep" else (0,))
                for layer in range(blocks + 1 + final)]
        table.append_rows(table.probe_dir(folder), rows)
        info = {"subjects": [{"label": name, "model": name, "kind": kind}]}
        (folder / survey.INFO_FILE).write_text(json.dumps(info))
    frame = survey.survey_table(survey.probe_folders([tmp_path]))
    deep = frame[frame["model"] == "deep"].sort_values("layer")
    assert deep["step"].unique().tolist() == [7]
    assert deep["depth"].tolist()[:5] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert np.isnan(deep["depth"].iloc[5]) and deep["value"].tolist() == [70, 71, 72, 73, 74, 75]
    flat = frame[frame["model"] == "flat"].sort_values("layer")
    assert flat["depth"].tolist() == [0.0, 0.5, 1.0] and set(flat["kind"]) == {"encoder"}
    ax = plots.survey_profile(frame, "anisotropy").axes[0]
    labelled = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
    assert [line.get_label() for line in labelled] == ["deep (decoder)", "flat (encoder)"]
    assert list(labelled[0].get_xdata()) == [0.0, 0.25, 0.5, 0.75, 1.0]


@pytest.mark.slow
def test_cli_and_its_errors(sweep, tmp_path, capsys) -> None:
    root, _ = sweep
    paths = survey_command.main([str(root / "0"), str(root / "1"), "--out", str(tmp_path),
                         "--metrics", "anisotropy"])
    assert [p.name for p in paths] == ["survey_anisotropy.png"]
    assert "2 probe folders" in capsys.readouterr().out
    with pytest.raises(ValueError, match="metric 'twonn' is not in the table; available"):
        survey_command.main([str(root), "--out", str(tmp_path), "--metrics", "twonn"])
    with pytest.raises(ValueError, match="give each model once"):
        survey.survey_table([root / "0", root / "0"])
    with pytest.raises(FileNotFoundError, match="not a probe.py output folder"):
        survey.probe_folders([tmp_path])
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['depth', 'kind'\]: build it"):
        plots.survey_profile(table.read_table(root / "0"), "anisotropy")
    with pytest.raises(ValueError, match="out is needed with several folders"):
        survey_command.main([str(root / "0"), str(root / "1")])
