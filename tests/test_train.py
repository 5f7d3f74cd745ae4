"""End-to-end training on the bundled sample: learning, logging, resuming, reproducibility."""

import math
from pathlib import Path

import lightning as L
import pandas as pd
import pytest
import torch
from hydra_configs import compose_train
from wandb_records import logged_keys

from repgeom.models.lightning_module import CharLM, NonFiniteLossError
from repgeom.train import read_csv_metrics, train

pytestmark = pytest.mark.slow  # every test here trains (make test-fast leaves them out)


def _csv_metrics(output_dir: Path) -> pd.DataFrame:
    return read_csv_metrics(output_dir)


def _train_losses(output_dir: Path) -> pd.Series:
    frame = _csv_metrics(output_dir).dropna(subset=["train/loss"])
    return frame.set_index("step")["train/loss"]


@pytest.mark.parametrize("masking", ["causal", "bidirectional"])
def test_short_run_learns_and_logs_to_wandb_offline(tmp_path: Path, masking: str) -> None:
    cfg = compose_train(
        tmp_path, [f"masking={masking}", "trainer.max_steps=60", "trainer.val_check_interval=30"]
    )
    result = train(cfg)
    vocab_size = result.module.vocab.size
    # An untrained model predicts near-uniformly: log2(V) ~ 7.7 bits. After 60 steps the tiny model
    # has learnt at least the character frequencies (~5 bits on enwik8), well below uniform.
    frame = _csv_metrics(tmp_path).dropna(subset=["val/bpc"])
    bpc = frame["val/bpc"].tolist()
    assert len(bpc) == 2 and bpc[-1] < bpc[0] < math.log2(vocab_size)
    assert bpc[-1] < math.log2(vocab_size) - 1.5

    keys = logged_keys(result.wandb_dir)
    for key in (
        "train/loss",
        "val/loss",
        "val/bpc",
        "train/tokens_seen",
        "lr-AdamW/decay",
        "train/device/items_per_sec",
    ):
        assert key in keys, f"{key} missing from the W&B run; logged: {sorted(keys)}"
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()
    assert (tmp_path / "checkpoints" / "best.ckpt").exists()

    restored = CharLM.load_from_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert restored.vocab.to_dict() == result.module.vocab.to_dict()
    assert restored.causal is (masking == "causal")


def test_same_seed_gives_the_same_loss_curve(tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        cfg = compose_train(tmp_path / name, ["logger=csv", "trainer.max_steps=15"])
        train(cfg)
        runs.append(_train_losses(tmp_path / name))
    pd.testing.assert_series_equal(runs[0], runs[1])
    cfg = compose_train(tmp_path / "c", ["logger=csv", "trainer.max_steps=15", "seed=1"])
    train(cfg)
    assert not _train_losses(tmp_path / "c").equals(runs[0])


@pytest.mark.parametrize("masking", ["causal", "bidirectional"])
def test_resume_continues_the_same_curve(tmp_path: Path, masking: str) -> None:
    straight = tmp_path / "straight"
    train(compose_train(straight, ["logger=csv", f"masking={masking}", "trainer.max_steps=20"]))

    split = tmp_path / "split"
    # Stopped at step 10 of a 20-step schedule, as a preempted or crashed run would be.
    first_half = [
        "logger=csv",
        f"masking={masking}",
        "trainer.max_steps=10",
        "optim.scheduler.total_steps=20",
    ]
    train(compose_train(split, first_half))
    ckpt = split / "checkpoints" / "last.ckpt"
    assert torch.load(ckpt, weights_only=False)["global_step"] == 10
    # A re-run in the same folder picks up last.ckpt by itself and goes on to step 20.
    result = train(
        compose_train(split, ["logger=csv", f"masking={masking}", "trainer.max_steps=20"])
    )
    assert result.trainer.global_step == 20

    expected = _train_losses(straight)
    resumed = _train_losses(split)
    # Each start keeps its own CSV (nothing logged is lost); stitched they give the whole curve,
    # and with the same data position, optimizer state, schedule and masks the same numbers.
    assert len(list(split.glob("csv/version_*/metrics.csv"))) == 2
    pd.testing.assert_series_equal(resumed, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("logging_counter_offset", [-1, 1])
def test_resume_from_a_mid_step_checkpoint_logs_at_the_right_steps(
    tmp_path: Path, logging_counter_offset: int
) -> None:
    # Lightning writes the SLURM requeue checkpoint from its signal handler, at any point of a
    # step: restored, the loop's logging counter can be one behind or ahead of global_step.
    overrides = ["logger=csv", "trainer.max_steps=10", "optim.scheduler.total_steps=20"]
    train(compose_train(tmp_path, overrides))
    ckpt_path = tmp_path / "checkpoints" / "last.ckpt"
    ckpt = torch.load(ckpt_path, weights_only=False)
    assert ckpt["global_step"] == 10
    ckpt["loops"]["fit_loop"]["epoch_loop.state_dict"]["_batches_that_stepped"] += (
        logging_counter_offset
    )
    torch.save(ckpt, ckpt_path)

    train(compose_train(tmp_path, ["logger=csv", "trainer.max_steps=20"]))
    second_start = pd.read_csv(tmp_path / "csv" / "version_1" / "metrics.csv")
    assert second_start.dropna(subset=["train/loss"])["step"].tolist() == list(range(10, 20))


class PoisonWeights:
    """A callback that writes NaN into the weights after a given step (a diverging run)."""

    def __new__(cls, after_step: int):
        import lightning as L

        class _Poison(L.Callback):
            def on_train_batch_end(self, trainer, pl_module, *args) -> None:
                if trainer.global_step == after_step:
                    with torch.no_grad():
                        pl_module.model.lm_head.weight.fill_(float("nan"))

        return _Poison()


def test_non_finite_loss_stops_with_a_message_and_keeps_the_checkpoint(tmp_path: Path) -> None:
    cfg = compose_train(
        tmp_path,
        [
            "logger=csv",
            "trainer.max_steps=40",
            "+callbacks.poison._target_=test_train.PoisonWeights",
            "+callbacks.poison.after_step=12",
        ],
    )
    with pytest.raises(NonFiniteLossError, match="last good checkpoint") as error:
        train(cfg)
    assert "step 12" in str(error.value)
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == 10
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values())


# gpt_tiny's own sizes (4 x 128, context 256), a few steps: what compile=true trains on the CPU.
GPT_TINY = ["model.n_layer=4", "model.n_head=4", "model.n_embd=128", "model.block_size=256",
            "data.batch_size=4", "trainer.max_steps=6", "trainer.val_check_interval=6",
            "probe=none", "logger=csv"]


def test_compile_trains_gpt_tiny_like_eager_with_the_same_checkpoint_keys(tmp_path: Path) -> None:
    train(compose_train(tmp_path / "eager", [*GPT_TINY, "recipe.compile=false"]))
    train(compose_train(tmp_path / "compiled", [*GPT_TINY, "recipe.compile=true"]))
    eager, compiled = _train_losses(tmp_path / "eager"), _train_losses(tmp_path / "compiled")
    assert list(compiled.index) == list(range(6))
    # Inductor's fused kernels sum in another order than eager's: float32 rounding (~1e-7
    # relative an op) that six AdamW steps carry forward; 1e-4 is 100x what was seen here.
    pd.testing.assert_series_equal(compiled, eager, rtol=1e-4, atol=0)
    keys = {name: list(torch.load(tmp_path / name / "checkpoints" / "last.ckpt",
                                  weights_only=False)["state_dict"])
            for name in ("eager", "compiled")}
    assert keys["compiled"] == keys["eager"]  # no `_orig_mod.` copies of the weights
    assert not any("_orig_mod" in key for key in keys["compiled"])


def test_a_sparse_nan_check_stops_at_its_step_and_keeps_the_last_good_checkpoint(
    tmp_path: Path,
) -> None:
    # recipe.finite_check_every_n_steps=5 (what "auto" gives on CUDA with log_every_n_steps=5):
    # the loss is read on the host at steps 4, 9, 14, ...; the weights go NaN after step 12.
    cfg = compose_train(
        tmp_path,
        ["logger=csv", "trainer.max_steps=40", "recipe.finite_check_every_n_steps=5",
         "+callbacks.poison._target_=test_train.PoisonWeights", "+callbacks.poison.after_step=12"],
    )
    with pytest.raises(NonFiniteLossError, match="last good checkpoint") as error:
        train(cfg)
    assert "at or before step 14" in str(error.value)
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == 10
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values())


def test_a_nan_before_a_checkpoint_stops_the_checkpoint_whatever_the_check_interval(
    tmp_path: Path,
) -> None:
    # Checked every 100 steps, a NaN at step 12 would reach the checkpoint of step 20; the check
    # before every checkpoint (on_save_checkpoint) stops it there.
    cfg = compose_train(
        tmp_path,
        ["logger=csv", "trainer.max_steps=40", "recipe.finite_check_every_n_steps=100",
         "+callbacks.poison._target_=test_train.PoisonWeights", "+callbacks.poison.after_step=12"],
    )
    with pytest.raises(NonFiniteLossError, match="at or before step 20"):
        train(cfg)
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == 10


def test_sync_free_logging_logs_the_same_numbers_at_the_logging_steps(tmp_path: Path) -> None:
    common = ["logger=csv", "trainer.log_every_n_steps=5", "probe=none"]
    train(compose_train(tmp_path / "every", [*common, "recipe.sync_free_logging=false"]))
    train(compose_train(tmp_path / "sparse", [*common, "recipe.sync_free_logging=true"]))
    frames = {name: _csv_metrics(tmp_path / name).dropna(subset=["train/loss"]).set_index("step")
              for name in ("every", "sparse")}
    assert list(frames["sparse"].index) == [4, 9, 14, 19]
    # The throughput monitor counted every batch, not only the logged ones.
    columns = ["train/tokens_seen", "train/lengths", "train/samples", "train/batches"]
    pd.testing.assert_frame_equal(frames["sparse"][columns], frames["every"][columns])
    assert (frames["sparse"]["train/device/items_per_sec"].dropna() > 0).all()
    # The same training; CPU thread scheduling alone moves the last float32 bit between runs.
    pd.testing.assert_series_equal(frames["sparse"]["train/loss"], frames["every"]["train/loss"],
                                   rtol=1e-5)


def test_fused_adamw_under_bf16_autocast_clips_the_gradients_like_the_for_each_adamw(
    tmp_path: Path,
) -> None:
    # What the recipe does on a GPU, on the CPU: bf16-mixed, fused AdamW, gradient_clip_val=1.0.
    # Lightning's mixed-precision plugin refused to clip for a fused optimizer ("does not allow
    # for gradient clipping"), which would have stopped every CUDA run at its first step.
    common = ["logger=csv", "probe=none", "trainer.precision=bf16-mixed", "trainer.max_steps=8",
              "optim.optimizer.lr=3e-3"]
    train(compose_train(tmp_path / "fused", [*common, "recipe.fused_adamw=true"]))
    train(compose_train(tmp_path / "foreach", [*common, "recipe.fused_adamw=false"]))
    fused, foreach = _train_losses(tmp_path / "fused"), _train_losses(tmp_path / "foreach")
    assert list(fused.index) == list(range(8))
    # The same update in another kernel (fused sums in another order): float32 rounding of
    # the weights, which bf16 autocast of the next forwards may round to the next bf16 step
    # (2^-8 relative); 1e-2 stays well under what a skipped clip moves (the first steps'
    # gradient norms are above 1 here).
    pd.testing.assert_series_equal(fused, foreach, rtol=1e-2)


def test_sync_free_logging_counts_the_flops_of_every_batch(tmp_path: Path) -> None:
    # Lightning's Throughput sums the `flops` of each update ("since the last update"); sync-free,
    # one update covers log_every_n_steps batches, so it must carry all their FLOPs: FLOPs per
    # token (flops_per_sec / items_per_sec over the same window and seconds) is the model's.
    common = ["logger=csv", "trainer.log_every_n_steps=5", "probe=none"]
    every = train(compose_train(tmp_path / "every", [*common, "recipe.sync_free_logging=false"]))
    train(compose_train(tmp_path / "sparse", [*common, "recipe.sync_free_logging=true"]))
    module = every.module
    per_token = module.flops_per_window / module.model.config.block_size
    for name in ("every", "sparse"):
        frame = _csv_metrics(tmp_path / name).dropna(subset=["train/device/flops_per_sec"])
        assert len(frame) >= 1, name
        ratio = frame["train/device/flops_per_sec"] / frame["train/device/items_per_sec"]
        assert ratio.to_numpy() == pytest.approx(per_token, rel=1e-9), name


@pytest.mark.parametrize(("first", "then"), [("false", "true"), ("true", "false")])
def test_a_resumed_run_keeps_its_own_fused_adamw_choice(tmp_path: Path, first: str,
                                                        then: str) -> None:
    # Optimizer.load_state_dict takes the param groups' `fused` flag from the checkpoint: a
    # checkpoint written without the recipe would resume a GPU run on the for-each AdamW.
    common = ["logger=csv", "probe=none", "optim.scheduler.total_steps=8"]
    train(compose_train(tmp_path, [*common, "trainer.max_steps=4",
                                   f"recipe.fused_adamw={first}"]))
    result = train(compose_train(tmp_path, [*common, "trainer.max_steps=8",
                                            f"recipe.fused_adamw={then}"]))
    assert result.trainer.global_step == 8  # resumed from step 4
    groups = result.trainer.optimizers[0].param_groups
    assert [bool(g["fused"]) for g in groups] == [then == "true"] * len(groups)


class _StepSpy(L.Callback):
    """Notes whether the current training step is one the loggers write."""

    logging_step: bool | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        _StepSpy.logging_step = trainer._logger_connector.should_update_logs

    def on_train_end(self, trainer, pl_module) -> None:
        _StepSpy.logging_step = None


def test_sync_free_logging_reads_no_logged_tensor_on_the_host_between_logging_steps(
    tmp_path: Path, monkeypatch
) -> None:
    # Lightning's logger connector turns every prog_bar=True metric into a Python number
    # (`.item()`, a host sync on a GPU) at the end of every batch; a loss logged with
    # prog_bar=True every step was read every step, the sync the recipe removes.
    from lightning.pytorch.trainer.connectors.logger_connector import result

    reads = []
    convert = result.convert_tensors_to_scalars

    def spy(value):
        if _StepSpy.logging_step is False and isinstance(value, torch.Tensor):
            reads.append(value)
        return convert(value)

    monkeypatch.setattr(result, "convert_tensors_to_scalars", spy)
    cfg = compose_train(tmp_path, [
        "logger=csv", "probe=none", "trainer.max_steps=20", "trainer.log_every_n_steps=5",
        "recipe.sync_free_logging=true", "recipe.finite_check_every_n_steps=5",
        "+callbacks.step_spy._target_=test_train._StepSpy"])
    result_ = train(cfg)
    assert result_.trainer.global_step == 20
    assert reads == []
    # the loss is still logged at the logging steps, and the bar still shows it
    frame = _csv_metrics(tmp_path).dropna(subset=["train/loss"])
    assert list(frame["step"]) == [4, 9, 14, 19]
    from repgeom.callbacks.progress_bar import TokensProgressBar

    shown = TokensProgressBar().get_metrics(result_.trainer, result_.module)
    assert shown["train/loss"] == f"{float(result_.trainer.logged_metrics['train/loss']):.3f}"


@pytest.mark.parametrize("plugins", [
    None, {"_target_": "lightning.pytorch.plugins.environments.LightningEnvironment"},
    [{"_target_": "lightning.pytorch.plugins.environments.LightningEnvironment"}]])
def test_trainer_plugins_take_one_plugin_or_a_list_and_add_atomic_writes(plugins) -> None:
    # review of issue 47: one plugin's config crashed the build (not iterable)
    from omegaconf import OmegaConf

    from repgeom.callbacks.checkpoint_policy import AtomicCheckpointIO
    from repgeom.train import trainer_plugins

    conf = OmegaConf.create({"plugins": plugins}).plugins
    built = trainer_plugins(conf)
    assert isinstance(built[-1], AtomicCheckpointIO) and len(built) == (1 if plugins is None else 2)
    trainer = L.Trainer(plugins=built, logger=False, enable_checkpointing=False,
                        accelerator="cpu")
    assert trainer.strategy.checkpoint_io is built[-1]


def test_trainer_plugins_refuse_a_checkpoint_io_of_the_users_and_a_name() -> None:
    # review of issue 47: AsyncCheckpointIO gave Lightning's "multiple values for CheckpointIO",
    # and a name ("bf16-mixed", which Lightning 2 does not take) a TypeError while unpacking
    from omegaconf import OmegaConf

    from repgeom.train import trainer_plugins

    for name in ("bf16-mixed", ["bf16-mixed"]):
        with pytest.raises(ValueError, match="trainer.precision=bf16-mixed"):
            trainer_plugins(OmegaConf.create({"p": name}).p)

    conf = OmegaConf.create([{"_target_": "lightning.pytorch.plugins.io.AsyncCheckpointIO"}])
    with pytest.raises(ValueError, match="AsyncCheckpointIO.*remove it from trainer.plugins"):
        trainer_plugins(conf)
