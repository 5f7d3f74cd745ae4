"""Revision schedules: `hf_revisions=all`, `max_revisions`, the one thinning rule, and revisions
that do not exist failing before any download (against the tests' local stand-in for the hub)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import huggingface_hub.constants
import numpy as np
import pytest
from cli_runs import PYTHON, run_probe_py, subprocess_env
from hub_server import FakeHub, commit_of

from repgeom.models.hub import revisions
from repgeom.probes.core import table
from repgeom.probes.run import schedule
from repgeom.probes.run.schedule import probe_schedule, thin_steps

PYTHIA = [0, *[2**i for i in range(10)], *range(1000, 143001, 1000)]
"""Pythia's 154 revisions (Biderman et al. 2023): step0, 1, 2, 4 ... 512, then every 1,000."""


# ---------------------------------------------------------------------------------------------
# The thinning rule


def test_thin_steps_known_answer() -> None:
    # Steps 0..100, three kept: 0, 100 and the step whose position (log + linear) / 2 is nearest
    # 0.5. By hand: u(27) = (log 27 / log 100 + 0.27) / 2 = 0.4928, u(28) = 0.5018,
    # u(29) = 0.5106: 28.
    assert thin_steps(range(101), 3) == [0, 28, 100]
    # An independent brute force of the rule on a random set: every kept step is, in turn, the
    # free step nearest its target.
    rng = np.random.default_rng(0)
    steps = sorted({0, *rng.integers(1, 10_000, size=300).tolist()})
    kept = thin_steps(steps, 25)
    s = np.asarray(steps, dtype=float)
    u = (np.log(np.maximum(s, s[1]) / s[1]) / np.log(s[-1] / s[1]) + s / s[-1]) / 2
    free, expected = set(range(1, len(s) - 1)), {0, len(s) - 1}
    for target in np.linspace(0, 1, 25)[1:-1]:
        best = min(sorted(free), key=lambda i: abs(u[i] - target))
        free.discard(best)
        expected.add(best)
    assert kept == [steps[i] for i in sorted(expected)]


def test_thin_steps_keeps_the_ends_and_both_regimes() -> None:
    kept = thin_steps(PYTHIA, 20)
    assert len(kept) == 20 and kept[0] == 0 and kept[-1] == 143000 and set(kept) <= set(PYTHIA)
    # Log-spaced early: several of the 11 revisions below step 1000 survive (thinning evenly by
    # index, the old rule, kept 1 of them); even later: the gaps in the last half are within 25%
    # of their mean.
    assert sum(s < 1000 for s in kept) >= 4
    late = np.diff([s for s in kept if s >= 143000 / 2])
    assert np.all(np.abs(late - late.mean()) <= 0.25 * late.mean()), late
    assert thin_steps([5, 1, 3], 10) == [1, 3, 5]  # short enough: all, sorted
    assert thin_steps(PYTHIA, None) == PYTHIA
    with pytest.raises(ValueError, match="max_revisions must be >= 2"):
        thin_steps(PYTHIA, 1, option="max_revisions")


def test_training_probe_uses_the_same_rule() -> None:
    full = probe_schedule(1500, every_n_steps=100, log_spaced_until=100, n_log_spaced=8)
    thinned = probe_schedule(1500, every_n_steps=100, log_spaced_until=100, n_log_spaced=8,
                             max_probes=16)
    assert thinned == thin_steps(full, 16) and len(thinned) == 16
    with pytest.raises(ValueError, match="probe.max_probes must be >= 2"):
        probe_schedule(10, every_n_steps=1, log_spaced_until=1, n_log_spaced=1, max_probes=1)


def test_run_checkpoints_are_thinned_by_step() -> None:
    found = [(s, Path(f"step{s}.ckpt")) for s in (0, 10, 20, 30, 40, 1000)]
    assert schedule.run_checkpoints(found, None) == found
    kept = schedule.run_checkpoints(found, 3)
    assert [s for s, _ in kept] == thin_steps([s for s, _ in found], 3)
    assert kept[0] == found[0] and kept[-1] == found[-1]


@pytest.mark.parametrize(
    "revisions, max_revisions, mode, message",
    [("every", None, "hf", "give 'all'"),
     (None, 1, "run", "max_revisions must be an integer >= 2"),
     (None, "5", "run", "max_revisions must be an integer"),
     (None, 4, "ckpt", "max_revisions thins a trajectory"),
     (None, 4, "hf", "max_revisions thins a trajectory")],
)  # fmt: skip
def test_bad_schedule_options(revisions, max_revisions, mode, message) -> None:
    with pytest.raises(ValueError, match=message):
        schedule.check_options(revisions, max_revisions, mode)


# ---------------------------------------------------------------------------------------------
# Step-named revisions on the hub


@pytest.fixture
def empty_folder(tmp_path) -> Path:
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


@pytest.fixture
def hub(monkeypatch, empty_folder):
    """A hub stand-in whose branches are step revisions out of order, main, and a tag."""
    names = ["step10", "main", "step2", "checkpoint-5", "step0", "v1.0"]
    with FakeHub("org/steps", dict.fromkeys(names, empty_folder), tags=("v1.0",)) as fake:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", fake.url)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        yield fake


def _downloads(hub: FakeHub) -> list[str]:
    return [path for _, path in hub.requests if "/resolve/" in path]


def test_all_lists_step_revisions_sorted_by_step(hub) -> None:
    listing = revisions.step_revisions("org/steps")
    assert listing.found == [(0, "step0"), (2, "step2"), (5, "checkpoint-5"), (10, "step10")]
    # The tag carries no step, and main holds no weights (this stand-in has none): both said.
    assert listing.ignored == {"no training step in the name": ["v1.0"],
                               "main: no weights files": ["main"]}
    assert schedule.hub_revisions("org/steps", "all") == [
        (0, "step0"), (2, "step2"), (5, "checkpoint-5"), (10, "step10")]
    assert schedule.hub_revisions("org/steps", "all", max_revisions=2) == [(0, "step0"),
                                                                           (10, "step10")]
    # A list of names without steps is numbered in its order; main and the tag exist.
    assert schedule.hub_revisions("org/steps", ["main", "v1.0"]) == [(0, "main"), (1, "v1.0")]
    # A list is thinned on its training steps, not on its positions.
    assert schedule.hub_revisions("org/steps", ["step10", "step2", "step0"],
                                  max_revisions=2) == [(10, "step10"), (0, "step0")]
    assert schedule.hub_revisions("org/steps", ["step2", "main"]) == [(2, "step2"), (3, "main")]
    assert _downloads(hub) == []  # listing only: refs and model_info, no file


def test_unknown_revision_fails_before_any_download_naming_what_exists(hub) -> None:
    with pytest.raises(ValueError) as err:
        schedule.hub_revisions("org/steps", ["step2", "step9", "mian"])
    message = str(err.value)
    assert "'step9' (closest: step10, checkpoint-5, step2)" in message
    assert "'mian' (closest: main" in message
    assert "it has 6: step0, step2, checkpoint-5, step10, main, v1.0" in message
    assert "step2 (" not in message  # the existing one is not reported
    assert _downloads(hub) == []
    # A commit id is resolved by the hub itself: nothing is listed for it.
    before = len(hub.requests)
    assert schedule.hub_revisions("org/steps", ["0123abcd"]) == [(0, "0123abcd")]
    assert len(hub.requests) == before


def test_repository_without_step_revisions_or_unknown_repository(monkeypatch, empty_folder):
    with FakeHub("org/plain", {"main": empty_folder, "v1.0": empty_folder}) as fake:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", fake.url)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        with pytest.raises(ValueError, match=r"no revision named after a training step .* its "
                                             r"branches and tags: main, v1.0"):
            schedule.hub_revisions("org/plain", "all")
        with pytest.raises(OSError, match="hf='org/missing': no such model repository"):
            schedule.hub_revisions("org/missing", "all")
        assert _downloads(fake) == []
    with pytest.raises(ValueError, match="is a local folder"):
        schedule.hub_revisions(str(empty_folder), "all")


# ---------------------------------------------------------------------------------------------
# probe.py


@pytest.fixture
def text_file(tmp_path, tiny_text) -> Path:
    path = tmp_path / "text.txt"
    path.write_text(tiny_text * 3)  # in the tiny tokenizers' vocabulary: no <unk>
    return path


def test_probe_py_all_revisions_thinned(tmp_path, tiny_hf_folder, text_file) -> None:
    """`hf_revisions=all max_revisions=2`: the first and last step-named revisions are probed,
    and only theirs are downloaded; offline, `all` reads the refs of the local cache."""
    model, other = tiny_hf_folder("gpt2"), tiny_hf_folder("gpt2-scaled")
    folders = {"step100": model, "step200": model, "step300": other, "main": other}
    out, cache = tmp_path / "out", tmp_path / "hf_home"
    args = ["hf=org/pythia-like", "hf_revisions=all", "max_revisions=2",
            f"text_file={text_file}", "window=32", "n_states=192", "settings.max_order=8",
            "settings.state_batch_size=192", "settings.distributions=false", "device=cpu",
            "metrics=[default]", "plot_metrics=[]"]  # fmt: skip
    with FakeHub("org/pythia-like", folders) as hub:
        done = run_probe_py([*args, f"hydra.run.dir={out}"], HF_ENDPOINT=hub.url,
                            HF_HOME=str(cache))
    assert done.returncode == 0, done.stderr[-3000:]
    assert {revision for revision, _ in hub.downloads()} == {"step100", "step300"}
    # Nothing at all was asked of the revision thinned out; of main only its file list (its
    # weights are step300's, so it is that checkpoint and is left out), no file.
    assert not any("step200" in p or commit_of("step200") in p for _, p in hub.requests)
    asked = [p for _, p in hub.requests if "main" in p or commit_of("main") in p]
    assert asked and all(p.startswith("/api/models/org/pythia-like/revision/main") for p in asked)
    assert "main: the weights of step300" in done.stdout
    frame = table.read_table(out)
    assert sorted(frame["step"].unique()) == [100, 300]
    assert sorted(frame["revision"].unique()) == ["step100", "step300"]

    # Offline, `all` reads the refs of the user's cache: the revisions they downloaded there.
    with FakeHub("org/pythia-like", folders) as hub:
        code = ("import huggingface_hub as h; [h.snapshot_download('org/pythia-like', "
                "revision=r) for r in ('step100', 'step300')]")
        subprocess.run([PYTHON, "-c", code], check=True,
                       env=subprocess_env(HF_ENDPOINT=hub.url, HF_HOME=str(cache)))
    done = run_probe_py([*args, "max_revisions=null", f"hydra.run.dir={tmp_path / 'offline'}"],
                        HF_HOME=str(cache), HF_HUB_OFFLINE="1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(table.read_table(tmp_path / "offline")["step"].unique()) == [100, 300]


# ---------------------------------------------------------------------------------------------
# Revision names of real trajectories (OLMo, Bloom, Megatron) and main as the final checkpoint


def _weights_folder(root: Path, name: str, content: bytes) -> Path:
    """A revision folder with a config and one weights file of `content` (never downloaded
    here: the listing reads the hub's LFS sha256 of it)."""
    folder = root / name
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(content)
    return folder


@pytest.fixture
def served(monkeypatch):
    """Serve `FakeHub(repo, folders)` as the hub for the test's duration."""
    hubs = []

    def serve(repo: str, folders: dict) -> FakeHub:
        hub = FakeHub(repo, folders).__enter__()
        hubs.append(hub)
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        return hub

    yield serve
    for hub in hubs:
        hub.__exit__(None, None, None)


def test_all_reads_olmo_names_one_stage_and_lists_what_it_leaves_out(tmp_path, served) -> None:
    w = _weights_folder(tmp_path, "w", b"weights")
    # OLMo-2-1124-7B's branches: some of stage 1's lack the prefix (step150-tokens1B beside
    # stage1-step1000-tokens5B); they count as stage 1 up to its last step, not beyond it.
    names = ["stage1-step0-tokens0B", "step150-tokens1B", "step600-tokens3B",
             "stage1-step1000-tokens3B", "step2000-tokens9B", "stage1-step3000-tokens13B",
             "stage2-ingredient1-step500-tokens2B", "stage2-ingredient2-step500-tokens2B",
             "step5000-tokens20B", "v1.0", "main"]
    hub = served("allenai/olmo-like", dict.fromkeys(names, w))
    listing = revisions.step_revisions("allenai/olmo-like")
    assert listing.found == [(0, "stage1-step0-tokens0B"), (150, "step150-tokens1B"),
                             (600, "step600-tokens3B"), (1000, "stage1-step1000-tokens3B"),
                             (2000, "step2000-tokens9B"), (3000, "stage1-step3000-tokens13B")]
    later = [r for r, names in listing.ignored.items() if "later training stage" in r]
    assert len(later) == 1 and listing.ignored[later[0]] == names[6:8]
    [bare] = [r for r in listing.ignored if r.startswith("no stage in the name")]
    assert listing.ignored[bare] == ["step5000-tokens20B"]
    assert listing.ignored["no training step in the name"] == ["v1.0"]
    # main serves the weights of the last step: it is that checkpoint, left out, and said.
    assert listing.ignored["main: the weights of stage1-step3000-tokens13B"] == ["main"]
    assert not listing.final_main
    lines = listing.report()
    assert any("1 name(s) left out, no training step in the name: v1.0" in line
               for line in lines)
    assert not [p for _, p in hub.requests if "/resolve/" in p]  # nothing downloaded


def test_all_reads_olmo3_names_and_leaves_main_out_after_the_stages_it_ends(tmp_path,
                                                                           served) -> None:
    """OLMo-3's branches as public code names them (allenai/Olmo-3-1025-7B: stage1-step0 ...
    stage1-step1413814, stage2-step... to 47684, stage3-step... to 11921, whose commit ``main``
    is; three ``stage2-step47684-mix-*-from-2T-ckpt`` ablations): stage 1 is the trajectory,
    stages 2 and 3 count anew and are left out, and so is ``main``, their end: placed one step
    after stage 1's last it would draw two stages of training as one step."""
    early = _weights_folder(tmp_path, "early", b"stage 1")
    final = _weights_folder(tmp_path, "final", b"stage 3")
    names = ["stage1-step0", "stage1-step1000", "stage1-step1413814", "stage2-step1000",
             "stage2-step47684", "stage2-step47684-mix-a-from-2T-ckpt", "stage3-step1000",
             "stage3-step11921"]
    served("allenai/olmo3-like", {**dict.fromkeys(names[:5], early),
                                  **dict.fromkeys(names[5:], final), "main": final})
    listing = revisions.step_revisions("allenai/olmo3-like")
    assert listing.found == [(0, "stage1-step0"), (1000, "stage1-step1000"),
                             (1413814, "stage1-step1413814")]
    assert listing.ignored[listing.stages_left_out] == [
        "stage2-step1000", "stage2-step47684", "stage3-step1000", "stage3-step11921"]
    assert listing.ignored["no training step in the name"] == [
        "stage2-step47684-mix-a-from-2T-ckpt"]
    assert listing.ignored["main: it ends the training stages left out, not one step after "
                           "stage1-step1413814"] == ["main"]
    assert not listing.final_main


def test_all_ends_on_main_when_no_step_revision_holds_its_weights(tmp_path, served,
                                                                   capsys) -> None:
    early = _weights_folder(tmp_path, "early", b"early weights")
    final = _weights_folder(tmp_path, "final", b"final weights")
    served("org/main-final", {"global_step100": early, "global_step200": early, "main": final})
    assert schedule.hub_revisions("org/main-final", "all") == [
        (100, "global_step100"), (200, "global_step200"), (201, "main")]
    assert "main holds weights no step-named revision has" in capsys.readouterr().out
    # Thinning keeps the first and the last: main, the final checkpoint.
    assert schedule.hub_revisions("org/main-final", "all", max_revisions=2) == [
        (100, "global_step100"), (201, "main")]


def test_a_local_folder_with_hf_revisions_is_refused_naming_the_conflict(empty_folder) -> None:
    """A folder named like the repo would be served for every revision: the same weights at
    every step, silently."""
    with pytest.raises(ValueError, match=r"is a local folder here, and hf_revisions=.*Drop "
                                         r"hf_revisions"):
        schedule.hub_revisions(str(empty_folder), ["step1", "step2"])
