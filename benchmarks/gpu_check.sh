#!/usr/bin/env bash
# One prepared GPU check, at most 8 minutes on one H100 (benchmarks/README.md, "GPU check"):
#   1. gpt_small bf16 training tokens/s and MFU;
#   2. the in-process probe's share of the wall time at gpt_small's default schedule, and with
#      probe.offload (the worker on the same GPU);
#   3. FAISS exact kNN on 100k x 768, GPU against CPU;
#   4. one trajectory revision of a tiny Pythia from the tests' hub stand-in, its seconds.
# One line per check; paste the output into benchmarks/README.md's GPU section.
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
exec timeout "$LIMIT_S" "$PYTHON" benchmarks/gpu_check.py "$@"
