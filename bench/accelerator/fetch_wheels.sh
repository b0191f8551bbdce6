#!/usr/bin/env bash
# Fetches the wheels the lent H200 machine lacks (bench/accelerator/wheels.txt: our runtime requirements
# minus its image's packages, and what they need) for CPython 3.12 on manylinux x86-64, into DIR; prints
# their total size; checks them against the image (python -m bench.accelerator.check_wheels).
#
#   bench/accelerator/fetch_wheels.sh DIR            e.g. DIR=.whl in the repository root (ignored there
#                                                    through .git/info/exclude: docs/accelerator/README.md)
#   RESOLVE=1 bench/accelerator/fetch_wheels.sh DIR  also resolves the set offline with pip against
#                                                    stand-ins of the image's packages (fetched into a
#                                                    temporary folder, never carried)
#
# Environment: PYTHON (the interpreter whose pip downloads; python3), WHEEL_PYTHON_VERSION (3.12; 3.11
# fetches the set for this machine's venv, for the CPU dry run), MAX_MIB (16: the most the wheels may
# weigh; the whole carried tree's limit is 64 MiB), RESOLVE_PYTHON (a Python 3.12 whose pip resolves, for
# RESOLVE=1; PYTHON). Needs a package index (it runs here, never there).
set -euo pipefail

dir=${1:?usage: bench/accelerator/fetch_wheels.sh DIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
python=${PYTHON:-python3}
pyver=${WHEEL_PYTHON_VERSION:-3.12}
max_mib=${MAX_MIB:-16}
# The device README's download line (/work/.library/device/README.md, Notes): CPython, these platforms.
platforms=(--python-version "$pyver" --implementation cp --platform manylinux_2_28_x86_64
           --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux1_x86_64)

mapfile -t pins < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$here/wheels.txt")
mkdir -p "$dir" && dir=$(cd "$dir" && pwd)
"$python" -m pip download --no-deps --only-binary=:all: "${platforms[@]}" -d "$dir" "${pins[@]}"

bytes=$(cat "$dir"/*.whl | wc -c)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.2f", b / 1048576 }')
echo "fetch_wheels: $(ls "$dir"/*.whl | wc -l) wheels, $mib MiB in $dir (limit here $max_mib MiB; the carried tree's 64 MiB)"
if awk -v m="$mib" -v l="$max_mib" 'BEGIN { exit !(m > l) }'; then
  echo "fetch_wheels: over $max_mib MiB" >&2
  exit 1
fi

args=()
if [[ "${RESOLVE:-0}" == 1 ]]; then
  # Offline resolution: the carried wheels plus stand-ins of the image's packages (its versions where
  # KINDS.md gives them, pinned by a constraints file), with pip's index switched off. check_wheels then
  # requires that everything pip would install is carried, or in the image in the image's version.
  standin=$(mktemp -d /tmp/fetch_wheels_standin.XXXXXX)
  sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/==/!d' "$here/image_packages.txt" > "$standin/constraints.txt"
  printf '%s\n' "${pins[@]}" >> "$standin/constraints.txt"
  "$python" -m pip download -q --only-binary=:all: "${platforms[@]}" -d "$standin/wheels" \
    -c "$standin/constraints.txt" "${pins[@]}"
  # pip evaluates Requires-Python and markers with the interpreter that runs it: a Python 3.12 one.
  "${RESOLVE_PYTHON:-$python}" -m pip install --dry-run --ignore-installed --no-index --find-links "$dir" \
    --find-links "$standin/wheels" --only-binary=:all: "${platforms[@]}" --target "$standin/target" \
    --report "$standin/report.json" "${pins[@]}"
  echo "fetch_wheels: stand-ins and pip's report in $standin"
  args=(--pip-report "$standin/report.json")
fi
# One version of each, the listed ones only (two stop the install there), and their needs met.
[[ "$pyver" == 3.12 ]] || args+=(--python "$pyver.0")
cd "$repo" && "$python" -m bench.accelerator.check_wheels "$dir" "${args[@]}"
