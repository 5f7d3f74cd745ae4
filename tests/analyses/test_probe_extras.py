"""`repgeom.analyses.probe_extras.probe`, probe.py's entry: a ``follow=`` job goes to the
worker of an offloaded training run (`runner.follow_job`), never to the probe pipeline."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra_configs import compose_job

from repgeom.analyses import probe_extras
from repgeom.probes.core import table
from repgeom.probes.run import runner


def test_a_follow_job_goes_to_the_worker_and_the_pipeline_refuses_it(tmp_path, monkeypatch):
    job = compose_job(tmp_path, [f"follow={tmp_path}", "follow_timeout_s=30",
                                 "keep_snapshots=true", "follow_lock=file"])
    calls = []

    def worker(folder, **options):  # stands in for offload.follow.follow: no training run
        calls.append((folder, options))
        return SimpleNamespace(run_dir=Path(folder), frame=table.rows_to_frame([]),
                               plots=[Path(folder) / "a.png"])

    monkeypatch.setattr(runner, "follow", worker)
    result = probe_extras.probe(job)
    assert calls == [(str(tmp_path), {"device": job.device, "timeout_s": 30.0,
                                      "keep_snapshots": True, "lock": "file"})]
    assert result.output_dir == tmp_path and result.subjects == []
    assert result.plots == [tmp_path / "a.png"]
    with pytest.raises(ValueError, match="follow_job"):
        runner.probe(job)
    assert len(calls) == 1  # the pipeline started no worker
