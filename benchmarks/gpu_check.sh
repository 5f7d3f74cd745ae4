#!/usr/bin/env bash
# One prepared GPU check, at most 8 minutes on one H100 (benchmarks/README.md, "GPU check"):
#   1. gpt_small training: today's path, the new default (conf/recipe/) and a plain PyTorch
#      loop side by side (tokens/s, ms/step, MFU, peak memory), and the micro-batch knee;
#   2. the loss band: two 300-step runs of today's path against the new default;
#   3. the in-process probe's share of the wall time at gpt_small's default schedule, and with
#      probe.offload (the worker on the same GPU), at the new default's speed;
#   4. FAISS exact kNN on 100k x 768, GPU against CPU;
#   5. one trajectory revision of a tiny Pythia from the tests' hub stand-in, its seconds.
# One line per check (three for the first); paste the output into benchmarks/README.md.
# On a node without Hydra, FAISS or our huggingface_hub and without network: build the wheels
# first where PyPI is reachable (bash benchmarks/gpu_wheels.sh, into .whl/), bring them along,
# and this script installs them into a folder of its own (GPU_CHECK_WHEELS names another).
#
#   bash benchmarks/gpu_check.sh               # on a GPU node, in the repository's environment
#   bash benchmarks/gpu_check.sh --cpu-smoke   # the same code at toy sizes on the CPU (a test)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# This checkout's sources first, for every process the check starts (train.py's worker too).
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export WANDB_MODE=offline WANDB_SILENT=true
PYTHON="${PYTHON:-python}"
LIMIT_S="${GPU_CHECK_LIMIT_S:-480}"
WHEELS="${GPU_CHECK_WHEELS:-$PWD/.whl}"
INSTALL_LIMIT_S="${GPU_CHECK_INSTALL_LIMIT_S:-120}"  # each of the import check and the install
if ! timeout -k 10 "$INSTALL_LIMIT_S" "$PYTHON" -c \
    "import hydra, omegaconf, faiss, huggingface_hub, transformers" 2>/dev/null; then
  if [ ! -d "$WHEELS" ]; then
    echo "gpu_check.sh: Hydra, FAISS, huggingface_hub or transformers is missing and there is no" \
         "wheel bundle at $WHEELS; build it where PyPI is reachable: bash benchmarks/gpu_wheels.sh" >&2
    exit 1
  fi
  SITE="${TMPDIR:-/tmp}/repgeom-gpu-check-site"
  echo "gpu_check.sh: installing the wheels of $WHEELS into $SITE (no network)" >&2
  if ! timeout -k 10 "$INSTALL_LIMIT_S" "$PYTHON" -m pip install --quiet --no-index \
      --find-links "$WHEELS" --no-deps --upgrade --target "$SITE" "$WHEELS"/*.whl; then
    echo "gpu_check.sh: installing the wheel bundle failed or took over ${INSTALL_LIMIT_S} s" >&2
    exit 1
  fi
  export PYTHONPATH="$PYTHONPATH:$SITE"
fi
# Lightning catches SIGTERM during a fit and only notes it (its loops stop at the next batch),
# so a hung step would outlive a plain timeout: KILL follows GPU_CHECK_KILL_AFTER_S later.
exec timeout --kill-after="${GPU_CHECK_KILL_AFTER_S:-30}" "$LIMIT_S" "$PYTHON" benchmarks/gpu_check.py "$@"
