#!/usr/bin/env bash
# The analyses of docs/results/analyses on our two quickstart checkpoints (decoder and encoder).
#   python train.py experiment=quickstart hydra.run.dir=<causal run>
#   python train.py experiment=quickstart masking=bidirectional hydra.run.dir=<bidirectional run>
#   scripts/run_analyses_checkpoints.sh <causal run>/checkpoints/last.ckpt \
#       <bidirectional run>/checkpoints/last.ckpt
# Writes docs/results/analyses/quickstart-{causal,bidirectional}/; the MiniLM counterpart is
# scripts/run_analyses_minilm.sh, and docs/results_analyses.md compares the three.
set -euo pipefail
if [ $# -ne 2 ]; then
    echo "usage: $0 <causal last.ckpt> <bidirectional last.ckpt>" >&2
    exit 2
fi
CAUSAL=$(realpath "$1")
BIDIRECTIONAL=$(realpath "$2")
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
DATA=data/examples/subject_attribute.csv
for pair in "causal:$CAUSAL" "bidirectional:$BIDIRECTIONAL"; do
    masking=${pair%%:*}
    ckpt=${pair#*:}
    name=quickstart-$masking
    OUT=docs/results/analyses/$name
    $PY -m repgeom.cli.distinctiveness ckpt="$ckpt" name="$name" csv=$DATA \
        out="$OUT/distinctiveness"
    $PY -m repgeom.cli.distributions ckpt="$ckpt" name="$name" csv=$DATA \
        group_by=subject,attribute out="$OUT/distributions"
    $PY -m repgeom.cli.similarity ckpt="$ckpt" name="$name" \
        "text=Cooking mushrooms in a pot is hard." pairs=data/examples/text_pairs.csv \
        out="$OUT/similarity"
    rm -f "$OUT/distributions/fits.csv"   # every family's fit: large; summary.csv keeps the best
done
