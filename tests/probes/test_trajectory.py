"""probe.py over a hub model's revisions, streamed (`repgeom.probes.trajectory`): downloaded into a
working folder and deleted, the user's cache left alone, resumable after kill -9, retried
downloads, flat memory, per-revision costs."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cli_runs import PYTHON, run_probe_py, subprocess_env
from hub_server import FakeHub, commit_of
from hydra_configs import ROOT

from repgeom.probes import table
from repgeom.probes.trajectory import timings

pytestmark = pytest.mark.slow  # probe.py processes against the hub stand-in

STEPS = tuple(range(10, 90, 10))  # eight revisions
KEYS = ["step", "step_b", "layer", "layer_b", "head", "metric"]


@pytest.fixture(scope="module")
def folders(tiny_hf_folder) -> dict[str, str]:
    return {f"step{s}": tiny_hf_folder("gpt2" if i % 2 == 0 else "gpt2-scaled")
            for i, s in enumerate(STEPS)}


@pytest.fixture(scope="module")
def text_file(tmp_path_factory, tiny_text) -> Path:
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text(tiny_text * 3)
    return path


def _args(text_file: Path, out: Path) -> list[str]:
    return ["hf=org/steps", "hf_revisions=all", f"text_file={text_file}", "window=32",
            "n_states=128", "settings.state_batch_size=128", "settings.max_order=8",
            "settings.distributions=false", "metrics=[anisotropy,linear_cka]",
            "plot_metrics=[]", "device=cpu", f"hydra.run.dir={out}"]


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    keys = [k for k in KEYS if k in frame.columns]
    return frame.sort_values(keys, na_position="first").reset_index(drop=True)


@pytest.fixture(scope="module")
def uninterrupted(folders, text_file, tmp_path_factory):
    """One run over the eight revisions, the first already in the user's cache."""
    root = tmp_path_factory.mktemp("uninterrupted")
    out, home = root / "out", root / "hf_home"
    with FakeHub("org/steps", folders) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(home)}
        # The user had step10 before: it is in their Hugging Face cache, complete.
        code = "import huggingface_hub as h; h.snapshot_download('org/steps', revision='step10')"
        subprocess.run([PYTHON, "-c", code], env=subprocess_env(**env), check=True)
        cached = sorted((home / "hub").rglob("*"))
        assert any(p.name == "model.safetensors" for p in cached)
        done = run_probe_py(_args(text_file, out), **env)
        assert done.returncode == 0, done.stderr[-3000:]
        downloads = hub.downloads()
    return out, home, cached, downloads


def test_revisions_stream_through_a_working_folder(uninterrupted, folders) -> None:
    out, home, cached, downloads = uninterrupted
    frame = table.read_table(out)
    assert sorted(frame["step"].unique()) == list(STEPS)
    # Every revision but the cached one came from the hub, into repgeom's working folder, and
    # was deleted once probed: nothing is left there, nothing new is in the user's cache
    # (beyond the config a first look at the model reads), which is untouched.
    assert {r for r, _ in downloads} == set(folders)
    assert not any((out / "work").rglob("*.safetensors"))
    snapshots = home / "hub" / "models--org--steps" / "snapshots"
    assert not any(any((snapshots / commit_of(f"step{s}")).glob("*.safetensors"))
                   for s in STEPS[1:])
    assert all(p.exists() for p in cached)
    # The costs of each revision: the cached one downloaded nothing.
    costs = timings(out).set_index("step")
    assert sorted(costs.index) == list(STEPS)
    assert costs.loc[10, "download_bytes"] == 0 and (costs.loc[20:, "download_bytes"] > 0).all()
    assert (costs[["load_s", "forward_s", "metrics_s"]] > 0).all().all()


def test_memory_stays_flat(uninterrupted) -> None:
    """Model, hooks and states are released after each revision: the resident memory after the
    last revision is within 10% of that after the third."""
    costs = timings(uninterrupted[0]).set_index("step").sort_index()
    third, last = costs["rss_mb"].iloc[2], costs["rss_mb"].iloc[-1]
    assert abs(last - third) <= 0.10 * third, costs["rss_mb"].tolist()


def test_only_the_final_revisions_states_are_kept(uninterrupted) -> None:
    out = uninterrupted[0]
    kept = sorted(p.name for p in (table.probe_dir(out) / "states").glob("*.pt"))
    assert kept == [f"step_{STEPS[-1]}.pt"]
    frame = table.read_table(out)
    vs_final = frame.loc[frame["step_b"] == STEPS[-1]]
    assert sorted(vs_final["step"].unique()) == list(STEPS)


def test_kill_9_then_the_same_command_gives_the_same_table(
    uninterrupted, folders, text_file, tmp_path
) -> None:
    out = tmp_path / "out"
    with FakeHub("org/steps", folders) as hub:
        env = subprocess_env(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf_home"))
        for offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            env.pop(offline, None)
        for wanted in (1, 4):  # killed once after 1 step's rows, once after 4 more
            process = subprocess.Popen([PYTHON, "probe.py", *_args(text_file, out)], cwd=ROOT,
                                       env=env, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and process.poll() is None:
                steps = _steps_done(out)
                if steps >= wanted:
                    break
                time.sleep(0.2)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            assert _steps_done(out) < len(STEPS)
        done = run_probe_py(_args(text_file, out), HF_ENDPOINT=hub.url,
                            HF_HOME=str(tmp_path / "hf_home"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Resuming:" in done.stdout
    resumed, whole = _sorted(table.read_table(out)), _sorted(table.read_table(uninterrupted[0]))
    keys = [k for k in KEYS if k in whole.columns]
    pd.testing.assert_frame_equal(resumed[keys], whole[keys], check_dtype=False)
    np.testing.assert_allclose(resumed["value"], whole["value"], rtol=1e-6, atol=1e-9)
    assert not any((out / "work").rglob("*.safetensors"))  # the killed downloads are gone too


def _steps_done(out: Path) -> int:
    try:
        return table.read_table(out)["step"].nunique()
    except (FileNotFoundError, ValueError, OSError):
        return 0
