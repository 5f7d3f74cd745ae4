"""repgeom.peak_flops: MFU's denominator is the dense bf16 peak of every H100/H200 variant,
found by device name; a with-sparsity figure is refused (issue 41)."""

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.trainer.states import RunningStage

from repgeom import peak_flops as pf
from repgeom.callbacks.throughput_monitor import ThroughputMonitor


@pytest.mark.parametrize(("name", "variant", "tflops"), [
    ("NVIDIA H100 80GB HBM3", "h100 sxm", 989.4),
    ("NVIDIA H100 PCIe", "h100 pcie", 756.0),
    ("NVIDIA H100 80GB HBM2e", "h100 pcie", 756.0),
    ("NVIDIA H100 NVL", "h100 nvl", 835.5),
    ("NVIDIA H200", "h200 sxm", 989.4),
    ("NVIDIA H200 NVL", "h200 nvl", 835.5),
    ("NVIDIA GH200 480GB", "gh200", 989.4),
])
def test_every_hopper_variant_reads_its_dense_bf16_peak(name, variant, tflops) -> None:
    assert pf.hopper_variant(name) == variant
    assert pf.peak_flops(name, torch.bfloat16) == pytest.approx(tflops * 1e12)
    assert pf.peak_flops(name, torch.float16) == pytest.approx(tflops * 1e12)
    assert pf.peak_flops(name, torch.float32) is None  # no doubtful figure for other dtypes


@pytest.mark.parametrize("name", ["NVIDIA A100-SXM4-80GB", "Tesla T4", "NVIDIA L4"])
def test_other_gpus_are_left_to_lightning(name) -> None:
    assert pf.hopper_variant(name) is None and pf.peak_flops(name, torch.bfloat16) is None


def test_the_h100_nvl_is_not_read_at_lightnings_with_sparsity_figure() -> None:
    from lightning.fabric.utilities.throughput import _CUDA_FLOPS

    # Lightning's H100 NVL row holds 1,978.8 TFLOP/s, twice the dense rate of any H100
    assert _CUDA_FLOPS["h100 nvl"][torch.bfloat16] > 1.5e15
    assert pf.peak_flops("NVIDIA H100 NVL", torch.bfloat16) < 1e15


def test_a_with_sparsity_figure_is_refused() -> None:
    assert pf._dense("h100 sxm", 989.4, 1978.9) == pytest.approx(989.4e12)
    with pytest.raises(ValueError, match="not the dense half"):
        pf._dense("h100 nvl", 1978.8, 1978.8)  # Lightning's figure, as if it were dense
    assert all(f < 1.0e15 for f in pf.DENSE_BF16_FLOPS.values())


def _setup(monkeypatch, device_name: str, precision: str) -> ThroughputMonitor:
    """The monitor's setup as a fit on cuda:0 would run it, on a machine without CUDA."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: device_name)
    trainer = SimpleNamespace(
        precision=precision, strategy=SimpleNamespace(root_device=torch.device("cuda", 0)),
        enable_validation=False, world_size=1, log_every_n_steps=10,
        state=SimpleNamespace(stage=RunningStage.TRAINING))
    module = SimpleNamespace(hparams={"sync_free_logging": False})
    monitor = ThroughputMonitor(batch_size_fn=len)
    monitor.setup(trainer, module, "fit")
    return monitor


def test_train_py_monitor_logs_mfu_against_the_dense_peak_on_an_h200(monkeypatch) -> None:
    monitor = _setup(monkeypatch, "NVIDIA H200", "bf16-mixed")
    assert monitor.available_flops == pytest.approx(989.4e12)  # Lightning's: None
    assert monitor.throughputs[RunningStage.TRAINING].available_flops == pytest.approx(989.4e12)
    monitor = _setup(monkeypatch, "NVIDIA H100 NVL", "bf16-mixed")
    assert monitor.available_flops == pytest.approx(835.5e12)  # Lightning's: 1,978.8e12


def test_a_non_hopper_gpu_keeps_lightnings_figure(monkeypatch) -> None:
    monitor = _setup(monkeypatch, "NVIDIA A100-SXM4-80GB", "bf16-mixed")
    assert monitor.available_flops == pytest.approx(312e12)
