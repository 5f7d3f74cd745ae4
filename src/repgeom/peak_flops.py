"""The dense bf16 peak of each Hopper GPU (H100, H200, GH200): the denominator of MFU.

MFU (model FLOPs utilization, Chowdhery et al. 2022, "PaLM", appendix B) divides the model's
FLOPs per second by the device's peak. NVIDIA's datasheets give the tensor-core peak twice,
dense and "with sparsity" (2:4 structured sparsity, twice the dense figure), and a dense model
can only reach the dense one. Lightning's table (`lightning.fabric.utilities.throughput`) holds
the with-sparsity figure for the H100 NVL and the H200s, and finds no entry for a plain "NVIDIA
H200"; this table is the one place in repgeom that gives a Hopper's peak (train.py's
ThroughputMonitor and benchmarks/bench_train_throughput.py both read it), each entry written
with both datasheet figures so that `_dense` refuses a with-sparsity figure put in its place.
"""

from __future__ import annotations

import torch

# (dense, with sparsity) bf16 tensor-core TFLOP/s, per GPU, from NVIDIA's datasheets: the H100
# datasheet (SXM5, PCIe and NVL columns; the NVL of 94 GB, 1,671 with sparsity), the H200
# datasheet (SXM and NVL columns) and the GH200 datasheet (its H100/H200 die, SXM figures).
_DATASHEET_BF16_TFLOPS = {
    "h100 sxm": (989.4, 1978.9),
    "h100 pcie": (756.0, 1513.0),
    "h100 nvl": (835.5, 1671.0),
    "h200 sxm": (989.4, 1978.9),
    "h200 nvl": (835.5, 1671.0),
    "gh200": (989.4, 1978.9),
}


def _dense(name: str, dense: float, with_sparsity: float) -> float:
    """`dense` in FLOP/s, refusing a figure that is not half the with-sparsity one."""
    if abs(2 * dense - with_sparsity) > 0.01 * with_sparsity:
        raise ValueError(f"peak table: {name}'s {dense} TFLOP/s is not the dense half of its "
                         f"{with_sparsity} TFLOP/s with sparsity; MFU takes the dense figure")
    return dense * 1e12


DENSE_BF16_FLOPS = {name: _dense(name, *figures) for name, figures in
                    _DATASHEET_BF16_TFLOPS.items()}
"""Dense bf16 (and fp16: the same tensor-core rate) FLOP/s of each Hopper variant."""


def hopper_variant(device_name: str) -> str | None:
    """The `DENSE_BF16_FLOPS` key of a CUDA device name, None if it is no H100/H200/GH200.

    `torch.cuda.get_device_name` says "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe",
    "NVIDIA H100 80GB HBM2e" (PCIe), "NVIDIA H100 NVL", "NVIDIA H200", "NVIDIA H200 NVL",
    "NVIDIA GH200 480GB"; an H100 or H200 named with neither NVL nor PCIe is the SXM part.
    """
    name = device_name.lower()
    if "gh200" in name:
        return "gh200"
    for chip in ("h200", "h100"):
        if chip in name:
            if "nvl" in name:
                return f"{chip} nvl"
            if chip == "h100" and ("pcie" in name or "hbm2e" in name):
                return "h100 pcie"
            return f"{chip} sxm"
    return None


def peak_flops(device_name: str, dtype: torch.dtype) -> float | None:
    """The dense peak FLOP/s of a Hopper GPU for bf16/fp16 work; None for any other dtype (its
    tensor-core rates are not in the table: no MFU rather than a doubtful one) and None for a
    device that is no Hopper (`hopper_variant`): ask Lightning's table for those."""
    variant = hopper_variant(device_name)
    if variant is None or dtype not in (torch.bfloat16, torch.float16):
        return None
    return DENSE_BF16_FLOPS[variant]
