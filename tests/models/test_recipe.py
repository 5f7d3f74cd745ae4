"""The GPU recipe's switches (conf/recipe/): "auto" is on for CUDA only, bad values are refused
by name before any data is read, and the module reads them against its own device."""

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from hydra_configs import compose_train
from omegaconf import OmegaConf

from repgeom.data.vocab import Vocab
from repgeom.models.lightning_module import CharLM
from repgeom.models.recipe import RecipeError, finite_check_interval, switch_on
from repgeom.options import check_options


def test_auto_is_on_for_cuda_only_and_true_false_are_kept() -> None:
    assert switch_on("auto", "cuda") and not switch_on("auto", torch.device("cpu"))
    assert switch_on(True, "cpu") and not switch_on(False, "cuda")
    assert finite_check_interval("auto", "cpu", log_every=10) == 1
    assert finite_check_interval("auto", "cuda", log_every=10) == 10
    assert finite_check_interval(5, "cuda", log_every=10) == 5
    with pytest.raises(RecipeError, match="true, false or 'auto'"):
        switch_on("yes", "cpu")


@pytest.mark.parametrize(
    ("override", "name"),
    [("recipe.compile=maybe", "recipe.compile"), ("recipe.tf32=1", "recipe.tf32"),
     ("recipe.finite_check_every_n_steps=0", "recipe.finite_check_every_n_steps")],
)
def test_a_bad_recipe_value_is_refused_by_name(tmp_path: Path, override: str, name: str) -> None:
    with pytest.raises(RecipeError, match=name):
        check_options(compose_train(tmp_path, [override]))


def test_the_default_recipe_is_auto_and_recipe_off_is_the_path_before_it(tmp_path: Path) -> None:
    default = compose_train(tmp_path).recipe
    assert {default[k] for k in default} == {"auto"}
    off = compose_train(tmp_path, ["recipe=off"]).recipe
    assert not off.compile and not off.tf32 and not off.fused_adamw
    assert off.finite_check_every_n_steps == 1 and not off.sync_free_logging


def _module(tmp_path: Path, **recipe) -> CharLM:
    cfg = compose_train(tmp_path)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model.update(vocab_size=40, causal=True)
    vocab = Vocab(range(37))
    return CharLM(model, OmegaConf.to_container(cfg.masking), OmegaConf.to_container(
        cfg.optim, resolve=False) | {"scheduler": {"warmup_steps": 1, "total_steps": 10,
                                                   "min_lr_ratio": 0.1}},
                  vocab.to_dict(), **recipe)


@pytest.mark.slow  # torch.compile on the CPU: about a minute on 2 cores
def test_compile_leaves_the_state_dict_keys_and_the_loss_unchanged(tmp_path: Path) -> None:
    eager = _module(tmp_path, compile=False)
    compiled = _module(tmp_path, compile=True)
    compiled.load_state_dict(eager.state_dict())
    # Before issue 34 `torch.compile(self.model)` was an attribute of the module, which
    # registered it as a submodule: a compile=true run's checkpoints held `_forward._orig_mod.`
    # keys where an eager run's hold `_forward.` (the eager alias of the model, kept).
    assert list(compiled.state_dict()) == list(eager.state_dict())
    assert not any("_orig_mod" in key for key in compiled.state_dict())
    window = torch.randint(0, 37, (2, compiled.model.config.block_size + 1),
                           generator=torch.Generator().manual_seed(0))
    want, _ = eager._loss(window, generator_seed=0)
    got, _ = compiled._loss(window, generator_seed=0, compiled=True)
    # Inductor fuses the layer norms, GELU and the cross-entropy and sums in another order:
    # float32 rounding, ~1e-7 relative per op over a few dozen ops.
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    assert list(compiled.state_dict()) == list(eager.state_dict())  # also after compiling


def test_fused_adamw_is_asked_for_by_the_switch(tmp_path: Path) -> None:
    module = _module(tmp_path, fused_adamw=True)
    optimizer = module.configure_optimizers()["optimizer"]
    assert all(group["fused"] for group in optimizer.param_groups)
    module = _module(tmp_path, fused_adamw="auto")  # on the CPU: off, as before the recipe
    optimizer = module.configure_optimizers()["optimizer"]
    assert not any(group.get("fused") for group in optimizer.param_groups)


def test_the_ddp_trainer_keeps_gradients_in_the_all_reduce_buckets(tmp_path: Path) -> None:
    cfg = compose_train(tmp_path, ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"])
    strategy = instantiate(cfg.trainer.strategy)
    assert strategy._ddp_kwargs == {"gradient_as_bucket_view": True}


def test_a_compile_checkpoint_from_before_the_recipe_loads(tmp_path: Path) -> None:
    # Before issue 34 a compile=true run saved its weights under `_forward._orig_mod.` where
    # every other run saves `_forward.`; a strict load (a resume) must still take it.
    module = _module(tmp_path)
    old = {k.replace("_forward.", "_forward._orig_mod.", 1): v.clone()
           for k, v in module.state_dict().items()}
    checkpoint = {"state_dict": old}
    fresh = _module(tmp_path)
    fresh.on_load_checkpoint(checkpoint)
    fresh.load_state_dict(checkpoint["state_dict"])  # strict: every key matches
    for key, value in module.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[key], value, rtol=0, atol=0)


class _MatmulBeforeTorch29:
    """torch < 2.9's `torch.backends.cuda.matmul` (cuBLASModule): `allow_tf32` only, and setting
    any name it does not know raises AttributeError("Unknown attribute ...")."""

    def __init__(self) -> None:
        object.__setattr__(self, "flags", {"allow_tf32": False})

    def __getattr__(self, name: str):
        if name in self.flags:
            return self.flags[name]
        raise AttributeError("Unknown attribute " + name)

    def __setattr__(self, name: str, value) -> None:
        if name not in self.flags:
            raise AttributeError("Unknown attribute " + name)
        self.flags[name] = value


def test_tf32_on_cuda_falls_back_to_allow_tf32_on_a_torch_before_2_9(monkeypatch) -> None:
    from repgeom.train import _set_tf32

    old = _MatmulBeforeTorch29()
    monkeypatch.setattr(torch.backends.cuda, "matmul", old)
    _set_tf32("auto", torch.device("cuda"))  # before the fix: AttributeError, every CUDA run
    assert old.allow_tf32 is True
    _set_tf32("auto", torch.device("cpu"))  # the CPU leaves it as it was
    assert old.allow_tf32 is True


def test_tf32_on_cuda_sets_fp32_precision_where_torch_has_it() -> None:
    from repgeom.train import _set_tf32

    matmul = torch.backends.cuda.matmul
    if not hasattr(matmul, "fp32_precision"):
        pytest.skip("torch < 2.9: no fp32_precision")
    before = matmul.fp32_precision
    try:
        _set_tf32(False, torch.device("cuda"))
        assert matmul.fp32_precision == before
        _set_tf32("auto", torch.device("cuda"))
        assert matmul.fp32_precision == "tf32"
    finally:
        matmul.fp32_precision = before
