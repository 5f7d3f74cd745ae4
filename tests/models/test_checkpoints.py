"""Our checkpoints read without Lightning (`repgeom.models.checkpoints.load_gpt`): the same model
as `CharLM.load_from_checkpoint`, and a probe of a checkpoint that never loads the Trainer."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import lightning
import pytest
import torch

from repgeom.data.tokens import TokenCache
from repgeom.models.checkpoints import CheckpointFormatError, load_gpt
from repgeom.models.lightning_module import CharLM

MODEL = {"_target_": "repgeom.models.gpt.GPTConfig", "name": "tiny", "block_size": 32,
         "n_layer": 2, "n_head": 2, "n_embd": 16, "dropout": 0.0, "bias": True, "norm": "pre"}


def _save_checkpoint(path: Path, *, causal: bool, cache_dir: Path) -> CharLM:
    """A checkpoint laid out as Lightning writes one (``state_dict``, ``hyper_parameters`` and
    the datamodule's state), of a randomly initialised `CharLM` on the bundled sample's vocab."""
    vocab, _ = _sample(cache_dir)
    torch.manual_seed(0)
    lm = CharLM(model={**MODEL, "vocab_size": vocab.size, "causal": causal},
                masking={"causal": causal}, optim={}, vocab=vocab.to_dict(), seed=7)
    torch.save({
        "state_dict": lm.state_dict(),
        "hyper_parameters": dict(lm.hparams),
        "global_step": 3,
        "pytorch-lightning_version": lightning.__version__,
        "Enwik8DataModule": {"vocab": vocab.to_dict(), "source": "sample", "clean": False},
    }, path)
    return lm


def _sample(cache_dir: Path):
    cache = TokenCache("sample", cache_dir=cache_dir)
    cache.prepare()
    return cache.open()


@pytest.mark.parametrize("causal", [True, False])
def test_load_gpt_is_the_charlm_model(tmp_path, causal) -> None:
    path = tmp_path / "run" / "checkpoints" / "last.ckpt"
    path.parent.mkdir(parents=True)
    _save_checkpoint(path, causal=causal, cache_dir=tmp_path / "cache")
    ours = load_gpt(path)
    lightning_module = CharLM.load_from_checkpoint(path, map_location="cpu", weights_only=True)
    ids = torch.randint(0, ours.vocab.size, (3, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = lightning_module.eval().model(ids)[0]
        got = ours.model(ids)[0]
    assert not ours.model.training and ours.model.config.causal is causal
    assert ours.vocab == lightning_module.vocab
    torch.testing.assert_close(got, expected, rtol=0, atol=0)  # same weights, same process


def test_load_gpt_refuses_a_plain_state_dict(tmp_path) -> None:
    path = tmp_path / "weights.pt"
    torch.save({"x": torch.zeros(2)}, path)
    with pytest.raises(CheckpointFormatError, match="not a Lightning checkpoint"):
        load_gpt(path)


@pytest.mark.slow  # a fresh interpreter imports torch, transformers and FAISS
def test_probing_a_checkpoint_never_loads_the_trainer(tmp_path) -> None:
    """probe.py's path for our checkpoints (`CheckpointTarget`: model, validation windows,
    probe set, measure) runs end to end with Lightning's Trainer never imported."""
    path = tmp_path / "run" / "checkpoints" / "last.ckpt"
    path.parent.mkdir(parents=True)
    _save_checkpoint(path, causal=True, cache_dir=tmp_path / "cache")
    code = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        os.environ["REPGEOM_DATA"] = {str(tmp_path / "cache")!r}
        from repgeom.probes.core.spec import ProbeRequest
        from repgeom.probes.core.targets import CheckpointTarget
        target = CheckpointTarget(Path({str(path)!r}), 3)
        loaded = target.load("cpu")
        out = target.probe(ProbeRequest(n_states=256, metrics=("anisotropy",)), loaded)
        print(len(out.rows), target.kind)
        print(sorted(m for m in sys.modules if m.startswith("lightning.pytorch")))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    rows, loaded_modules = done.stdout.strip().splitlines()[-2:]
    assert int(rows.split()[0]) > 0 and rows.split()[1] == "decoder"
    assert loaded_modules == "[]"


def test_find_checkpoints_keeps_the_file_a_live_run_does_not_replace(tmp_path) -> None:
    # The trajectory's step4.ckpt and best.ckpt at one step, last.ckpt and hpc_ckpt_1 at another:
    # last.ckpt and best.ckpt are replaced at a next validation, so a probe or an analysis of a live
    # run that loads them later gets another step's weights under this step.
    from repgeom.models.checkpoints import find_checkpoints

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    hparams = {"model": {}, "vocab": {}, "masking": {}}
    for name, step in (("best.ckpt", 4), ("step4.ckpt", 4), ("last.ckpt", 6)):
        torch.save({"global_step": step, "state_dict": {}, "hyper_parameters": hparams},
                   folder / name)
    torch.save({"global_step": 6, "state_dict": {}, "hyper_parameters": hparams},
               tmp_path / "hpc_ckpt_1.ckpt")
    assert find_checkpoints(tmp_path) == [(4, folder / "step4.ckpt"),
                                          (6, tmp_path / "hpc_ckpt_1.ckpt")]


def _whole_checkpoint(path: Path) -> bytes:
    torch.save({"global_step": 6, "state_dict": {"w": torch.arange(4096.0)},
                "hyper_parameters": {"model": {}, "vocab": {}, "masking": {}}}, path)
    return path.read_bytes()


def test_checkpoint_problem_rejects_every_cut_and_a_changed_byte(tmp_path) -> None:
    from repgeom.models.checkpoints import checkpoint_problem, saved_step

    path = tmp_path / "last.ckpt"
    whole = _whole_checkpoint(path)
    assert checkpoint_problem(path) is None and saved_step(path) == 6
    for size in (0, 1, len(whole) // 3, len(whole) - 22, len(whole) - 1):  # a kill mid-copy
        path.write_bytes(whole[:size])
        for check_crc in (True, False):
            assert "not a whole torch.save file" in checkpoint_problem(path, check_crc=check_crc)
        assert saved_step(path) is None
    # the right length, one byte of the tensor changed: only the CRC-32 check sees it
    at = whole.index(torch.arange(4096.0).numpy().tobytes()[4000:4016])
    path.write_bytes(whole[:at] + bytes([whole[at] ^ 1]) + whole[at + 1:])
    assert checkpoint_problem(path, check_crc=False) is None
    assert "fails its CRC-32 check" in checkpoint_problem(path)
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:  # a zip, but not torch.save's
        archive.writestr("notes.txt", "x")
    assert "without data.pkl" in checkpoint_problem(path)


def test_find_checkpoints_skips_a_cut_file_with_a_warning(tmp_path, caplog) -> None:
    from repgeom.models.checkpoints import find_checkpoints

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    whole = _whole_checkpoint(folder / "last.ckpt")
    (tmp_path / "hpc_ckpt_1.ckpt").write_bytes(whole[: len(whole) // 2])
    assert find_checkpoints(tmp_path) == [(6, folder / "last.ckpt")]
    assert "hpc_ckpt_1.ckpt" in caplog.text and "not a whole torch.save file" in caplog.text


def test_find_checkpoints_skips_a_whole_zip_that_is_no_checkpoint(tmp_path, caplog) -> None:
    # review of issue 47: a file whole as a zip (no CRC check in the listing) but wrong inside
    # (data.pkl's bytes changed, or a plain state dict) made read_checkpoint raise and the
    # whole listing fail
    import zipfile

    from repgeom.models.checkpoints import checkpoint_problem, find_checkpoints

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    _whole_checkpoint(folder / "last.ckpt")
    hpc = tmp_path / "hpc_ckpt_1.ckpt"
    data = bytearray(_whole_checkpoint(hpc))
    with zipfile.ZipFile(hpc) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("data.pkl"))
    at = info.header_offset + 30 + len(info.filename) + len(info.extra)  # the local header's end
    data[at + 5: at + 25] = bytes(20)
    hpc.write_bytes(bytes(data))
    assert checkpoint_problem(hpc, check_crc=False) is None  # what the listing checks
    torch.save({"w": torch.ones(3)}, folder / "step2.ckpt")  # a plain state dict
    assert find_checkpoints(tmp_path) == [(6, folder / "last.ckpt")]
    assert "hpc_ckpt_1.ckpt" in caplog.text and "step2.ckpt" in caplog.text
