#!/usr/bin/env bash
# Copy what the report reads from a shape_of_learning sweep into docs/results/runs, replacing
# what is there: per run <masking>-seed<k>, its probe table, the probe set it used, its Hydra
# config and the hparams file that holds the vocabulary size.
#   bash scripts/collect_runs.sh multirun/shape_of_learning/<stamp>
set -euo pipefail
sweep=${1:?usage: collect_runs.sh SWEEP_FOLDER}
cd "$(dirname "$0")/.."
dest=docs/results/runs/shape_of_learning
rm -rf "$dest"
for run in "$sweep"/*-seed*/; do
  name=$(basename "$run")
  for file in probes/probes.parquet probes/probe_set.json .hydra/config.yaml \
              csv/version_0/hparams.yaml; do
    [[ -f "$run/$file" ]] || { echo "$run has no $file: is the run finished?" >&2; exit 1; }
    mkdir -p "$dest/$name/$(dirname "$file")"
    cp "$run/$file" "$dest/$name/$file"
  done
done
echo "copied $(ls "$dest" | wc -l) runs into $dest"
