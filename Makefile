# The two commands of the README:
#   make demo   installs npurun in .venv and upscales the bundled photo 3x with the bundled ESPCN
#   make test   installs the test dependencies in .venv and runs the whole default test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: demo test test-all bench clean

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

bench: $(VENV)/.installed-test
	$(BIN)/python bench/espcn_4k.py

clean:
	rm -rf $(VENV) out .pytest_cache
