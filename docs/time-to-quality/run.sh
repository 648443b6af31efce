#!/usr/bin/env bash
# The short-budget lever table (docs/time-to-quality.md): replays of one run's recorded updates, one per lever
# setting, then the table from their records. Resumable: a replay with a summary.json is not run again.
#   bash docs/time-to-quality/run.sh RUN_DIR        (RUN_DIR: a `make demo` run folder, which records its updates)
#   ROUNDS=1,2 OUT=docs/time-to-quality/paper bash docs/time-to-quality/run.sh RUN_DIR   (another run, its rounds)
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${1:?usage: run.sh RUN_DIR}
PY=${PYTHON:-.venv/bin/python}
ROUNDS=${ROUNDS:-1,2,3}
OUT=${OUT:-docs/time-to-quality}
mkdir -p "$OUT"
F="$PY -m fl_attack.cli replay $RUN --methods pisme --rounds $ROUNDS --memory none --threads 1"
NAMES=()
for spec in "ttq-steps-200|200|" "ttq-constant-200|200|lr_decay=false" "ttq-public-200|200|start=public" \
  "ttq-public-constant-200|200|start=public,lr_decay=false" "ttq-steps-1000|1000|"; do
  IFS='|' read -r name K opts <<< "$spec"
  NAMES+=("$name")
  [ -f "$RUN/replays/$name/summary.json" ] && continue
  rm -rf "$RUN/replays/$name"
  start=$(date +%s)
  if [ -n "$opts" ]; then $F --iterations "$K" --options "$opts" --name "$name"; else $F --iterations "$K" --name "$name"; fi
  echo "$name: $(( $(date +%s) - start )) s wall" | tee -a "$OUT/run.log"
done
PYTHONPATH=. "$PY" -m analysis.experiments.time_to_quality "$RUN" "${NAMES[@]}" --out "$OUT"
