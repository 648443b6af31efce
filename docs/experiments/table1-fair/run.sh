#!/usr/bin/env bash
# Table 1 with its six rows (IG, GI-NAS, DGGI, SME, NL-SME, PI-SME; issue #41) and Dimitrov et al.'s FedAvg attack
# beside them (dimitrov; issue #50: rerunning adds only its rows) at a fair scale for a 2-core CPU:
# the cpu scale's victims (k=8, B=4, E=50 -> T=100 and E=125 -> T=250) and attacks (100 iterations, m=7),
# CLIENTS (default 3) clients per cell on both datasets, 1 seed, labels recovered from the update, 1 torch thread.
# Resumable: rerunning it skips the rows table1.csv already holds (whole clients first, client-major).
#   nice -n 10 bash docs/experiments/table1-fair/run.sh &      (CLIENTS=5 ... to add clients 3 and 4)
# Log: docs/experiments/table1-fair/run.log (start and end of every invocation, with its wall time).
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PYTHON:-.venv/bin/python}
OUT=docs/experiments/table1-fair
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
start=$SECONDS
CLIENTS=${CLIENTS:-3}
echo "$(date -u +%FT%TZ) start: table1 --scale cpu --clients $CLIENTS" >> "$OUT/run.log"
PYTHONPATH=. "$PY" -m analysis.experiments table1 --scale cpu --clients "$CLIENTS" --seeds 1 --device cpu --threads 1 \
  --out "$OUT" >> "$OUT/run.log" 2>&1
echo "$(date -u +%FT%TZ) done in $((SECONDS - start)) s: table1 --scale cpu --clients $CLIENTS" >> "$OUT/run.log"
