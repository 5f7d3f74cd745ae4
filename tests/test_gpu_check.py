"""`benchmarks/gpu_check.sh --cpu-smoke`: the prepared GPU check runs end to end at toy sizes on
the CPU and prints its lines in the format benchmarks/README.md's GPU section holds."""

import re
import subprocess

import pytest
from cli_runs import PYTHON, ROOT, subprocess_env

pytestmark = pytest.mark.slow

PATH = (r"{} [\d,]+ tokens/s \([\d.]+ ms/step, MFU ([\d.]+|n/a), "
        r"peak ([\d.]+ GiB|n/a)\)")
LINES = [
    r"repgeom GPU check: device .+, torch \S+, faiss \S+",
    r"training: gpt_\w+ (bf16-mixed|32-true), batch \d+ x \d+, N [\d,]+, [\d,]+ FLOPs/token "
    r"\(6N \+ 12 L d T\): " + "; ".join(PATH.format(p) for p in ("today", "new default",
                                                                "plain loop")),
    r"training ratios: new default / today [\d.]+x, Lightning \(new default\) / plain loop "
    r"[\d.]+",
    r"micro-batch knee \(new default, windows of \d+\): \d+: [\d,]+ tokens/s( \([\d.]+ GiB\))?"
    r"(; \d+: ([\d,]+ tokens/s( \([\d.]+ GiB\))?|out of memory))*; knee \d+",
    r"loss band \(gpt_\w+, \d+ steps on the sample, \d+ logged steps\): two runs of today "
    r"differ by at most [\d.e+-]+ \(mean [\d.e+-]+\); the new default differs from their mean "
    r"by at most [\d.e+-]+ \(mean [\d.e+-]+\): (within|OUTSIDE) the band",
    r"probe share \(gpt_\w+ new default, default schedule: \d+ probes in \d+ steps\): "
    r"in-process [\d.]+% \([\d.]+ s per probe\), offloaded [\d.]+% \([\d.]+ s per probe\), "
    r"step [\d.]+ ms \([\d,]+ tokens/s\)",
    r"knn exact \d+ x \d+, k=10: (repgeom on the GPU \(.+\) [\d.]+ s, )?FAISS CPU [\d.]+ s "
    r"\(\d+ threads\)(; no GPU here| \(\d+x\); neighbours shared with FAISS CPU [\d.]+%)",
    r"hub trajectory \(tiny Pythia, 1 revision\): [\d.]+ s per revision \(download [\d.]+, "
    r"load [\d.]+, forward [\d.]+, metrics [\d.]+\); the probe.py process [\d.]+ s",
    r"total: \d+ s",
]


def test_gpu_check_runs_at_toy_sizes_on_the_cpu() -> None:
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--cpu-smoke"], cwd=ROOT,
                          env=subprocess_env(PYTHON=PYTHON), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == len(LINES), proc.stdout
    for line, pattern in zip(lines, LINES, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)


def test_gpu_check_refuses_a_machine_without_a_gpu_by_name() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the full check would run")
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh"], cwd=ROOT,
                          env=subprocess_env(PYTHON=PYTHON), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0
    assert "no CUDA device here" in proc.stderr and "--cpu-smoke" in proc.stderr
