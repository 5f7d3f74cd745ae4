"""probe.py's job (`repgeom.probes.run.job`): conf/probe.yaml read and checked once, into a
frozen `ProbeJob` whose fields carry the config keys' names."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from hydra_configs import compose_probe
from omegaconf import OmegaConf

from repgeom.models.hub.calls import RETRY_BUDGET_S
from repgeom.probes.core.spec import ProbeRequest
from repgeom.probes.run.job import CompareTexts, Labels, ProbeJob, probe_job, probe_request

ROOT = Path(__file__).resolve().parents[3]


def test_every_option_of_probe_yaml_is_a_field_of_the_job() -> None:
    """A new option of conf/probe.yaml is a field of `ProbeJob` (or of its `ProbeRequest`) of
    the same name: the job is the only way options reach the pipeline."""
    keys = set(OmegaConf.load(ROOT / "conf" / "probe.yaml")) - {"defaults", "hydra"}
    keys |= {"logger", "protocol"}  # the config groups of its defaults list
    fields = {f.name for f in dataclasses.fields(ProbeJob)}
    fields |= {f.name for f in dataclasses.fields(ProbeRequest)}
    assert keys - fields == set()


def test_the_job_holds_the_checked_options(tmp_path) -> None:
    cfg = compose_probe(tmp_path, [
        "hf=org/model", "hf_revisions=[step1,step2]", "max_revisions=2", "shard=1", "shards=2",
        f"work_dir={tmp_path / 'w'}", "keep_weights=true", "retry_budget_s=5", "device=cpu",
        "plot_metrics=[twonn]", "tokenizer=gpt2", "model_name=tiny", "n_states=64",
        "compare.text_a=a", "compare.text_b=b", "tags=[x,y]"])
    job = probe_job(cfg)
    assert (job.mode, job.hf, job.run, job.ckpt) == ("hf", "org/model", None, None)
    assert job.hf_revisions == ("step1", "step2") and job.max_revisions == 2
    assert (job.shard, job.shards) == (1, 2)
    assert job.work_dir == tmp_path / "w" and job.keep_weights is True
    assert job.retry_budget_s == 5.0 and isinstance(job.retry_budget_s, float)
    assert job.device == torch.device("cpu") and job.output_dir == tmp_path.resolve()
    assert job.plot_metrics == ("twonn",) and job.tags == ("x", "y")
    assert (job.tokenizer, job.model_name) == ("gpt2", "tiny")
    assert job.compare == CompareTexts("a", "b") and job.labels == Labels()
    assert job.request == probe_request(cfg) and job.request.n_states == 64
    assert job.protocol == "repgeom"
    # what probe_info.json records: the whole config, resolved; W&B's logger entries as written
    assert job.config == OmegaConf.to_container(cfg, resolve=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.hf = "other"  # type: ignore[misc]


def test_defaults_and_follow(tmp_path) -> None:
    job = probe_job(compose_probe(tmp_path, ["ckpt=x.ckpt"]))
    assert job.retry_budget_s == RETRY_BUDGET_S and job.hf_revisions is None
    assert job.compare is None and job.plot_metrics is None and job.work_dir is None
    follow = probe_job(compose_probe(tmp_path, [f"follow={tmp_path}", "follow_timeout_s=30",
                                                "keep_snapshots=true", "follow_lock=file"]))
    assert (follow.mode, follow.follow, follow.follow_timeout_s) == ("follow", str(tmp_path), 30)
    assert follow.keep_snapshots is True and follow.follow_lock == "file"


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["hf=gpt2", "retry_budget_s=-1"], "retry_budget_s must be a number of seconds >= 0"),
        (["hf=gpt2", "follow=run"], "follow= probes a training run's snapshots"),
        (["ckpt=x.ckpt", "max_revisions=5"], "max_revisions thins a trajectory"),
        (["hf=gpt2", "hf_revisions=[a]", "shard=0"], "give shard= and shards= together"),
        (["hf=gpt2", "hf_revisions=step1"], "hf_revisions='step1': give 'all'"),
        (["hf=gpt2", "n_states=0"], "n_states must be a positive integer"),
        (["hf=gpt2", "compare.text_a=a", "compare.text_b=''"], "compare needs both"),
    ],
)
def test_a_bad_option_is_refused_by_name(tmp_path, overrides, match) -> None:
    with pytest.raises(ValueError, match=match):
        probe_job(compose_probe(tmp_path, overrides))


def _documented_commands() -> list[list[str]]:
    """The overrides of every ``python probe.py`` line in the code blocks of README.md and
    docs/*.md; a sweep (``-m hf=a,b``) by its first job."""
    import re
    import shlex

    commands = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```[a-z]*\n(.*?)```", path.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                if not line.strip().startswith("python probe.py"):
                    continue
                words = [w for w in shlex.split(line, comments=True)[2:] if w != "-m"]
                commands.append([re.sub(r"=([^\[,]*),[^\[]*$", r"=\1", w) for w in words])
    return commands


def test_every_documented_command_builds_a_job(tmp_path, monkeypatch) -> None:
    """Each probe.py command of the README and docs composes and passes the job's checks (no
    model is loaded: the checks need none; data/examples/ is read from the checkout)."""
    commands = _documented_commands()
    assert len(commands) >= 8 and ["hf=gpt2"] in commands
    monkeypatch.chdir(ROOT)
    for words in commands:
        words = [w for w in words if not w.startswith("hydra")]
        job = probe_job(compose_probe(tmp_path, words))
        assert job.mode in ("run", "ckpt", "hf", "follow"), words
