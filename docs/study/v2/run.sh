#!/usr/bin/env bash
# The study's runs (docs/study/v2/README.md): every arm in turn, warm start by warm start, so that
# blocks complete early. Rerunning it skips finished runs (sweep.py resumes).
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PYTHON:-python}
COMMON=(--config=configs/default.py --config.rewards.conditional_length=False
        --config.data.synthetic.num_test=1024 --config.sft.cache_dir=runs/study_v2/warm_starts
        --seeds=0,1,2,3,4)
for k in ${WARM_STARTS:-0 1 2 3}; do
  "$PY" sweep.py "${COMMON[@]}" --sweep_dir=runs/study_v2/two_rewards/ws$k --config.sft.seed=$k \
    --algorithms=gdpo,gd2po_hard --config.rewards.names=correctness,length
  "$PY" sweep.py "${COMMON[@]}" --sweep_dir=runs/study_v2/three_rewards/ws$k --config.sft.seed=$k \
    --algorithms=gdpo,gd2po_snr --snr_taus=0.5
done
