# sglang-prefill-ext — every target takes SGLANG_VERSION (default 0.5.17); the patch targets
# also take SGLANG_DIR=<folder holding sglang/> (default: the sglang the venv's python imports).
SGLANG_VERSION ?= 0.5.17
VENV ?= .venv-$(SGLANG_VERSION)
PY := $(VENV)/bin/python
STAMP := $(VENV)/.prefill-ext-installed
PATCH := SGLANG_VERSION=$(SGLANG_VERSION) PYTHON=$(PY) scripts/apply_patch.sh
PYTEST_ARGS ?=

.PHONY: setup test lint apply revert check status demo clean-venv

setup: $(STAMP)

# A venv with the pinned real SGLang, this package (editable) and the test tools.
$(STAMP): requirements/sglang-$(SGLANG_VERSION).txt pyproject.toml
	@test -f requirements/sglang-$(SGLANG_VERSION).txt || { echo "no requirements for SGLang $(SGLANG_VERSION)"; exit 2; }
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements/sglang-$(SGLANG_VERSION).txt
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# CPU suite against the real SGLang in $(VENV); GPU tests skip without CUDA.
# SGLang builds a torch C++ extension at first use; one build folder per venv, so two versions
# never share (or wait on each other's) build locks.
test: setup lint
	TORCH_EXTENSIONS_DIR=$(abspath $(VENV))/torch-extensions $(PY) -m pytest -q $(PYTEST_ARGS)

apply revert check status: setup
	$(PATCH) $@

demo: setup
	PYTHON=$(PY) SGLANG_VERSION=$(SGLANG_VERSION) bash scripts/demo.sh

clean-venv:
	rm -rf $(VENV)
