"""Training throughput: the Lightning loop against a bare PyTorch loop, same model and batch.

Both loops run the same `CharLM` objective (loss, AdamW groups, warmup-cosine schedule, gradient
clipping) on the same batches, in alternating rounds in one process so that both see the same
machine load; the ratio of their median tokens/s is the Lightning overhead.

    python benchmarks/bench_train_throughput.py                       # gpt_tiny on CPU
    python benchmarks/bench_train_throughput.py --model gpt_small --batch-size 16 --device cuda
    python benchmarks/bench_train_throughput.py --batch-size 32 --compile   # compile=true pays?

With ``--compile`` it times the bare loop eagerly and with ``compile=true`` (`torch.compile` of
the model) instead, and prints the compilation's seconds (the first steps) and the number of
steps after which it has paid for itself.
"""

from __future__ import annotations

import argparse
import statistics
import time

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from repgeom.data.vocab import Vocab
from repgeom.models.lightning_module import CharLM, warmup_cosine
from repgeom.train import resolve_precision

CONF_DIR = str(__import__("pathlib").Path(__file__).resolve().parents[1] / "conf")


def build_module(model: str, masking: str, total_steps: int, compile: bool = False) -> CharLM:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(
            "train", overrides=[f"model={model}", f"masking={masking}", "output_dir=/tmp"]
        )
    vocab = Vocab(range(205))  # enwik8's byte vocabulary size
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    model_cfg.pop("_target_")
    model_cfg.update(vocab_size=vocab.size, causal=bool(cfg.masking.causal))
    optim = OmegaConf.to_container(cfg.optim, resolve=False)
    optim["scheduler"]["total_steps"] = total_steps
    return CharLM(model_cfg, OmegaConf.to_container(cfg.masking), optim, vocab.to_dict(),
                  compile=compile)


class Batches(torch.utils.data.Dataset):
    def __init__(self, n: int, batch_size: int, block_size: int, vocab_size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.data = torch.randint(
            0, vocab_size - 2, (n, batch_size, block_size + 1), generator=generator
        )

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


def bare_loop(module: CharLM, batches: Batches, device: torch.device, precision: str) -> float:
    """Seconds for one pass over `batches` with a hand-written loop."""
    module.to(device).train()
    decay = [p for p in module.parameters() if p.dim() >= 2]
    no_decay = [p for p in module.parameters() if p.dim() < 2]
    optim = module.hparams.optim
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": optim["optimizer"]["weight_decay"]},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=optim["optimizer"]["lr"],
        betas=tuple(optim["optimizer"]["betas"]),
    )
    scheduler = warmup_cosine(optimizer, **optim["scheduler"])
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed")
    _sync(device)
    start = time.perf_counter()
    for step, batch in enumerate(batches):
        batch = batch.to(device, non_blocking=True)
        with autocast:
            loss, _ = module._loss(batch, generator_seed=step)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    _sync(device)
    return time.perf_counter() - start


def lightning_loop(module: CharLM, batches: Batches, accelerator: str, precision: str) -> float:
    """Seconds for one pass over `batches` through `Trainer.fit` (timed from the first batch)."""
    timer = _Timer()
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=precision,
        max_steps=len(batches),
        gradient_clip_val=1.0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    loader = torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False)
    trainer.fit(module, train_dataloaders=loader)
    return timer.seconds


def compile_pays(args: argparse.Namespace) -> None:
    """Bare loops, eager and compiled, alternating; the compiled module's first steps timed."""
    device = torch.device(args.device)
    precision = resolve_precision("auto") if device.type == "cuda" else "32-true"
    total = args.steps * args.rounds * 2 + 10
    eager = build_module(args.model, args.masking, total)
    compiled = build_module(args.model, args.masking, total, compile=True)
    compiled.model.load_state_dict(eager.model.state_dict())
    block = eager.model.config.block_size
    warm = Batches(3, args.batch_size, block, eager.vocab.size)
    bare_loop(eager, warm, device, precision)
    first = bare_loop(compiled, warm, device, precision)  # compilation happens here
    batches = Batches(args.steps, args.batch_size, block, eager.vocab.size)
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(args.rounds):
        times["eager"].append(bare_loop(eager, batches, device, precision) / args.steps)
        times["compiled"].append(bare_loop(compiled, batches, device, precision) / args.steps)
    step_eager, step_compiled = (statistics.median(times[k]) for k in ("eager", "compiled"))
    compile_seconds = first - 3 * step_compiled
    print(f"device: {device} ({torch.get_num_threads()} threads); model {args.model}, batch "
          f"{args.batch_size} x {block}; median of {args.rounds} rounds of {args.steps} steps")
    print(f"eager:    {step_eager * 1000:.0f} ms/step")
    print(f"compiled: {step_compiled * 1000:.0f} ms/step; compilation {compile_seconds:.1f} s")
    gain = step_eager - step_compiled
    if gain > 0:
        print(f"compile=true pays for itself after {compile_seconds / gain:.0f} steps")
    else:
        print("compile=true does not pay for itself: a compiled step is not faster")


class _Timer(L.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == 0:
            _sync(pl_module.device)
            self.start = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:
        _sync(pl_module.device)
        self.seconds = time.perf_counter() - self.start


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt_tiny")
    parser.add_argument("--masking", default="causal")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", action="store_true",
                        help="eager against torch.compile (bare loops) instead of Lightning")
    args = parser.parse_args()
    if args.compile:
        compile_pays(args)
        return

    device = torch.device(args.device)
    precision = resolve_precision("auto") if device.type == "cuda" else "32-true"
    module = build_module(args.model, args.masking, total_steps=args.steps * args.rounds * 2)
    block = module.model.config.block_size
    batches = Batches(args.steps, args.batch_size, block, module.vocab.size)
    tokens = args.steps * args.batch_size * block
    # One warm-up pass of each (allocator, kernels, Lightning set-up).
    bare_loop(module, Batches(3, args.batch_size, block, module.vocab.size), device, precision)
    lightning_loop(
        module, Batches(3, args.batch_size, block, module.vocab.size), device.type, precision
    )
    bare, light = [], []
    for _ in range(args.rounds):
        bare.append(tokens / bare_loop(module, batches, device, precision))
        light.append(tokens / lightning_loop(module, batches, device.type, precision))
    bare_tps, light_tps = statistics.median(bare), statistics.median(light)
    n_params = module.model.num_params()
    where = (
        torch.cuda.get_device_name()
        if device.type == "cuda"
        else f"{torch.get_num_threads()} CPU threads"
    )
    print(f"device: {device} ({where})")
    print(
        f"model: {args.model} ({n_params / 1e6:.2f}M non-embedding params), "
        f"masking={args.masking}, "
        f"batch {args.batch_size} x {block} tokens, precision {precision}"
    )
    print(
        f"bare PyTorch loop: {bare_tps:,.0f} tokens/s "
        f"(median of {args.rounds} rounds of {args.steps} steps)"
    )
    print(f"Lightning loop:    {light_tps:,.0f} tokens/s")
    print(f"ratio Lightning / bare: {light_tps / bare_tps:.3f}")
    if device.type == "cuda":
        from lightning.fabric.utilities.throughput import get_available_flops

        dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float32
        peak = get_available_flops(device, dtype)
        name = torch.cuda.get_device_name(device)
        if peak is None and "h200" in name.lower():
            # Lightning maps only "H200 SXM1"/"NVL1", and its h200 rows hold the datasheet's
            # with-sparsity rates (2000 TFLOP/s bf16). The H200 is the H100 SXM's chip with the
            # same dense rates (989 TFLOP/s bf16), so MFU is read against that row.
            from lightning.fabric.utilities.throughput import _CUDA_FLOPS

            peak = _CUDA_FLOPS["h100 sxm"].get(dtype)
        flops_per_token = module.flops_per_window / block
        if peak:
            print(f"MFU (Lightning loop): {light_tps * flops_per_token / peak:.3f} "
                  f"(peak {peak / 1e12:.0f} TFLOP/s, {name})")


if __name__ == "__main__":
    main()
