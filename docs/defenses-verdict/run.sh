#!/usr/bin/env bash
# The defense study (docs/defenses.md) rerun with the verdict (docs/verdict.md): the same grid, scale and seed.
set -euo pipefail
cd "$(dirname "$0")/../.."
time nice -n 5 .venv/bin/python -m analysis.defenses --dataset femnist --rounds 2 --out results/defense-study-verdict --resume
cp results/defense-study-verdict/defenses.csv results/defense-study-verdict/defenses.md docs/defenses-verdict/
