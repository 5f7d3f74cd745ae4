"""The LightningModule that trains a `GPT` as a decoder (next character) or an encoder (MLM)."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from omegaconf import DictConfig, OmegaConf

from repgeom.data.masking import mlm_mask
from repgeom.data.vocab import Vocab
from repgeom.models.gpt import GPT, GPTConfig
from repgeom.models.recipe import finite_check_interval, logs_this_step, switch_on

_KERNEL_KEYS = ("fused", "foreach")
"""The param-group flags that pick torch's optimizer kernel (recipe.fused_adamw)."""


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; the run stops before the weights are saved."""


_NONFINITE_ADVICE = (
    "stopping before the weights are saved. The last good checkpoint is left intact in the "
    "run's checkpoints/ folder. Lower optim.optimizer.lr, raise optim.scheduler.warmup_steps or "
    "keep trainer.gradient_clip_val set, then resume with ckpt_path=.../last.ckpt."
)


def warmup_cosine(
    optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int, min_lr_ratio: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup to the base learning rate, then cosine decay to `min_lr_ratio` of it."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + 0.5 * (1.0 - min_lr_ratio) * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def window_count(batch: torch.Tensor) -> int:
    """Number of windows in a batch (the throughput monitor's `batch_size_fn`)."""
    return batch.size(0)


def token_count(batch: torch.Tensor) -> int:
    """Number of input tokens in a batch of (B, block_size + 1) windows."""
    return batch.size(0) * (batch.size(1) - 1)


class CharLM(L.LightningModule):
    """Character language model; `masking.causal` picks the objective, nothing else differs.

    Every constructor argument is a plain dict or value and is saved in the checkpoint, so a
    checkpoint alone rebuilds the model and its vocabulary (`CharLM.load_from_checkpoint(path)`).
    The GPU recipe's switches (conf/recipe/: `compile`, `fused_adamw`,
    `finite_check_every_n_steps`, `sync_free_logging`) are true, false or "auto" (on CUDA only,
    read against the device the module trains on); their defaults are the path before the
    recipe, so an older checkpoint loads as it was.
    """

    def __init__(
        self,
        model: dict[str, Any],
        masking: dict[str, Any],
        optim: dict[str, Any],
        vocab: dict[str, Any],
        seed: int = 0,
        compile: bool | str = False,
        fused_adamw: bool | str = False,
        finite_check_every_n_steps: int | str = 1,
        sync_free_logging: bool | str = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.vocab = Vocab.from_dict(vocab)
        config = {k: v for k, v in _plain(model).items() if k != "_target_"}
        self.model = GPT(GPTConfig(**config))
        self.causal = self.model.config.causal
        # An alias that registers the model a second time, under `_forward.`: every checkpoint
        # written so far holds those keys, and Lightning's strict load of one (a resume) needs
        # them, so it stays. The compiled training loss is a function beside it, made at the
        # first training step (when the device is known): no `_orig_mod.` keys, nothing else.
        self._forward = self.model
        self._compiled_loss = None
        self._nonfinite: torch.Tensor | None = None  # any non-finite loss since the last check
        tokens = self.model.config.block_size
        # Training FLOPs per window: 6 N per token plus attention, as in nanoGPT's estimate_mfu.
        cfg = self.model.config
        flops_per_token = 6 * self.model.num_params() + 12 * cfg.n_layer * cfg.n_embd * tokens
        self.flops_per_window = flops_per_token * tokens
        self.flops_per_batch: int | None = None

    def _loss(
        self, window: torch.Tensor, generator_seed: int, compiled: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean cross-entropy in nats and the number of predicted characters; `compiled` computes
        it through the compiled `_logits_loss` (the training step, `recipe.compile`)."""
        if self.causal:
            inputs, targets = window[:, :-1], window[:, 1:]
        else:
            masking = self.hparams.masking
            generator = torch.Generator(device=window.device).manual_seed(generator_seed)
            inputs, targets = mlm_mask(
                window[:, :-1],
                mask_id=self.vocab.mask_id,
                vocab_size=self.vocab.size,
                special_ids=self.vocab.special_ids,
                mask_prob=masking["mask_prob"],
                replace_prob=masking["replace_prob"],
                random_prob=masking["random_prob"],
                generator=generator,
            )
        loss = (self._compiled_logits_loss() if compiled else self._logits_loss)(inputs, targets)
        return loss, (targets != -100).sum()

    def _logits_loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The model's forward and the mean cross-entropy over the targets that are not -100."""
        logits = self.model(inputs)  # (B, T, vocab)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)

    def _compiled_logits_loss(self):
        """`torch.compile` of `_logits_loss`, made once. Static shapes (`dynamic=False`): every
        training batch has the same shape, and static kernels are the fast ones."""
        if self._compiled_loss is None:
            self._compiled_loss = torch.compile(self._logits_loss, dynamic=False)
        return self._compiled_loss

    def _recipe_on(self, name: str) -> bool:
        return switch_on(self.hparams.get(name, False), self.device)

    def on_train_batch_start(self, batch: torch.Tensor, batch_idx: int) -> None:
        """Keep the loggers' step equal to the optimizer step, also after a mid-step checkpoint.

        Lightning writes the SLURM requeue checkpoint from inside its signal handler, at any
        point of a training step; restored from it, the loop's logging counter can be one step
        behind or ahead of `global_step`, and every metric of the resumed run would be logged at
        the wrong step.
        """
        self.trainer.fit_loop.epoch_loop._batches_that_stepped = self.trainer.global_step

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        # The MLM mask of a step depends only on (seed, step), so a resumed run masks identically.
        loss, _ = self._loss(batch, generator_seed=self.hparams.seed * 1_000_003 + self.global_step,
                             compiled=self._recipe_on("compile"))
        self._check_finite(loss)
        if self.flops_per_batch is None:
            self.flops_per_batch = self.flops_per_window * batch.size(0)
        tokens_per_step = (
            token_count(batch) * self.trainer.world_size * self.trainer.accumulate_grad_batches
        )
        # A GPU tensor, read on the host only when logged; but Lightning turns every prog_bar
        # metric into a number (`.item()`) at the end of every batch, so sync-free it is not a
        # prog_bar metric: the bar (repgeom.callbacks.progress_bar) reads it at the logging steps.
        sync_free = self._recipe_on("sync_free_logging")
        self.log("train/loss", loss, prog_bar=not sync_free)
        # A float logged every step is copied to the GPU every step, and a blocking copy waits
        # for the GPU's queue; sync-free, it is logged only at the steps the loggers write.
        if not sync_free or self._logs_this_step():
            self.log("train/tokens_seen", float((self.global_step + 1) * tokens_per_step))
        return loss

    def _logs_this_step(self) -> bool:
        """Whether the loggers write this step's metrics (trainer.log_every_n_steps)."""
        return logs_this_step(self.trainer, self.global_step)

    def _check_finite(self, loss: torch.Tensor) -> None:
        """Stop on a NaN or infinite loss; reading it is a host sync, so on CUDA the check runs
        every `finite_check_every_n_steps` steps (over every loss since the last check), before
        each validation, before each checkpoint is written and at the end of training."""
        every = finite_check_interval(
            self.hparams.get("finite_check_every_n_steps", 1), self.device,
            self.trainer.log_every_n_steps,
        )
        if every == 1:
            bad = not torch.isfinite(loss).item()
            if self.trainer.strategy.reduce_boolean_decision(bad, all=False):
                raise NonFiniteLossError(
                    f"training loss became {loss.item()} at step {self.global_step}; "
                    f"{_NONFINITE_ADVICE}"
                )
            return
        bad = ~torch.isfinite(loss.detach())
        self._nonfinite = bad if self._nonfinite is None else self._nonfinite | bad
        if (self.global_step + 1) % every == 0:
            self._raise_if_nonfinite_since_last_check()

    def _raise_if_nonfinite_since_last_check(self) -> None:
        if self._nonfinite is None:
            return
        bad = bool(self._nonfinite.item())
        self._nonfinite = None
        if self.trainer.strategy.reduce_boolean_decision(bad, all=False):
            raise NonFiniteLossError(
                f"training loss became NaN or infinite at or before step {self.global_step}; "
                f"{_NONFINITE_ADVICE}"
            )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """No checkpoint of weights trained on a non-finite loss the sparse check has not seen."""
        self._raise_if_nonfinite_since_last_check()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A compile=true checkpoint written before issue 34 holds `_forward._orig_mod.` keys
        (the compiled wrapper was a submodule) where every other holds `_forward.`: renamed."""
        state = checkpoint.get("state_dict") or {}
        for key in [k for k in state if k.startswith("_forward._orig_mod.")]:
            state["_forward." + key.removeprefix("_forward._orig_mod.")] = state.pop(key)

    def on_train_start(self) -> None:
        """Keep this run's optimizer kernels (recipe.fused_adamw) after a resume.

        `Optimizer.load_state_dict` replaces each param group by the checkpoint's, its `fused`
        and `foreach` flags included: a checkpoint written without the recipe (before it, or
        `recipe=off`, or on the CPU) would resume a GPU run on the for-each AdamW, and a GPU
        checkpoint would resume a CPU run on the fused one. The flags this run chose are put
        back (Lightning restores the optimizer state before this hook).
        """
        kernels = getattr(self, "_kernels", None)
        if kernels is None:
            return
        for optimizer in self.trainer.optimizers:
            if len(optimizer.param_groups) != len(kernels):
                continue
            for group, chosen in zip(optimizer.param_groups, kernels, strict=True):
                group.update(chosen)

    def on_validation_start(self) -> None:
        self._raise_if_nonfinite_since_last_check()  # before the validation that checkpoints

    def on_train_end(self) -> None:
        self._raise_if_nonfinite_since_last_check()  # a run does not end "done" on NaN weights

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        loss, count = self._loss(batch, generator_seed=self.hparams.seed * 7919 + batch_idx)
        weight = count.item()
        self.log("val/loss", loss, prog_bar=True, batch_size=weight, sync_dist=True)
        self.log("val/bpc", loss / math.log(2), prog_bar=True, batch_size=weight, sync_dist=True)

    def configure_optimizers(self) -> dict[str, Any]:
        optim = _plain(self.hparams.optim)
        decay = [p for p in self.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.requires_grad and p.dim() < 2]
        weight_decay = optim["optimizer"].get("weight_decay", 0.0)
        groups = [
            {
                "name": "decay",
                "params": decay,
                "weight_decay": weight_decay,
            },  # matrices, embeddings
            {
                "name": "no_decay",
                "params": no_decay,
                "weight_decay": 0.0,
            },  # biases, norms (nanoGPT)
        ]
        # recipe.fused_adamw: one fused kernel for the update of every parameter (CUDA). Not
        # under a GradScaler (16-mixed): a fused step unscales the gradients itself, after
        # clipping would have read them scaled (Lightning refuses that pair).
        try:
            plugin = self.trainer.precision_plugin
        except RuntimeError:  # not attached to a Trainer (the optimizer built on its own)
            plugin = None
        scaled = getattr(plugin, "scaler", None) is not None
        fused = {"fused": True} if self._recipe_on("fused_adamw") and not scaled else {}
        optimizer = instantiate(optim["optimizer"], _partial_=True)(groups, **fused)
        # The kernel choice of this run's groups, put back after a resume (`on_train_start`).
        self._kernels = [{k: g.get(k) for k in _KERNEL_KEYS} for g in optimizer.param_groups]
        scheduler = warmup_cosine(optimizer, **optim["scheduler"])
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


    def configure_gradient_clipping(
        self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Lightning's clipping, also for a fused optimizer under bf16 autocast.

        Lightning's mixed-precision plugin refuses to clip for any optimizer that unscales
        inside its step (fused AdamW), because under a GradScaler the gradients it would clip
        are still scaled. bf16-mixed has no scaler, so the gradients are the true ones: they
        are clipped by the plain `Precision.clip_gradients` (`torch.nn.utils.clip_grad_norm_`),
        what any other optimizer gets.
        """
        plugin = self.trainer.precision_plugin
        # torch's optimizers unscale inside their step exactly when they are fused (the flag
        # Lightning's plugin reads, `_step_supports_amp_scaling`, is set from `fused`)
        fused = any(group.get("fused") for group in optimizer.param_groups)
        if gradient_clip_val and fused and getattr(plugin, "scaler", None) is None:
            algorithm = GradClipAlgorithmType(gradient_clip_algorithm or "norm")
            Precision.clip_gradients(plugin, optimizer, float(gradient_clip_val), algorithm)
            return
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)


def _plain(config: Any) -> dict[str, Any]:
    """A DictConfig or dict as a plain, resolved dict."""
    if isinstance(config, DictConfig):
        return OmegaConf.to_container(config, resolve=True)  # type: ignore[return-value]
    return dict(config)
