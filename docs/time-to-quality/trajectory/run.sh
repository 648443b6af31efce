#!/usr/bin/env bash
# The trajectory-length grid (docs/time-to-quality.md, "At every trajectory length"): victims trained by
# `fl-attack attack` (real LEAF writers, true labels), each contender attacking the same victims. Resumable:
# a contender whose results.csv exists is not run again. One torch thread per attack (OMP_NUM_THREADS=1).
#   bash docs/time-to-quality/trajectory/run.sh SET        SET: dimitrov-T100 | table1-T250 | paper-T10 | cifar-T100 | cifar-T10
#   ONLY=name1,name2 bash docs/time-to-quality/trajectory/run.sh SET
set -euo pipefail
cd "$(dirname "$0")/../../.."
SET=${1:?usage: run.sh SET}
PY=${PYTHON:-.venv/bin/python}
OUT=docs/time-to-quality/trajectory/$SET
mkdir -p "$OUT"
export OMP_NUM_THREADS=1
case "$SET" in
  # Dimitrov et al.'s protocol: k=50 in 10 batches of 5, E=10 (T=100), lr 0.004, true labels, 4 writers
  dimitrov-T100) VICTIMS="--dataset femnist --samples 50 --batch-size 5 --local-epochs 10 --lr 0.004 --clients 4" ;;
  # Table 1's T=250 (the paper's protocol: k=50, B=10, E=50), 3 writers
  table1-T250) VICTIMS="--dataset femnist --samples 50 --batch-size 10 --local-epochs 50 --lr 0.004 --clients 3" ;;
  # Table 1's T=100 (k=50, B=10, E=20), 3 writers
  table1-T100) VICTIMS="--dataset femnist --samples 50 --batch-size 10 --local-epochs 20 --lr 0.004 --clients 3" ;;
  # short local training: k=16, B=8, E=5 (T=10), as the paper-protocol federation's clients, 4 writers
  paper-T10) VICTIMS="--dataset femnist --samples 16 --batch-size 8 --local-epochs 5 --lr 0.004 --clients 4" ;;
  cifar-T100) VICTIMS="--dataset cifar100 --samples 50 --batch-size 10 --local-epochs 20 --lr 0.004 --clients 2" ;;
  cifar-T10) VICTIMS="--dataset cifar100 --samples 16 --batch-size 8 --local-epochs 5 --lr 0.004 --clients 3" ;;
  *) echo "unknown set $SET" >&2; exit 2 ;;
esac
# name|flags: each contender's attack flags (the victims and the seed are the set's)
SPECS=(
  "m1-plateau-400|--methods pisme --nodes 1 --iterations 400 --option lr_schedule=plateau"
  "m7-steps-400|--methods pisme --nodes 7 --iterations 400"
  "m1-steps-400|--methods pisme --nodes 1 --iterations 400"
  "m3-steps-400|--methods pisme --nodes 3 --iterations 400"
  "m1-steps-2000|--methods pisme --nodes 1 --iterations 2000"
  "m3-steps-1000|--methods pisme --nodes 3 --iterations 1000"
  "m5-steps-400|--methods pisme --nodes 5 --iterations 400"
  "audit|--methods pisme --preset audit"
)
for spec in "${SPECS[@]}"; do
  name=${spec%%|*}; flags=${spec#*|}
  for seed in ${SEEDS:-0}; do
    dir=$OUT/$name; [ "$seed" = 0 ] || dir=$OUT/$name-seed$seed
    if [ -n "${ONLY:-}" ] && [[ ",$ONLY," != *",$name,"* ]]; then continue; fi
    [ -f "$dir/run.log" ] && continue  # written last: a contender killed part-way runs again
    echo "== $SET $name seed $seed: $flags"
    start=$(date +%s)
    $PY -m fl_attack.cli attack $VICTIMS --model paper --labels oracle --seed "$seed" $flags --out "$dir" --no-progress \
      > "$dir.log" 2>&1 || { echo "failed: see $dir.log"; continue; }
    echo "$(( $(date +%s) - start )) s wall" >> "$dir.log"
    mv "$dir.log" "$dir/run.log"
  done
done
