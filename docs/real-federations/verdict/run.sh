#!/usr/bin/env bash
# Four of the whole-federation runs of docs/real-federations.md run again with the verdict
# (docs/verdict.md): the paper's regime, Flower's quickstart (momentum, IID), Adam, Dirichlet 0.1.
set -euo pipefail
cd "$(dirname "$0")/../../.."
time nice -n 5 .venv/bin/python -m analysis.federations_study --out results/federations-study-verdict \
    --only paper,quickstart-iid,adam-iid,dirichlet-0.1 --skip-replays
for run in paper quickstart-iid adam-iid dirichlet-0.1; do
    cp "results/federations-study-verdict/runs/$run/attacks.csv" "docs/real-federations/verdict/$run-attacks.csv"
done
