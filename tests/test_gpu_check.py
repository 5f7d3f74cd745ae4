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
    r"repgeom GPU check \(cpu smoke\) \d{4}-\d\d-\d\d \d\d:\d\d UTC, stages device, training, "
    r"knee, band, share, knn, hub, results .+",
    r"device: cpu \(smoke\), torch \S+, CUDA \S+, python [\d.]+",
    r"matmul \d+\^3 \w+: [\d.]+ TFLOP/s",
    r"compile \(gpt_tiny 2 x 64, forward and backward, backend \w+, Inductor cache .+\): "
    r"[\d.]+ s",
    r"training: gpt_\w+ (bf16-mixed|32-true), batch \d+ x \d+, N [\d,]+, [\d,]+ FLOPs/token "
    r"\(6N \+ 12 L d T\): " + "; ".join(PATH.format(p) for p in ("today", "new default",
                                                                "plain loop")),
    r"training ratios: new default / today [\d.]+x, Lightning \(new default\) / plain loop "
    r"[\d.]+",
    r"micro-batch 1 x \d+ \(new default\): ([\d,]+ tokens/s(, peak [\d.]+ GiB)?|out of memory)",
    r"micro-batch 2 x \d+ \(new default\): ([\d,]+ tokens/s(, peak [\d.]+ GiB)?|out of memory)",
    r"micro-batch knee \(new default, windows of \d+\): \d+ \(the smallest within 5% of the "
    r"best, [\d,]+ tokens/s\)",
    r"loss band \(gpt_\w+, \d+ steps on the sample, \d+ logged steps\): two runs of today "
    r"differ by at most [\d.e+-]+ \(mean [\d.e+-]+\); the new default differs from their mean "
    r"by at most [\d.e+-]+ \(mean [\d.e+-]+\): (within|OUTSIDE) the band",
    r"probe share \(gpt_\w+ new default, default schedule: \d+ probes in \d+ steps\): "
    r"in-process [\d.]+% \([\d.]+ s per probe\), offloaded [\d.]+% \([\d.]+ s per probe; "
    r"the worker (done \d+ s|not done \d+ s) after the run\), step [\d.]+ ms \([\d,]+ tokens/s\)",
    r"knn exact \d+ x \d+, k=10: (repgeom on the GPU \(.+\) [\d.]+ s for all, )?FAISS CPU "
    r"[\d.]+ s for \d+ queries \(\d+ threads, ~\d+ s for all\)(; no GPU here|; neighbours "
    r"shared with FAISS CPU [\d.]+%)",
    r"hub trajectory \(tiny Pythia, 1 revision\): [\d.]+ s per revision \(download [\d.]+, "
    r"load [\d.]+, forward [\d.]+, metrics [\d.]+\); the probe.py process [\d.]+ s",
    r"total: \d+ s \(device \d+ s; training \d+ s; knee \d+ s; band \d+ s; share \d+ s; "
    r"knn \d+ s; hub \d+ s\)",  # no stage FAILED
]


def test_gpu_check_runs_every_stage_at_toy_sizes_on_the_cpu(tmp_path) -> None:
    results = tmp_path / "results.txt"
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--cpu-smoke"], cwd=ROOT,
                          env=subprocess_env(PYTHON=PYTHON, GPU_CHECK_RESULTS=str(results)),
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == len(LINES), proc.stdout
    for line, pattern in zip(lines, LINES, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)
    assert results.read_text().splitlines() == lines  # every line also in the results file


def test_gpu_check_refuses_a_machine_without_a_gpu_by_name() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the full check would run")
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh"], cwd=ROOT,
                          env=subprocess_env(PYTHON=PYTHON), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0
    assert "no CUDA device here" in proc.stderr and "--cpu-smoke" in proc.stderr


def _check_module():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    return gpu_check


def test_a_failing_stage_leaves_its_last_40_stderr_lines(tmp_path) -> None:
    gpu_check = _check_module()
    lines: list[str] = []
    code = "import sys\nfor i in range(100): print('line', i, file=sys.stderr)\nsys.exit(3)"
    outcome, _ = gpu_check.run_budgeted([PYTHON, "-c", code], 60, lines.append, "stage x")
    assert outcome == "failed (exit 3)"
    assert lines[0].startswith("stage x failed (exit 3) after ")
    assert lines[0].endswith("its last 40 stderr lines:")
    assert lines[1:] == [f"  | line {i}" for i in range(60, 100)]


def test_a_stage_past_its_budget_is_stopped_even_if_it_ignores_sigterm(tmp_path) -> None:
    gpu_check = _check_module()
    lines: list[str] = []
    code = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('started', file=sys.stderr, flush=True)\ntime.sleep(600)")
    outcome, seconds = gpu_check.run_budgeted([PYTHON, "-c", code], 2, lines.append, "stage y")
    assert outcome == "stopped at its 2 s budget"
    assert seconds < 60  # SIGKILL after gpu_check.KILL_GRACE_S, not the 600 s sleep
    assert lines[-1] == "  | started"


def test_the_stage_budgets_fit_the_check_limit() -> None:
    gpu_check = _check_module()
    assert sum(gpu_check.BUDGETS_S.values()) <= 400  # gpu_check.sh's 420 s, less a margin
    assert gpu_check.BUDGETS_S["device"] <= 60
    text = (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    assert 'LIMIT_S="${GPU_CHECK_LIMIT_S:-420}"' in text
    assert 'PYTHON="${PYTHON:-python3}"' in text


# A `python` that imports everything (`-c`) and then, as the check, ignores SIGTERM and hangs:
# what a fit does whose step never returns (Lightning's handler only notes a SIGTERM).
HANGING_PYTHON = """#!/usr/bin/env bash
if [ "$1" = "-c" ]; then exit 0; fi
trap '' TERM
sleep 600
"""


def test_gpu_check_ends_at_its_limit_even_if_the_check_ignores_sigterm(tmp_path) -> None:
    import os
    import signal

    fake = tmp_path / "python"
    fake.write_text(HANGING_PYTHON)
    fake.chmod(0o755)
    env = subprocess_env(PYTHON=str(fake), GPU_CHECK_LIMIT_S="1", GPU_CHECK_KILL_AFTER_S="2")
    proc = subprocess.Popen(["bash", "benchmarks/gpu_check.sh"], cwd=ROOT, env=env,
                            start_new_session=True)
    try:
        returncode = proc.wait(timeout=120)  # before the fix: still waiting on the sleep
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # KILLed at the limit: timeout sends it to its process group, itself included
    assert returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)


# A `python` that lacks the check's packages (`-c` fails) and whose pip never returns.
HANGING_PIP = """#!/usr/bin/env bash
if [ "$1" = "-c" ]; then exit 1; fi
if [ "$1 $2" = "-m pip" ]; then sleep 600; fi
exit 0
"""


def test_gpu_check_gives_up_on_a_wheel_install_that_hangs(tmp_path) -> None:
    import os
    import signal

    fake = tmp_path / "python"
    fake.write_text(HANGING_PIP)
    fake.chmod(0o755)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "x-1.0-py3-none-any.whl").touch()
    env = subprocess_env(PYTHON=str(fake), GPU_CHECK_WHEELS=str(wheels), TMPDIR=str(tmp_path),
                         GPU_CHECK_INSTALL_LIMIT_S="1")
    proc = subprocess.Popen(["bash", "benchmarks/gpu_check.sh"], cwd=ROOT, env=env,
                            start_new_session=True, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate(timeout=120)  # before the fix: waiting on pip
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 1
    assert "installing the wheel bundle failed or took over 1 s" in stderr
