#!/usr/bin/env bash
# The accelerator check on a lent machine (docs/accelerator/README.md), from the repository root:
#
#   bash bench/accelerator/device_check.sh --parts=correctness,compilation,end_to_end
#   bash bench/accelerator/device_check.sh --parts=speed   on the device: each ends inside 8 minutes
#                                                          (all four parts in one call do not fit)
#   bash bench/accelerator/device_check.sh --cpu-smoke     its CPU dry run (same steps, miniature parts)
#
# 1. installs the carried wheels (WHEELS, default .whl: bench/accelerator/fetch_wheels.sh) into SITE
#    (default /tmp/gd2po_site) and puts SITE first on PYTHONPATH; the image's own packages stay as they are;
# 2. checks them against what is installed (python -m bench.accelerator.check_wheels --installed) and
#    records that, without stopping on a mismatch;
# 3. runs python -m bench.accelerator_check with --time_budget_s=BUDGET_S (default 390) under a hard
#    stop of LIMIT_S (default 440) seconds; the JSON report goes to $OUT/accelerator_report.json,
#    rewritten after each part (a killed run keeps the finished parts, "complete": false), and the table
#    is printed last. A part that raises is recorded with its traceback and the other parts still run.
#
# Other arguments go to bench.accelerator_check (e.g. --parts=end_to_end). Environment: OUT (where
# the files go; a new temporary folder when unset), PYTHON (python3), WHEELS, SITE, BUDGET_S, LIMIT_S.
# Exit status: accelerator_check's (0: every check passed; 1: a check failed or a part raised; 124 or
# 137: stopped at LIMIT_S), or 3 when the wheels do not install.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 3
start=$SECONDS
python=${PYTHON:-python3}
wheels=${WHEELS:-.whl}
site=${SITE:-/tmp/gd2po_site}
out=${OUT:-$(mktemp -d /tmp/accelerator_check.XXXXXX)}
budget=${BUDGET_S:-390}
limit=${LIMIT_S:-440}
mkdir -p "$out"
# Nothing outside the machine can be reached: the Hugging Face libraries must not try.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false

echo "[device_check] $("$python" --version 2>&1) at $(command -v "$python"); wheels from $wheels; files to $out"
shopt -s nullglob
carried=("$wheels"/*.whl)
if ((${#carried[@]} == 0)); then
  echo "[device_check] no wheels in $wheels: run bench/accelerator/fetch_wheels.sh $wheels here first" >&2
  exit 3
fi
"$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
  "${carried[@]}" || exit 3
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"

"$python" -m bench.accelerator.check_wheels "$wheels" --installed > "$out/wheels_check.txt" 2>&1
echo "[device_check] wheel check: exit $? ($(tail -n 1 "$out/wheels_check.txt")); $out/wheels_check.txt"
grep -E '^(ERROR|unverified)' "$out/wheels_check.txt"
command -v nvidia-smi > /dev/null && nvidia-smi > "$out/nvidia_smi.txt" 2>&1

echo "[device_check] python -m bench.accelerator_check --time_budget_s=$budget (stopped at $limit s) $*"
timeout -k 10 "$limit" "$python" -m bench.accelerator_check --time_budget_s="$budget" \
  --out="$out/accelerator_report.json" "$@" > "$out/accelerator_stdout.txt" 2> "$out/accelerator_stderr.txt"
rc=$?
tail -n 30 "$out/accelerator_stderr.txt"
# The table: what follows the JSON on stdout.
sed -n '/^accelerator check (/,$p' "$out/accelerator_stdout.txt"
if ((rc == 124 || rc == 137)); then
  echo "[device_check] stopped at $limit s: $out/accelerator_report.json holds the parts that finished"
fi
echo "[device_check] exit $rc after $((SECONDS - start)) s; report $out/accelerator_report.json"
exit $rc
