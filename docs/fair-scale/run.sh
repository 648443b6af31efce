#!/usr/bin/env bash
# The fair-scale study behind docs/results.md (issue #16): the paper's k=50 protocol (B=10, E=20 -> T=100,
# E=50 -> T=250), 300 attack iterations, m=7, 3 clients per cell, on the bundled real data, on the CPU.
# Every step resumes: rerunning this script skips the rows docs/fair-scale/*.csv already hold, so it can
# be stopped at any time. The cheap cells come first and the clients grow 1 -> 3, so a partial run has
# whole clients everywhere. Log: docs/fair-scale/run.log (wall time of every step).
#   nice -n 19 bash docs/fair-scale/run.sh &   (WORKERS=2 local processes with THREADS=1 torch thread each)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
OUT=docs/fair-scale
COMMON=(--scale paper --seeds 1 --iterations 300 --device cpu --workers "${WORKERS:-2}" --threads "${THREADS:-1}" --out "$OUT")
step() {
  local start=$SECONDS
  echo "$(date -u +%FT%TZ) start: $*" >> "$OUT/run.log"
  PYTHONPATH=. "$PY" -m analysis.experiments "$@" "${COMMON[@]}" >> "$OUT/run.log" 2>&1
  echo "$(date -u +%FT%TZ) done in $((SECONDS - start)) s: $*" >> "$OUT/run.log"
}
FEMNIST_NODES=(node-sweep --grid dataset=femnist --grid paper_T=250 --grid nodes=1,2,3,7)
step "${FEMNIST_NODES[@]}" --clients 3
step matched-compute --grid dataset=femnist --grid paper_T=100,250 --clients 3
for clients in 1 2 3; do
  step class-deficiency --grid classes=10,30,100 --grid labels=recovered --clients $clients
  step matched-compute --grid dataset=femnist,cifar100 --grid paper_T=100,250 --clients $clients
done
step class-deficiency --grid classes=10,30,100 --grid labels=recovered,oracle --clients 3
step node-sweep --grid dataset=femnist,cifar100 --grid paper_T=250 --grid nodes=1,2,3,7 --clients 3
