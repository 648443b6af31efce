#!/usr/bin/env bash
# The remembering server's seed-0 federation in the recommended mode (keep + aux), run again with the
# verdict (docs/verdict.md; docs/attacker-memory.md, "Re-read in images recovered"). Same run config as
# docs/attacker-memory/seed0-keep-aux/run-config.toml.
set -euo pipefail
cd "$(dirname "$0")/../../.."
time nice -n 5 .venv/bin/python -m strategies.launch --run-config docs/attacker-memory/seed0-keep-aux/run-config.toml \
    --federation-config "num-supernodes=20 client-resources-num-cpus=1 client-resources-num-gpus=0.0" \
    --run-dir-file results/.memory-verdict-run
RUN=$(cat results/.memory-verdict-run)
cp "$RUN/attacks.csv" "$RUN/rounds.csv" docs/attacker-memory/verdict/
