#!/usr/bin/env bash
# Issue #41, item 4: the diffusion prior as an option of the surrogate attacks (image_prior=diffusion, the
# projection DGGI uses), on the same victims as docs/experiments/table1-fair (cpu preset: k=8, B=4, 100
# iterations, m=7; partitions 0..2, seed 0; labels recovered), so each row pairs with table1's row of
# the same method without the prior. A check run of ig without the prior must reproduce table1's ig rows.
#   nice -n 10 bash docs/experiments/prior-option/run.sh      (log: docs/experiments/prior-option/run.log)
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=docs/experiments/prior-option
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
FL=${FL_ATTACK:-.venv/bin/fl-attack}
for dataset in femnist cifar100; do
  for epochs in 50 125; do
    common=(--dataset "$dataset" --preset cpu --local-epochs "$epochs" --clients 3 --device cpu --no-progress)
    start=$SECONDS
    "$FL" attack "${common[@]}" --methods ig --out "$OUT/$dataset-E$epochs-check" >> "$OUT/run.log" 2>&1
    "$FL" attack "${common[@]}" --methods pisme,sme --option image_prior=diffusion \
      --out "$OUT/$dataset-E$epochs-prior" >> "$OUT/run.log" 2>&1
    echo "$(date -u +%FT%TZ) $dataset E=$epochs done in $((SECONDS - start)) s" >> "$OUT/run.log"
  done
done
