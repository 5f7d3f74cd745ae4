#!/usr/bin/env bash
# The measurements of issue 41 that need a GPU, ready to run on a lent node (benchmarks/README.md,
# "GPU check", "For the GPU session"). Two parts, each one command, each well under the 10
# minutes one device call may take; every line goes to the results file as it is measured.
#
#   bash benchmarks/gpu_session.sh check       # gpu_check.sh: every stage, <= 420 s
#   bash benchmarks/gpu_session.sh whole-run   # two 2,000-step gpt_small runs through train.py
#   bash benchmarks/gpu_session.sh whole-run trainer=cpu model=gpt_tiny trainer.max_steps=20 \
#       probe.worker.device=cpu     # more overrides after the defaults: a CPU rehearsal
#
# GPU_CHECK_RESULTS names the results file (outputs/gpu_check.txt by default; on a lent machine
# a file under the folder that comes back). `whole-run` trains gpt_small on the bundled sample
# with the default probe schedule and the default callbacks (validation every 1,000 steps, the
# checkpoints), once with the probes in-process and once offloaded to a worker on the same GPU,
# and writes one line each: the wall seconds and the shares of probes, checkpoint writes,
# validation and the rest (benchmarks/wall_shares.py). Run `check` first: it installs the wheel
# bundle where the node lacks a package, and `whole-run` reuses that folder.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
RESULTS="${GPU_CHECK_RESULTS:-$PWD/outputs/gpu_check.txt}"
SITE="${TMPDIR:-/tmp}/repgeom-gpu-check-site"  # where gpu_check.sh installs the bundle
export PYTHONPATH="$PWD/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
[ -d "$SITE" ] && export PYTHONPATH="$PYTHONPATH:$SITE"
export WANDB_MODE=offline WANDB_SILENT=true
mkdir -p "$(dirname "$RESULTS")"
case "${1:-}" in
  check)
    GPU_CHECK_RESULTS="$RESULTS" exec bash benchmarks/gpu_check.sh ;;
  whole-run)
    RUNS="${TMPDIR:-/tmp}/repgeom-whole-run"
    for mode in in-process offloaded; do
      extra=()
      # offloaded: training does not wait for the worker at its end (what training pays is
      # measured); the worker's own lag after training is written on a line of its own
      [ "$mode" = offloaded ] && extra=(probe.offload=worker probe.worker.device=cuda
                                       probe.worker.wait=false)
      rm -rf "${RUNS:?}/$mode"  # this script's own run folder (a rerun starts it anew)
      timeout --kill-after=30 280 "$PYTHON" train.py model=gpt_small data=sample \
        trainer.max_steps=2000 logger=csv "output_dir=$RUNS/$mode" "~callbacks.progress_bar" \
        "+callbacks.wall_shares._target_=wall_shares.WallShares" \
        "+callbacks.wall_shares.results=$RESULTS" \
        "+callbacks.wall_shares.label='default probe schedule, probes $mode'" \
        "${extra[@]+"${extra[@]}"}" "${@:2}" >"$RUNS-$mode.log" 2>&1 \
        || { echo "whole run ($mode) failed; its last lines:" | tee -a "$RESULTS"
             tail -n 40 "$RUNS-$mode.log" | sed 's/^/  | /' | tee -a "$RESULTS"; }
    done
    log="$RUNS/offloaded/probes/worker.log"
    started=$SECONDS
    until grep -qs "is done" "$log" || [ $((SECONDS - started)) -ge 120 ]; do sleep 1; done
    if grep -qs "is done" "$log"; then
      echo "whole run (probes offloaded): the worker done $((SECONDS - started)) s after training" \
        | tee -a "$RESULTS"
    else
      echo "whole run (probes offloaded): the worker not done 120 s after training" \
        | tee -a "$RESULTS"
    fi ;;
  *)
    echo "usage: bash benchmarks/gpu_session.sh check|whole-run" >&2
    exit 2 ;;
esac
