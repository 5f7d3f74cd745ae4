#!/usr/bin/env bash
# Build the bundle of wheels that benchmarks/gpu_check.sh needs on a GPU node with no network
# (issues 34 and 41): one command, on a machine with PyPI access, before the node is lent.
#
#   bash benchmarks/gpu_wheels.sh                 # into .whl/ (git-ignored)
#   bash benchmarks/gpu_wheels.sh /some/folder
#
# benchmarks/gpu_image.txt records the node's image (its Python, 3.12, its platform and its
# packages); benchmarks/gpu_bundle.py carries only what the image lacks or has at a version this
# project refuses, as wheels for that Python and platform, at the versions of $PYTHON's
# environment (the node runs what the tests ran), then checks the bundle: at most 40 MiB, and a
# dry-run `pip install --no-index --target --python-version 3.12` of the check's needs from the
# image and the bundle. repgeom itself is not in it: the check runs this checkout's src/.
# Nothing is installed on this machine; a wheel already in the folder is not fetched again.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
OUT="${1:-.whl}"
"$PYTHON" benchmarks/gpu_bundle.py build "$OUT"
"$PYTHON" benchmarks/gpu_bundle.py verify "$OUT"
echo "gpu_wheels.sh: copy the repository with $OUT/ to the node, then: bash benchmarks/gpu_check.sh"
