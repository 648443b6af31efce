# Two entry points (see README): `make demo` runs the default federation, `make test` the test suite.
# Both create .venv on first use. torch==2.14.1 / torchvision==0.29.1 install from local disk here.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-slow lint attack clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(PY) -m strategies.launch --run-dir-file .last-run
	$(PY) -m analysis.report "$$(cat .last-run)" --out "$$(cat .last-run)/report"

test: setup
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test-slow: setup
	$(PY) -m pytest -q -m slow

attack: setup
	$(VENV)/bin/fl-attack attack --iterations 200 --clients 2 --out results/attack

clean:
	rm -rf $(VENV) .pytest_cache
