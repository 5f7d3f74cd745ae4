"""Training throughput: today's path, the new default (the GPU recipe) and a plain PyTorch loop.

Three paths train the same `CharLM` objective (loss, AdamW groups, warmup-cosine schedule,
gradient clipping at 1.0) on the same batches, in alternating rounds in one process, so that all
three see the same machine load (issue 34):

- ``today``: train.py's Lightning loop before the recipe (`recipe=off`): eager forward, the
  for-each AdamW, a host read of the loss every step (the NaN check), Lightning's
  ThroughputMonitor (a CUDA sync every step), no TF32;
- ``new default``: train.py's Lightning loop with conf/recipe/default.yaml as a CUDA run reads it
  (compiled training loss, fused AdamW, TF32, the NaN check every log_every_n_steps steps,
  repgeom's sync-free ThroughputMonitor); on the CPU "auto" is off, so it is today's path;
- ``plain loop``: the same model, batches and recipe in a hand-written loop (no Lightning, no
  logging, no NaN check): the ceiling that Lightning's loop is measured against.

tokens/s is `train_timing`'s one definition (the timed steps' tokens over the seconds between
two device syncs, warm-up steps untimed); MFU = tokens/s x FLOPs per token / the GPU's dense
peak, the FLOPs written out (6N + attention, nanoGPT's estimate_mfu). Then the micro-batch knee:
the new default at 16, 32, 64 and 128 windows, tokens/s and peak memory each.

    python benchmarks/bench_train_throughput.py --model gpt_small --batch-size 16   # on a GPU
    python benchmarks/bench_train_throughput.py --cpu-smoke      # toy sizes on the CPU (a test)
    python benchmarks/bench_train_throughput.py ... --json out.json   # the numbers, for gpu_check
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from lightning.pytorch.loggers import CSVLogger
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_timing import StepTimer, sync  # noqa: E402

from repgeom.data.vocab import Vocab  # noqa: E402
from repgeom.models.lightning_module import CharLM, warmup_cosine  # noqa: E402
from repgeom.models.recipe import set_tf32_matmul, switch_on, vocab_multiple  # noqa: E402
from repgeom.train import resolve_precision  # noqa: E402

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
PATHS = ("today", "new default", "plain loop")
SMOKE_MODEL = ["model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32"]


def compose_train(overrides: list[str]):
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=[*overrides, "output_dir=/tmp"])


def build_module(cfg, recipe: dict, total_steps: int, device: torch.device,
                 symbols: int = 205) -> CharLM:
    """A `CharLM` as train.py builds it for `device`, over a byte vocabulary of `symbols` (205:
    enwik8's; with [MASK] and [UNK], 207), with `recipe`'s switches (recipe.pad_vocab too)."""
    vocab = Vocab(range(symbols))
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    model_cfg.pop("_target_")
    model_cfg.update(vocab_size=vocab.size, causal=bool(cfg.masking.causal),
                     vocab_multiple=vocab_multiple(recipe, device))
    optim = OmegaConf.to_container(cfg.optim, resolve=False)
    optim["scheduler"]["total_steps"] = total_steps
    switches = {k: recipe[k] for k in ("compile", "fused_adamw", "finite_check_every_n_steps",
                                       "sync_free_logging")}
    return CharLM(model_cfg, OmegaConf.to_container(cfg.masking), optim, vocab.to_dict(),
                  **switches)


class Batches(torch.utils.data.Dataset):
    """`n` random batches of (batch_size, block_size + 1) token ids, fixed by seed 0."""

    def __init__(self, n: int, batch_size: int, block_size: int, vocab_size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.data = torch.randint(
            0, vocab_size - 2, (n, batch_size, block_size + 1), generator=generator
        )

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


def set_tf32(recipe: dict, device: torch.device) -> None:
    """recipe.tf32 for this path (process-wide, as train.py sets it); off restores IEEE."""
    if device.type == "cuda":
        on = switch_on(recipe["tf32"], device)
        set_tf32_matmul(on)


def plain_loop(module: CharLM, batches: Batches, device: torch.device, precision: str,
               warmup: int) -> dict:
    """The recipe in a hand-written loop; timed as `train_timing` defines (warm-up untimed)."""
    module.to(device).train()
    optimizer = module.configure_optimizers()["optimizer"]  # the same groups, fused or not
    scheduler = warmup_cosine(optimizer, **module.hparams.optim["scheduler"])
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed")
    compiled = switch_on(module.hparams.compile, device)
    pin = device.type == "cuda"
    start, tokens, steps = None, 0, 0
    for step, batch in enumerate(batches):
        if step == warmup:
            sync(device)
            start = time.perf_counter()
        batch = (batch.pin_memory() if pin else batch).to(device, non_blocking=True)
        with autocast:
            loss, _ = module._loss(batch, generator_seed=step, compiled=compiled)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if start is not None:
            tokens += batch.size(0) * (batch.size(1) - 1)
            steps += 1
    sync(device)
    seconds = time.perf_counter() - start
    return {"tokens_per_s": tokens / seconds, "ms_per_step": 1000 * seconds / steps}


def lightning_loop(module: CharLM, batches: Batches, device: torch.device, precision: str,
                   warmup: int, callbacks_cfg, log_dir: str) -> dict:
    """train.py's loop: its Trainer arguments, its throughput monitor and LR monitor, a CSV
    logger; no validation, checkpoints or progress bar. Timed by `StepTimer`."""
    timer = StepTimer(warmup)
    callbacks = [instantiate(callbacks_cfg.throughput), instantiate(callbacks_cfg.lr_monitor),
                 timer]
    trainer = L.Trainer(
        accelerator=device.type, devices=1, precision=precision, max_steps=len(batches),
        gradient_clip_val=1.0, logger=CSVLogger(log_dir), log_every_n_steps=10,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=callbacks, limit_val_batches=0, num_sanity_val_steps=0,
    )
    loader = torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False,
                                         pin_memory=device.type == "cuda")
    trainer.fit(module, train_dataloaders=loader)
    return {"tokens_per_s": timer.tokens_per_s, "ms_per_step": timer.ms_per_step}


def measure(path: str, module: CharLM, recipe: dict, batches: Batches, device: torch.device,
            precision: str, warmup: int, callbacks_cfg, log_dir: str) -> dict:
    set_tf32(recipe, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if path == "plain loop":
        result = plain_loop(module, batches, device, precision, warmup)
    else:
        result = lightning_loop(module, batches, device, precision, warmup, callbacks_cfg,
                                log_dir)
    result["peak_gib"] = (torch.cuda.max_memory_allocated(device) / 2**30
                          if device.type == "cuda" else None)
    return result


def peak_flops(device: torch.device, precision: str) -> float | None:
    """The GPU's dense peak for the training dtype, None on the CPU: `repgeom.peak_flops` for
    an H100, H200 or GH200 (train.py's ThroughputMonitor reads the same table), else
    Lightning's table."""
    if device.type != "cuda":
        return None
    from lightning.fabric.utilities.throughput import get_available_flops

    from repgeom.peak_flops import hopper_variant
    from repgeom.peak_flops import peak_flops as hopper_peak

    dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float32
    name = torch.cuda.get_device_name(device)
    if hopper_variant(name):
        return hopper_peak(name, dtype)
    return get_available_flops(device, dtype)


def flops_per_token(module: CharLM) -> dict:
    """nanoGPT's estimate_mfu: 6N per token (forward 2N, backward 4N) plus attention's
    12 L d T (the QK^T and AV matmuls at full T, forward and backward; a causal kernel skips
    about half of it, which this count does not credit)."""
    cfg = module.model.config
    n = module.model.num_params()
    attention = 12 * cfg.n_layer * cfg.n_embd * cfg.block_size
    return {"n_params": n, "six_n": 6 * n, "attention": attention, "total": 6 * n + attention,
            "n_layer": cfg.n_layer, "n_embd": cfg.n_embd, "block_size": cfg.block_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt_small")
    parser.add_argument("--masking", default="causal")
    parser.add_argument("--batch-size", type=int, default=16, help="the paths' micro-batch")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    parser.add_argument("--rounds", type=int, default=3, help="0: no paths, the knee only")
    parser.add_argument("--knee", default="16,32,64,128",
                        help="micro-batches for the knee ('': no knee)")
    parser.add_argument("--knee-steps", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="a 2 x 32 gpt_tiny, 2 steps, knee at 1 and 2 windows, on the CPU")
    parser.add_argument("--symbols", type=int, default=205,
                        help="byte symbols of the vocabulary (205: enwik8's; 200: the bundled "
                             "sample's, which gpu_check's train.py runs read, so that all share "
                             "one compiled graph)")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args()
    model_overrides = [f"model={args.model}", f"masking={args.masking}"]
    if args.cpu_smoke:
        args.model, args.device, args.batch_size = "gpt_tiny", "cpu", 2
        args.steps, args.warmup, args.knee_steps = 2, 1, 2
        if args.knee == parser.get_default("knee"):  # else as given (gpu_check's stages)
            args.knee = "1,2"
        if args.rounds == parser.get_default("rounds"):
            args.rounds = 1
        model_overrides = ["model=gpt_tiny", f"masking={args.masking}", *SMOKE_MODEL]
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    # recompile_limit: newer torch's name of cache_size_limit (setting an unknown one raises)
    dynamo = torch._dynamo.config
    name = "recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit"
    setattr(dynamo, name, 64)  # one compiled graph per module and batch shape

    device = torch.device(args.device)
    precision = resolve_precision("auto") if device.type == "cuda" else "32-true"
    recipes = {"today": compose_train([*model_overrides, "recipe=off"]),
               "new default": compose_train(model_overrides)}
    recipes["plain loop"] = recipes["new default"]
    total = (args.warmup + args.steps) * args.rounds + 10
    modules = {p: build_module(recipes[p], OmegaConf.to_container(recipes[p].recipe), total,
                               device, args.symbols) for p in PATHS}
    for p in PATHS[1:]:  # one initial state for all three
        modules[p].load_state_dict(modules["today"].state_dict())
    block = modules["today"].model.config.block_size
    vocab_size = modules["today"].vocab.size
    batches = Batches(args.warmup + args.steps, args.batch_size, block, vocab_size)
    tokens_per_step = args.batch_size * block
    callbacks = {p: recipes[p].callbacks for p in PATHS}
    results: dict[str, list[dict]] = {p: [] for p in PATHS}
    with tempfile.TemporaryDirectory(prefix="bench_train_") as log_dir:
        for _ in range(args.rounds):
            for p in PATHS:
                recipe = OmegaConf.to_container(recipes[p].recipe)
                results[p].append(measure(p, modules[p], recipe, batches, device, precision,
                                          args.warmup, callbacks[p], log_dir))
        knee = []
        new = recipes["new default"]
        for size in (int(s) for s in args.knee.split(",") if s.strip()):
            module = build_module(new, OmegaConf.to_container(new.recipe), total, device,
                                  args.symbols)
            knee_batches = Batches(args.warmup + args.knee_steps, size, block, vocab_size)
            try:
                r = measure("new default", module, OmegaConf.to_container(new.recipe),
                            knee_batches, device, precision, args.warmup, new.callbacks, log_dir)
            except torch.OutOfMemoryError:
                r = {"tokens_per_s": None, "ms_per_step": None, "peak_gib": None}
            knee.append({"batch": size, **r})
            del module
            with contextlib.suppress(Exception):
                torch.cuda.empty_cache()

    flops = flops_per_token(modules["today"])
    peak = peak_flops(device, precision)
    summary = {}
    for p in PATHS if args.rounds else ():
        tps = statistics.median(r["tokens_per_s"] for r in results[p])
        peaks = [r["peak_gib"] for r in results[p] if r["peak_gib"] is not None]
        summary[p] = {"tokens_per_s": tps, "ms_per_step": 1000 * tokens_per_step / tps,
                      "mfu": tps * flops["total"] / peak if peak else None,
                      "peak_gib": max(peaks) if peaks else None}
    fitting = [k for k in knee if k["tokens_per_s"] is not None]
    best = max((k["tokens_per_s"] for k in fitting), default=0.0)
    knee_batch = next((k["batch"] for k in fitting if k["tokens_per_s"] >= 0.95 * best), None)
    where = (torch.cuda.get_device_name(device) if device.type == "cuda"
             else f"{torch.get_num_threads()} CPU threads")
    report = {"device": where, "torch": torch.__version__, "model": args.model,
              "batch": args.batch_size, "block": block, "precision": precision,
              "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
              "flops_per_token": flops, "peak_flops": peak, "paths": summary,
              "knee": knee, "knee_batch": knee_batch}
    _print(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


def _fmt(r: dict) -> str:
    mfu = f"MFU {r['mfu']:.3f}" if r["mfu"] is not None else "MFU n/a"
    mem = f"peak {r['peak_gib']:.2f} GiB" if r["peak_gib"] is not None else "peak memory n/a"
    return f"{r['tokens_per_s']:,.0f} tokens/s, {r['ms_per_step']:.2f} ms/step, {mfu}, {mem}"


def _print(report: dict) -> None:
    f = report["flops_per_token"]
    print(f"device: {report['device']}, torch {report['torch']}; model {report['model']}, "
          f"batch {report['batch']} x {report['block']}, precision {report['precision']}")
    print(f"N = {f['n_params']:,} parameters (all but the position embeddings; the tied "
          f"token embedding once)")
    print(f"FLOPs per token = 6N + 12 L d T = {f['six_n']:,} + 12 x {f['n_layer']} x "
          f"{f['n_embd']} x {f['block_size']} = {f['total']:,}"
          + (f"; peak {report['peak_flops'] / 1e12:.0f} TFLOP/s" if report["peak_flops"]
             else "; no GPU peak known, no MFU"))
    print(f"tokens/s: the timed steps' tokens / the seconds between a sync before the first and "
          f"one after the last; {report['warmup']} warm-up steps untimed; median of "
          f"{report['rounds']} rounds of {report['steps']} steps")
    for p, r in report["paths"].items():
        print(f"{p + ':':12} {_fmt(r)}")
    tps = {p: r["tokens_per_s"] for p, r in report["paths"].items()}
    if tps:
        print(f"new default / today {tps['new default'] / tps['today']:.2f}x; Lightning (new "
              f"default) / plain loop {tps['new default'] / tps['plain loop']:.3f}")
    parts = []
    for k in report["knee"]:
        if k["tokens_per_s"] is None:
            parts.append(f"{k['batch']}: out of memory")
        else:
            mem = f", {k['peak_gib']:.2f} GiB" if k["peak_gib"] is not None else ""
            parts.append(f"{k['batch']}: {k['tokens_per_s']:,.0f} tokens/s{mem}")
    print(f"micro-batch knee (new default, x {report['block']}): {'; '.join(parts)}; knee "
          f"{report['knee_batch']} (the smallest within 5% of the best)")


if __name__ == "__main__":
    main()
