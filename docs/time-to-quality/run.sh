#!/usr/bin/env bash
# The short-budget lever table (docs/time-to-quality.md): replays of one run's recorded updates, one per lever
# setting, then the table from their records. Resumable: a replay with a summary.json is not run again.
#   bash docs/time-to-quality/run.sh RUN_DIR        (RUN_DIR: a `make demo` run folder, which records its updates)
#   ROUNDS=1,2 OUT=docs/time-to-quality/paper bash docs/time-to-quality/run.sh RUN_DIR   (another run, its rounds)
#   SWEEP=demo bash docs/time-to-quality/run.sh RUN_DIR   (the second measurement too; see SPECS below)
#   SWEEP=third-demo|third-heldout|third-paper ... (the third: seeds, and m=1 with 400 iterations)
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${1:?usage: run.sh RUN_DIR}
PY=${PYTHON:-.venv/bin/python}
ROUNDS=${ROUNDS:-1,2,3}
OUT=${OUT:-docs/time-to-quality}
mkdir -p "$OUT"
F="$PY -m fl_attack.cli replay $RUN --methods pisme --rounds $ROUNDS --memory none --threads 1"
NAMES=()
# name|iterations|m (empty: the run's)|attack-options. Without SWEEP: the first measurement (ttq-*), on a
# run recorded with the paper's steps. SWEEP=demo or paper adds the second on that run (the rate, the shape
# of its decay, fewer nodes); SWEEP=heldout is the second alone, on a run recorded with the
# constant schedule, so today's attack there is asked for by its rates.
TODAY="lr_decay=true,lr_images=1.0"
SPECS=("ttq-steps-200|200||" "ttq-constant-200|200||lr_decay=false" "ttq-public-200|200||start=public"
  "ttq-public-constant-200|200||start=public,lr_decay=false" "ttq-steps-1000|1000||")
case "${SWEEP:-}" in
  demo) SPECS+=("sw-A-m3c03|200||lr_decay=false,lr_images=0.3" "sw-E-m3c01|200||lr_decay=false,lr_images=0.1"
    "sw-F-m3cos|200||lr_schedule=cosine" "sw-G-m3cos03|200||lr_schedule=cosine,lr_images=0.3"
    "sw-S-m3steps03|200||lr_images=0.3" "sw-PL-m3pl10|200||lr_schedule=plateau"
    "sw-PL03-m3pl10|200||lr_schedule=plateau,lr_images=0.3"
    "sw-B-m1c-400|400|1|lr_decay=false" "sw-C-m1c-600|600|1|lr_decay=false") ;;
  paper) SPECS+=("sw-P-m7c03|200||lr_decay=false,lr_images=0.3" "sw-P-m7cos|200||lr_schedule=cosine"
    "sw-P-m7pl10|200||lr_schedule=plateau" "sw-P-m7pl03|200||lr_schedule=plateau,lr_images=0.3") ;;
  heldout) SPECS=("sw-H-today-200|200||$TODAY" "sw-H-A-m3c03|200||lr_decay=false,lr_images=0.3"
    "sw-H-today-1000|1000||$TODAY") ;;
  # The third measurement: seeds, and one node with twice the iterations (the default since). Its lever rows
  # lr_schedule=late and coarse_fraction ran at commit 65053bc and are not here (the levers were removed).
  third-demo) SPECS=("sw-A-m3c03|200||lr_decay=false,lr_images=0.3"
    "x-D-c03-seed1|200||lr_decay=false,lr_images=0.3,seed=1" "x-D-c03-seed2|200||lr_decay=false,lr_images=0.3,seed=2"
    "x-D-m1pl10-400|400|1|lr_schedule=plateau,lr_images=1.0"
    "x-D-m1pl10-400-seed1|400|1|lr_schedule=plateau,lr_images=1.0,seed=1"
    "x-D-m1pl10-400-seed2|400|1|lr_schedule=plateau,lr_images=1.0,seed=2"
    "ttq-steps-200|200||" "ttq-steps-1000|1000||" "x-D-today1000-seed1|1000||seed=1"
    "x-D-today1000-seed2|1000||seed=2") ;;
  third-heldout) SPECS=("sw-H-A-m3c03|200||lr_decay=false,lr_images=0.3"
    "x-H-c03-seed1|200||lr_decay=false,lr_images=0.3,seed=1" "x-H-c03-seed2|200||lr_decay=false,lr_images=0.3,seed=2"
    "x-H-m1pl10-400|400|1|lr_schedule=plateau,lr_images=1.0"
    "x-H-m1pl10-400-seed1|400|1|lr_schedule=plateau,lr_images=1.0,seed=1"
    "x-H-m1pl10-400-seed2|400|1|lr_schedule=plateau,lr_images=1.0,seed=2"
    "sw-H-today-200|200||$TODAY" "x-H-today200-seed1|200||$TODAY,seed=1"
    "sw-H-today-1000|1000||$TODAY" "x-H-today1000-seed1|1000||$TODAY,seed=1"
    "x-H-today1000-seed2|1000||$TODAY,seed=2"
    "x-H-m3c03-300|300||lr_decay=false,lr_images=0.3" "x-H-m1c03-400|400|1|lr_decay=false,lr_images=0.3"
    "x-H-m1c10-400|400|1|lr_decay=false,lr_images=1.0") ;;
  third-paper) SPECS=("sw-P-m7c03|200||lr_decay=false,lr_images=0.3"
    "x-P-c03-seed1|200||lr_decay=false,lr_images=0.3,seed=1" "x-P-c03-seed2|200||lr_decay=false,lr_images=0.3,seed=2"
    "x-P-m1pl10-400|400|1|lr_schedule=plateau,lr_images=1.0"
    "x-P-m1pl10-400-seed1|400|1|lr_schedule=plateau,lr_images=1.0,seed=1"
    "x-P-m1pl10-400-seed2|400|1|lr_schedule=plateau,lr_images=1.0,seed=2"
    "ttq-steps-200|200||" "ttq-steps-1000|1000||" "x-P-today1000-seed1|1000||seed=1" "x-P-m1c03-400|400|1|lr_decay=false,lr_images=0.3"
    "x-P-m1c10-400|400|1|lr_decay=false,lr_images=1.0") ;;
esac
for spec in "${SPECS[@]}"; do
  IFS='|' read -r name K M opts <<< "$spec"
  NAMES+=("$name")
  [ -f "$RUN/replays/$name/summary.json" ] && continue
  rm -rf "$RUN/replays/$name"
  start=$(date +%s)
  args=(--iterations "$K" --name "$name")
  [ -n "$M" ] && args+=(--nodes "$M")
  [ -n "$opts" ] && args+=(--options "$opts")
  $F "${args[@]}"
  echo "$name: $(( $(date +%s) - start )) s wall" | tee -a "$OUT/run.log"
done
PYTHONPATH=. "$PY" -m analysis.experiments.time_to_quality "$RUN" "${NAMES[@]}" --out "$OUT"
