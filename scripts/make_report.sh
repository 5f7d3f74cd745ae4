#!/usr/bin/env bash
# Rebuild docs/results.md and its figures from the committed run tables (docs/results/runs,
# docs/results/common_bias). To report new runs, point the arguments at their folders.
# The analyses' sections are hand-written in docs/results_analyses.md (figures and CSVs under
# docs/results/analyses, from scripts/run_analyses_*.sh) and included before the notes.
# docs/results/runs/shape_of_learning holds one folder per run of the sweep, <masking>-seed<k>,
# with probes/probes.parquet, .hydra/config.yaml and csv/version_0/hparams.yaml (the vocabulary
# size is only in the last one) copied from multirun/shape_of_learning/<stamp>/<masking>-seed<k>.
# docs/results/runs/shuffled_control holds the shuffled-text control's probe tables (its README
# gives the probe.py commands); its section follows the analyses'.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m repgeom.cli.report \
    --shape-of-learning docs/results/runs/shape_of_learning \
    --distributions docs/results/runs/distributions_causal \
    --distributions-command "python probe.py ckpt=<causal run>/checkpoints/last.ckpt" \
    --common-bias docs/results/common_bias \
    --analyses docs/results_analyses.md \
    --notes docs/results_scale.md \
    --shuffled-control docs/results/runs/shuffled_control \
    --out docs
