"""A trajectory spread over jobs (`shard=`/`shards=`) and merged back into one table that equals
a single job's (`repgeom.probes.run.shards`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cli_runs import run_probe_py
from hub_server import FakeHub
from hydra_configs import compose_probe

from repgeom.probes.core import table
from repgeom.probes.run import runner, schedule, sources
from repgeom.probes.run.job import probe_job
from repgeom.probes.run.shards import KEYS, merge_shards, shard_groups

STEPS = (100, 200, 300, 400, 500)


def test_shard_of_spreads_every_revision_once() -> None:
    items = [f"step{s}" for s in range(11)]
    shares = [sources.shard_of(items, k, 4) for k in range(4)]
    assert shares[1] == ["step1", "step5", "step9"]
    assert sorted(sum(shares, [])) == sorted(items)
    assert sources.shard_of(items, None, None) == items


@pytest.mark.parametrize(("shard", "shards", "mode", "message"), [
    (0, None, "hf", "give shard= and shards= together"),
    (4, 4, "hf", r"shard=4 must lie in 0..shards-1 = 0..3"),
    (-1, 2, "run", "shard must be a non-negative integer"),
    (0, "2", "run", "shards must be a non-negative integer"),
    (0, 2, "ckpt", "shards split a trajectory"),
])
def test_bad_shard_options(shard, shards, mode, message) -> None:
    with pytest.raises(ValueError, match=message):
        schedule.check_shard(shard, shards, mode)


@pytest.fixture(scope="module")
def hub(tiny_hf_folder):
    """Five step revisions of one tiny GPT-2, two different models in turn."""
    folders = {f"step{s}": tiny_hf_folder("gpt2" if i % 2 == 0 else "gpt2-scaled")
               for i, s in enumerate(STEPS)}
    with FakeHub("org/sharded", folders) as fake:
        yield fake


def _probe(hub, tmp_path: Path, text_file: Path, *args: str):
    common = ["hf=org/sharded", "hf_revisions=all", f"text_file={text_file}", "window=32",
              "n_states=128", "settings.state_batch_size=128", "settings.max_order=8",
              "settings.distributions=false", "settings.attention=false",
              "metrics=[anisotropy,intrinsic_dimension,linear_cka]",
              "plot_metrics=[anisotropy]", "device=cpu"]
    flags = [a for a in args if a.startswith("-")]  # -m goes before the overrides
    done = run_probe_py([*flags, *common, *(a for a in args if a not in flags)],
                        HF_ENDPOINT=hub.url,
                        HF_HOME=str(tmp_path / "hf_home"))
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def text_file(tmp_path_factory, tiny_text) -> Path:
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text(tiny_text * 3)
    return path


@pytest.mark.slow  # three probe.py processes
def test_shards_merge_to_the_single_job_table(hub, tmp_path, text_file) -> None:
    sweep, single = tmp_path / "sweep", tmp_path / "single"
    done = _probe(hub, tmp_path, text_file, "-m", "shard=0,1", "shards=2",
                  f"hydra.sweep.dir={sweep}")
    _probe(hub, tmp_path, text_file, f"hydra.run.dir={single}")

    # Each job probed its share: shard 1 owns steps 200 and 400, and probed the final revision
    # (owned by shard 0) only for the states its comparisons with the final need.
    owned = {k: sorted(table.read_table(sweep / str(k))["step"].unique()) for k in (0, 1)}
    assert owned == {0: [100, 300, 500], 1: [200, 400]}
    shard_1 = table.read_table(sweep / "1")
    vs_final = shard_1.loc[shard_1["step_b"] == 500]  # each revision against the final one
    assert sorted(vs_final["step"].unique()) == [200, 400]
    assert set(vs_final["metric"]) == {"linear_cka"}
    info = json.loads((sweep / "1" / "probe_info.json").read_text())
    assert [s["reference"] for s in info["subjects"]] == [False, False, True]

    # Merged when the sweep ended; equal to the single job's table row for row.
    assert "Merged 2 shards" in done.stdout
    merged, whole = table.read_table(sweep / "merged"), table.read_table(single)
    keys = [k for k in KEYS if k in whole.columns]
    merged, whole = (f.sort_values(keys, na_position="first").reset_index(drop=True)
                     for f in (merged, whole))
    pd.testing.assert_frame_equal(merged[keys], whole[keys], check_dtype=False)
    # Same revisions, windows and seeds in another process: float32 kernels only.
    # Another process. Its first forward used to round differently now and then under load
    # (3.7e-6 to 2.0e-5 relative, 3 of ~25 runs; `repgeom.models.hf.capture._settle_first_call`
    # now throws that forward away); the tolerance stays as a margin. Rows, steps and labels
    # above are exact.
    np.testing.assert_allclose(merged["value"], whole["value"], rtol=1e-4, atol=1e-9)
    assert (sweep / "merged" / "probes" / "plots" / "vs_step_anisotropy.png").exists()
    assert (sweep / "merged" / "probes" / "phases.csv").exists()
    assert not (sweep / "survey").exists()  # the shards of one model are no survey


def test_a_missing_shard_is_named(tmp_path) -> None:
    for shard in (0, 2):
        folder = tmp_path / str(shard)
        folder.mkdir()
        (folder / "probe_info.json").write_text(json.dumps(
            {"config": {"shard": shard, "shards": 3, "hf": "x", "output_dir": str(folder)},
             "subjects": [], "mode": "hf"}))
    (folders,) = shard_groups(tmp_path)
    with pytest.raises(ValueError, match=r"shards=3 but the folders hold shards \[0, 2\]: "
                                         r"shard\(s\) \[1\] missing"):
        merge_shards(folders, tmp_path / "merged")



def _record(folder: Path, overrides: list[str], *, recorded: bool = True) -> Path:
    """``probe_info.json`` as the shard job of `overrides` (``probe.py -m hf=org/sharded ...``)
    writes it: its config as recorded (resolved), and its logger group as written when
    `recorded` (a record from before holds none)."""
    job = probe_job(compose_probe(folder, ["hf=org/sharded", "hf_revisions=[step100,step200]",
                                           *overrides]))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "probe_info.json").write_text(json.dumps(
        {"config": job.config, "mode": "hf", **({"logger": job.logger} if recorded else {}),
         "subjects": [{"model": "org/sharded", "stack": None, "reference": False}]},
        default=str))
    return folder


def _w_and_b_shards(sweep: Path, recorded: bool) -> list[Path]:
    """Two shard folders as ``probe.py -m ... logger=wandb shard=0,1 shards=2`` leaves them:
    a one-row table each and `_record`'s ``probe_info.json``."""
    folders = []
    for shard in (0, 1):
        folder = _record(sweep / str(shard), ["logger=wandb", f"shard={shard}", "shards=2"],
                         recorded=recorded)
        rows = [{"step": 100 * (shard + 1), "layer": 0, "layer_name": "embedding", "head": None,
                 "metric": "anisotropy", "value": 0.5, "std": None, "model": "org/sharded"}]
        table.write_table(table.rows_to_frame(rows), table.probe_dir(folder))
        folders.append(folder)
    return folders


def _rewrite_info(folders: list[Path], change) -> None:
    """Apply `change` to each folder's ``probe_info.json``."""
    for folder in folders:
        info = json.loads((folder / "probe_info.json").read_text())
        change(info)
        (folder / "probe_info.json").write_text(json.dumps(info))


@pytest.mark.parametrize("recorded", [True, False])
def test_shards_that_log_to_w_and_b_are_one_group(recorded, tmp_path) -> None:
    # Resolved, each shard's logger save_dir is its own folder: keyed on it, every shard was a
    # group of one, and the merge failed for the "missing" shards.
    folders = _w_and_b_shards(tmp_path / "sweep", recorded)
    assert shard_groups(tmp_path / "sweep") == [folders]


class _Started(Exception):
    """Raised by the stand-in `wandb.init`: the arguments a W&B run would have started with."""


@pytest.fixture
def wandb_start(monkeypatch) -> None:
    """The merge's W&B run stopped as it starts: `_Started` carries `wandb.init`'s arguments."""
    import wandb

    def started(**kwargs):
        raise _Started(kwargs)

    monkeypatch.setattr(wandb, "init", started)
    monkeypatch.setattr(runner, "save_figures", lambda *a, **k: [])


@pytest.mark.parametrize("recorded", [True, False])
def test_the_merged_w_and_b_run_lives_in_the_merged_folder(recorded, tmp_path,
                                                          wandb_start) -> None:
    # Each shard job records its config resolved (probe_info.json); the merged job is rebuilt
    # from the first one's with output_dir set to the merged folder. Its W&B run keeps its id
    # there (`loggers.run_folder`), and its files should be there too, not in shard 0's folder.
    folders = _w_and_b_shards(tmp_path / "sweep", recorded)
    merged = tmp_path / "sweep" / "merged"
    with pytest.raises(_Started) as run:
        merge_shards(folders, merged)
    assert (merged / "wandb_run_id.txt").exists()  # the id: in the merged folder
    assert run.value.args[0]["dir"] == str(merged.resolve())  # the files: not shard 0's folder
    assert run.value.args[0]["name"] == "probe-org-sharded-merged"


# The logger group as written is not resolved again outside the jobs' Hydra context, and older
# records (no "logger") group with newer ones (review).


def test_a_logger_interpolating_hydra_still_merges(tmp_path, monkeypatch, wandb_start) -> None:
    # e.g. logger.wandb.group='${hydra:job.name}': resolved in each shard job, where Hydra set
    # HydraConfig; in the sweep's on_multirun_end HydraConfig is unset (run_job restores it).
    from hydra.core.hydra_config import HydraConfig

    folders = _w_and_b_shards(tmp_path / "sweep", True)
    _rewrite_info(folders, lambda info: info["logger"]["wandb"].update(group="${hydra:job.name}"))
    assert shard_groups(tmp_path / "sweep") == [folders]
    merged = tmp_path / "sweep" / "merged"
    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)  # as in on_multirun_end
    with pytest.raises(_Started) as run:
        merge_shards(folders, merged)
    assert run.value.args[0]["dir"] == str(merged.resolve())


@pytest.mark.parametrize("logger", [
    [],  # logger=none, the default
    # The CSV logger's name (csv) is written as a value, also under logger=wandb (review).
    ["logger=wandb"], ["logger=csv"],
    ["logger=wandb", "logger.wandb.name=x-${shard}"],
    ["logger=wandb", "logger.wandb.save_dir=/some/path"],
])
def test_a_shard_rerun_after_the_upgrade_joins_its_sweep(logger, tmp_path) -> None:
    sweep = tmp_path / "sweep"
    folders = [_record(sweep / str(shard), [*logger, f"shard={shard}", "shards=2"],
                       recorded=recorded) for shard, recorded in ((0, False), (1, True))]
    assert shard_groups(sweep) == [folders]


@pytest.mark.parametrize("older_shard_0", [False, True])
def test_a_sweep_over_w_and_b_names_merges_each_name_apart(older_shard_0, tmp_path) -> None:
    # ``probe.py -m ... logger=wandb logger.wandb.name=a,b shard=0,1 shards=2``: a name written
    # as a value is the group's, not each job's; keyed without it, the four jobs were one group
    # and the merge failed for "repeated" shards. `older_shard_0`: shard 0 of each name
    # recorded before the written group joins the group whose name it resolved to (review).
    sweep = tmp_path / "sweep"
    expected = {}
    for job_number, (name, shard) in enumerate((n, s) for n in "ab" for s in (0, 1)):
        folder = _record(sweep / str(job_number),
                         ["logger=wandb", f"logger.wandb.name={name}", f"shard={shard}",
                          "shards=2"], recorded=bool(shard) or not older_shard_0)
        expected.setdefault(name, []).append(folder)
    assert sorted(shard_groups(sweep)) == sorted(expected.values())


def test_the_merged_run_of_a_named_group_keeps_its_name(tmp_path, wandb_start) -> None:
    # logger.wandb.name=a,b: the merged run of group a is named a, in the merged folder (review).
    def name_a(info):
        info["logger"]["wandb"]["name"] = info["config"]["logger"]["wandb"]["name"] = "a"

    folders = _w_and_b_shards(tmp_path / "sweep", True)
    _rewrite_info(folders, name_a)
    assert shard_groups(tmp_path / "sweep") == [folders]
    merged = tmp_path / "sweep" / "merged"
    with pytest.raises(_Started) as run:
        merge_shards(folders, merged)
    assert run.value.args[0]["name"] == "a"
    assert run.value.args[0]["dir"] == str(merged.resolve())


def test_a_logger_written_as_one_interpolation_groups_and_merges_as_an_older_record(
        tmp_path, wandb_start) -> None:
    # e.g. logger.wandb='${oc.select:site.wandb}': the written entry is a string, not settings;
    # the merged run, as an older record's, lives in the merged folder under the merged name
    # (it was shard 0's folder, second review).
    folders = _w_and_b_shards(tmp_path / "sweep", True)
    _rewrite_info(folders, lambda info: info["logger"].update(wandb="${oc.select:site.wandb}"))
    assert shard_groups(tmp_path / "sweep") == [folders]
    merged = tmp_path / "sweep" / "merged"
    with pytest.raises(_Started) as run:
        merge_shards(folders, merged)
    assert run.value.args[0]["dir"] == str(merged.resolve())
    assert run.value.args[0]["name"] == "probe-org-sharded-merged"


@pytest.mark.parametrize("older", ["none", "first", "second", "both"])
def test_the_groups_come_in_the_order_of_their_first_folder(older, tmp_path) -> None:
    # ``window=32,64 shard=0,1``: merged-0 is window 32's whatever records are older; a group of
    # older records only came last, so a shard re-run after the upgrade swapped merged-0 and
    # merged-1 (and the new merged-0 resumed the other trajectory's W&B run; second review).
    sweep = tmp_path / "sweep"
    groups = [[], []]
    for job_number, (trajectory, shard) in enumerate((t, s) for t in (0, 1) for s in (0, 1)):
        older_here = older == "both" or older == ("first", "second")[trajectory]
        groups[trajectory].append(_record(
            sweep / str(job_number), ["logger=wandb", f"window={(32, 64)[trajectory]}",
                                      f"shard={shard}", "shards=2"], recorded=not older_here))
    assert shard_groups(sweep) == groups


@pytest.mark.parametrize("plain_first", [True, False])
def test_an_older_record_matching_two_groups_joins_the_closer(plain_first, tmp_path) -> None:
    # ``logger.wandb.save_dir=/p,'${output_dir}'``, the /p trajectory's shard 0 recorded before
    # the written group: it reads as either group's; /p, kept as a value, is the closer match.
    sweep = tmp_path / "sweep"
    plain, interpolated = ("0", "1"), ("2", "3")
    if not plain_first:
        plain, interpolated = interpolated, plain
    with_p = [_record(sweep / plain[shard], ["logger=wandb", "logger.wandb.save_dir=/p",
                                              f"shard={shard}", "shards=2"], recorded=bool(shard))
              for shard in (0, 1)]
    without = [_record(sweep / interpolated[shard], ["logger=wandb", f"shard={shard}",
                                                     "shards=2"]) for shard in (0, 1)]
    assert shard_groups(sweep) == ([with_p, without] if plain_first else [without, with_p])
