#!/usr/bin/env bash
# The verdict's measurements (docs/verdict.md): distance and D on both datasets, and the verdict's cost
# per attack, at two configurations. Resumable: attacked victims are cached under results/verdict-cache.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
time nice -n 5 $PY -m benchmarks.verdict --out docs/verdict/k32 --samples 32 --iterations 200 --seed 0
time nice -n 5 $PY -m benchmarks.verdict --out docs/verdict/k16 --samples 16 --iterations 500 --seed 1
