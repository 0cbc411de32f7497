# The two commands of the README:
#   make demo   installs npurun in .venv and upscales the bundled photo 3x with the bundled ESPCN
#   make test   installs the test dependencies in .venv and runs the whole default test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: demo test test-all bench fuzz soak clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml setup.py $(wildcard csrc/*)
	$(PIP) install -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -e '.[test]'
	touch $@

# test-all also builds the corpus (bench/corpus.py): transformers and the dynamo exporter.
$(VENV)/.installed-corpus: $(VENV)/.installed-test
	$(PIP) install -e '.[test,corpus]'
	touch $@

demo: $(VENV)/.installed
	@mkdir -p out
	$(BIN)/npurun upscale npurun/zoo/sample.jpg -o out/sample_x3.png

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m "not slow" -q

test-all: $(VENV)/.installed-corpus
	$(BIN)/python -m pytest -q

# Issue P's long runs (their short forms are in `make test`): 10,000 cases per fuzz target,
# the server soak for 10 minutes. Figures: the run's summary and out/*-figures.jsonl.
fuzz: $(VENV)/.installed-test
	@mkdir -p out
	NPURUN_FUZZ_CASES=10000 NPURUN_FUZZ_FIGURES=out/fuzz-figures.jsonl $(BIN)/python -m pytest tests/fuzz -m fuzz -q -o timeout=7200

soak: $(VENV)/.installed-test
	@mkdir -p out
	NPURUN_SOAK_S=600 NPURUN_SOAK_FIGURES=out/soak-figures.jsonl $(BIN)/python -m pytest tests/soak -m soak -q -o timeout=1500

bench: $(VENV)/.installed-test
	$(BIN)/python bench/espcn_4k.py

clean:
	rm -rf $(VENV) out .pytest_cache
