# The README's one-line commands. Each creates/updates the virtual environment in .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.segood-installed

.PHONY: install demo test test-fast docs bench gpu-check clean

install: $(STAMP)

# Re-installs only when the package metadata changes; the editable install picks up code changes.
$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/segood demo

test: $(STAMP)
	$(PY) -m pytest -q

# The unit tests of the metric engine, statistics, CLI start-up and docs (tests/conftest.py lists them).
test-fast: $(STAMP)
	$(PY) -m pytest -q -m fast

# The documentation site (mkdocs.yml) into site/, every warning an error.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench: $(STAMP)
	$(PY) benchmarks/bench_metrics.py

# On a machine with a CUDA GPU: prove the CUDA paths and measure them (benchmarks/gpu_check.py; <= 8 minutes).
gpu-check: $(STAMP)
	$(PY) benchmarks/gpu_check.py --out gpu_check.json

clean:
	rm -rf $(VENV) build site *.egg-info
