"""`repgeom.loggers`: the W&B runs of probe.py start without Lightning, with what a training
run's logger would give them (offline rule, id file, name, group)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_runs import subprocess_env
from hydra_configs import compose_probe


def test_probe_py_w_and_b_runs_start_without_lightning(tmp_path: Path) -> None:
    cfg = compose_probe(tmp_path, ["hf=gpt2", "logger=wandb", "run_name=my-probe"])
    (tmp_path / "cfg.yaml").write_text(__import__("omegaconf").OmegaConf.to_yaml(cfg))
    code = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        from omegaconf import OmegaConf
        from repgeom.loggers import wandb_runs
        cfg = OmegaConf.load({str(tmp_path / 'cfg.yaml')!r})
        run, = wandb_runs(cfg)  # in cfg.output_dir, tmp_path
        print(json.dumps({{"lightning": [m for m in sys.modules if m.startswith("lightning.")],
                          "name": run.name, "id": run.id, "offline": run.settings.mode,
                          "dir": run.dir}}))
        run.finish()
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=subprocess_env(WANDB_MODE="offline"), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["lightning"] == []  # not even lightning.pytorch: no Trainer for a probe
    assert seen["name"] == "my-probe" and seen["offline"] == "offline"
    assert seen["id"] == (tmp_path / "wandb_run_id.txt").read_text().strip()  # resumable
    assert seen["dir"].startswith(str(tmp_path))


def test_a_run_without_a_folder_is_refused(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from repgeom.loggers import run_folder

    with pytest.raises(ValueError, match="output_dir is not set"):
        run_folder(OmegaConf.create({"output_dir": None}))
    assert run_folder(OmegaConf.create({"output_dir": str(tmp_path / "a" / ".." / "b")})) == \
        (tmp_path / "b").resolve()
