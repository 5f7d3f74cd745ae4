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


# `python` for gpu_wheels.sh with no network: `pip freeze` lists every package at 1.0, `pip
# download` and `pip wheel` of a pin leave a placeholder wheel; `pip wheel` of a folder (repgeom
# itself) is the real one, without build isolation (no index to fetch setuptools from).
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1 $2" != "-m pip" ]; then exec "$REAL_PYTHON" "$@"; fi
shift 2
cmd="$1"; shift
if [ "$cmd" = freeze ]; then
  for n in hydra-core omegaconf antlr4-python3-runtime faiss-cpu huggingface_hub httpx2 \\
           httpcore2 hf-xet truststore idna regex transformers tokenizers safetensors; do
    echo "$n==1.0"
  done
  exit 0
fi
last="${@: -1}"
if [ "$cmd" = wheel ] && [ -d "$last" ]; then
  exec "$REAL_PYTHON" -m pip wheel --no-build-isolation "$@"
fi
dest=""
while [ $# -gt 0 ]; do
  case "$1" in --dest|--wheel-dir) dest="$2"; shift;; esac
  shift
done
touch "$dest/${last%%==*}-1.0-py3-none-any.whl"
"""


def _tree(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if "__pycache__" not in p.parts}


def test_gpu_wheels_writes_only_into_its_own_folder(tmp_path) -> None:
    import shutil

    repo = tmp_path / "repo"
    for name in ("pyproject.toml", "setup.py", "README.md"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, repo / name)
    for name in ("src", "conf", "benchmarks"):
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns(
            "__pycache__", "*.egg-info"))
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    before = _tree(repo)
    proc = subprocess.run(["bash", "benchmarks/gpu_wheels.sh", "bundle"], cwd=repo,
                          env=subprocess_env(PYTHON=str(fake), REAL_PYTHON=PYTHON),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    written = _tree(repo) - before
    outside = sorted(p for p in written if not p.startswith("bundle"))
    assert outside == [], outside  # setuptools' build/ and src/repgeom.egg-info before the fix
    wheels = sorted(p.name for p in (repo / "bundle").iterdir())
    assert any(w.startswith("repgeom-") and w.endswith(".whl") for w in wheels), wheels
    assert "hydra-core-1.0-py3-none-any.whl" in wheels and len(wheels) == 15, wheels
    import zipfile

    own = next(w for w in wheels if w.startswith("repgeom-"))
    names = zipfile.ZipFile(repo / "bundle" / own).namelist()
    assert "repgeom/conf/train.yaml" in names and "repgeom/train.py" in names


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
