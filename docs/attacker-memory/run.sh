#!/bin/bash
# The attacker-memory study's measurements after the federation run (docs/attacker-memory.md).
set -u
R=results/memory-study/femnist-joint
for p in 0 1 2; do
  f=results/memory-study/cost-p$p.json
  [ -f $f ] || { /usr/bin/time -f "cost p$p %e s" nice -n 5 .venv/bin/python -m benchmarks.memory_cost $R --partition $p --threads 2 --out $f > /dev/null; }
done
for mode in keep labels; do
  [ -f $R/replays/memory-$mode/summary.json ] || /usr/bin/time -f "replay $mode %e s" nice -n 5 .venv/bin/python -m fl_attack.cli replay $R --name memory-$mode --memory $mode --methods pisme+memory --threads 2 --device cpu > /dev/null
done
