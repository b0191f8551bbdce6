#!/usr/bin/env bash
# The study's secondary arm "GD2PO with dynamic sampling" (rl.dynamic_sampling=kept, at most 4 rounds a
# step), on warm start 0 (override with WARM_STARTS): GD2PO-Hard with two rewards and GD2PO-SNR tau 0.5
# with three, as in the primary arms. With the primary arms' runs of the same block without refill, this
# is also issue 60's measurement on the tool-calling task (docs/dynamic_sampling.md).
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PYTHON:-python}
COMMON=(--config=configs/default.py --config.rewards.conditional_length=False
        --config.data.synthetic.num_test=1024 --config.sft.cache_dir=runs/study_v2/warm_starts
        --seeds=0,1,2,3,4 --config.rl.dynamic_sampling=kept)
for k in ${WARM_STARTS:-0}; do
  "$PY" sweep.py "${COMMON[@]}" --sweep_dir=runs/study_v2/two_rewards_refill/ws$k --config.sft.seed=$k \
    --algorithms=gd2po_hard --config.rewards.names=correctness,length
  "$PY" sweep.py "${COMMON[@]}" --sweep_dir=runs/study_v2/three_rewards_refill/ws$k --config.sft.seed=$k \
    --algorithms=gd2po_snr --snr_taus=0.5
done
