#!/usr/bin/env bash
# Build the bundle of wheels that benchmarks/gpu_check.sh needs on a bare GPU node with no
# network (issue 34): one command, on a machine with PyPI access, before the node is lent.
#
#   bash benchmarks/gpu_wheels.sh                 # into .whl/ (git-ignored), for Python 3.11
#   GPU_WHEELS_PYTHON=3.12 bash benchmarks/gpu_wheels.sh /some/folder
#
# The node's image brings torch (its CUDA build) and Lightning; the H200 lent on 2026-11-26
# lacked Hydra, OmegaConf, FAISS and this project's huggingface_hub 2.x (benchmarks/README.md,
# "GPU check"). The bundle holds those, at the versions of this repository's environment (read
# from `pip freeze` of $PYTHON, so the node runs what the tests ran), as manylinux x86_64
# wheels for the node's Python; antlr4-python3-runtime ships only a source archive, so it is
# built into a wheel here. Nothing is installed on this machine. On the node, gpu_check.sh
# installs the bundle with `pip install --no-index --find-links` when an import it needs fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python}"
OUT="${1:-.whl}"
NODE_PYTHON="${GPU_WHEELS_PYTHON:-3.11}"
PLATFORM="${GPU_WHEELS_PLATFORM:-manylinux2014_x86_64}"
# What gpu_check.sh imports beyond torch and Lightning, and what those need at run time.
NEEDED=(hydra-core omegaconf antlr4-python3-runtime faiss-cpu huggingface_hub httpx2 httpcore2
        hf-xet truststore idna regex transformers tokenizers safetensors)
mkdir -p "$OUT"
FROZEN="$("$PYTHON" -m pip freeze)"
PINS=()
for name in "${NEEDED[@]}"; do
  pin="$(grep -i "^${name}==" <<<"$FROZEN" || true)"
  if [ -z "$pin" ]; then
    echo "gpu_wheels.sh: $name is not installed in $PYTHON's environment; install the project's" \
         "environment first (make quickstart, or pip install '.[dev]')" >&2
    exit 1
  fi
  PINS+=("$pin")
done
echo "gpu_wheels.sh: ${#PINS[@]} packages for Python $NODE_PYTHON on $PLATFORM into $OUT"
for pin in "${PINS[@]}"; do
  if [[ "$pin" == antlr4-python3-runtime==* ]]; then  # a source archive only: build its wheel
    "$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$OUT" "$pin"
  else
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$OUT" \
      --python-version "$NODE_PYTHON" --platform "$PLATFORM" --platform manylinux_2_28_x86_64 \
      --platform linux_x86_64 --platform any "$pin"
  fi
done
# repgeom itself, built from a copy in $OUT: setuptools writes build/ and src/*.egg-info beside
# the sources it builds, and this script writes nowhere but $OUT.
STAGE="$(cd "$(mktemp -d "$OUT/.repgeom-build.XXXXXX")" && pwd)"
trap 'rm -rf "$STAGE"' EXIT
tar -c --exclude='__pycache__' --exclude='*.egg-info' pyproject.toml setup.py README.md src conf \
  | tar -x -C "$STAGE"
"$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$OUT" "$STAGE"
rm -rf "$STAGE"
ls -1 "$OUT"
echo "gpu_wheels.sh: copy the repository with $OUT/ to the node, then: bash benchmarks/gpu_check.sh"
