# Two entry points (see README): `make demo` runs the default federation, `make test` the test suite.
# Both create .venv on first use. torch==2.14.1 / torchvision==0.29.1 install from local disk here.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo demo-docs docs test test-fast test-slow lint attack gpu-check gpu-deps clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(PY) -m strategies.launch --run-dir-file .last-run --run-config 'attack-memory="keep" attack-options="label_estimator=aux"'
	$(PY) -m analysis.report "$$(cat .last-run)" --out "$$(cat .last-run)/report"
	@echo "fl-attack: to put this run in README's demo blocks (and docs/demo-record/): make demo-docs"

# The generated docs (analysis/docs.py; tests/test_docs.py holds them): docs/run-config.md,
# docs/run-folder.md and README's demo blocks from the committed docs/demo-record/.
docs: setup
	$(PY) -m analysis.docs all

# The last `make demo` run becomes docs/demo-record/ and README's demo blocks (tracked files: opt-in).
demo-docs: setup
	$(PY) -m analysis.docs demo-record "$$(cat .last-run)"

test: setup
	$(PY) -m pytest -q -n 2 --dist loadgroup

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@# the layers and the honest side's imports: [tool.importlinter] in pyproject.toml
	$(VENV)/bin/lint-imports

# The developer's loop: the unit and light in-process tests; nothing that starts flwr, Ray or other
# processes (marker runtime), no in-process test of more than about 3 s (marker heavy).
test-fast: setup
	$(PY) -m pytest -q -m "not slow and not runtime and not heavy"

test-slow: setup
	$(PY) -m pytest -q -m slow

attack: setup
	$(VENV)/bin/fl-attack attack --iterations 200 --clients 2 --out results/attack

# The GPU check (docs/gpu-check.md): CUDA tests, benchmarks and a federation with attacker actors on
# the GPU, written to docs/gpu-check/. No setup step: the GPU machine has no package index, so it runs
# with that machine's python3 (and .gpu-deps/site.tar.xz for what it lacks). Here, a dry run:
# make gpu-check GPU_CHECK_ARGS='--device cpu --quick --out /tmp/gpu-check'
GPU_PY := $(shell test -x $(PY) && echo $(PY) || echo python3)
gpu-check:
	$(GPU_PY) -m benchmarks.gpu_check $(GPU_CHECK_ARGS)

# .gpu-deps/site.tar.xz: flwr, ray, lpips, piq and their needs for the GPU machine's Python 3.12 (about 30 MB)
gpu-deps: setup
	PY=$(PY) bash benchmarks/gpu_deps.sh

clean:
	rm -rf $(VENV) .pytest_cache
