#!/usr/bin/env bash
# One prepared GPU check, at most 7 minutes (420 s) on one H100 or H200 (benchmarks/README.md,
# "GPU check"): stages, each in its own process with its own time budget, each writing its lines
# to the results file as it goes (GPU_CHECK_RESULTS, outputs/gpu_check.txt by default) and its
# last 40 stderr lines if it fails; the next stage runs anyway (benchmarks/gpu_check.py).
# On a node without Hydra or FAISS and without network: build the bundle first where PyPI is
# reachable (bash benchmarks/gpu_wheels.sh, into .whl/), bring it along, and this script installs
# it into a folder of its own (GPU_CHECK_WHEELS names another bundle).
#
#   bash benchmarks/gpu_check.sh               # on a GPU node (python3, or PYTHON=...)
#   bash benchmarks/gpu_check.sh --cpu-smoke   # the same stages at toy sizes on the CPU (a test)
#   bash benchmarks/gpu_check.sh --rehearse    # on a CPU machine with PyPI: build and check the
#                                              # bundle for the node, then the whole check in
#                                              # its CPU-smoke form (.ci/run runs this)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# This checkout's sources first, for every process the check starts (train.py's worker too).
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export WANDB_MODE=offline WANDB_SILENT=true
PYTHON="${PYTHON:-python3}"
WHEELS="${GPU_CHECK_WHEELS:-$PWD/.whl}"
INSTALL_LIMIT_S="${GPU_CHECK_INSTALL_LIMIT_S:-120}"  # each of the import check and the install
ARGS=()
REHEARSE=0
for arg in "$@"; do
  if [ "$arg" = --rehearse ]; then REHEARSE=1; else ARGS+=("$arg"); fi
done
if [ "$REHEARSE" = 1 ]; then
  # The node's bundle, built for its Python (benchmarks/gpu_image.txt) and checked: size, and a
  # dry-run --no-index install for that Python against the image's packages. A wheel already
  # in the folder is not fetched again.
  started=$SECONDS
  "$PYTHON" benchmarks/gpu_bundle.py build "$WHEELS"
  "$PYTHON" benchmarks/gpu_bundle.py verify "$WHEELS"
  echo "gpu_check.sh --rehearse: bundle built and checked in $((SECONDS - started)) s" >&2
  ARGS=(--cpu-smoke "${ARGS[@]+"${ARGS[@]}"}")
fi
if ! IMPORT_ERROR="$(timeout -k 10 "$INSTALL_LIMIT_S" "$PYTHON" -c \
    "import hydra, omegaconf, faiss, huggingface_hub, transformers" 2>&1)"; then
  echo "gpu_check.sh: $PYTHON lacks a package of the check: $(tail -n 1 <<<"$IMPORT_ERROR")" >&2
  if [ ! -d "$WHEELS" ]; then
    echo "gpu_check.sh: and there is no wheel bundle at $WHEELS; build it where PyPI is" \
         "reachable: bash benchmarks/gpu_wheels.sh" >&2
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
# The stages' budgets sum to 400 s (gpu_check.py); at toy sizes on a loaded CPU they are larger.
case " ${ARGS[*]-} " in
  *" --cpu-smoke "*) LIMIT_S="${GPU_CHECK_LIMIT_S:-1800}" ;;
  *) LIMIT_S="${GPU_CHECK_LIMIT_S:-420}" ;;
esac
# Each stage stops itself at its budget; this is the backstop for the whole check. Lightning
# catches SIGTERM during a fit and only notes it, so KILL follows GPU_CHECK_KILL_AFTER_S later.
exec timeout --kill-after="${GPU_CHECK_KILL_AFTER_S:-30}" "$LIMIT_S" "$PYTHON" \
  benchmarks/gpu_check.py "${ARGS[@]+"${ARGS[@]}"}"
