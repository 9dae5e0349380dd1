# sglang-prefill-ext — every target takes SGLANG_VERSION (default 0.5.17), one of the versions with
# patches in sglang_prefill_ext/patches/. The patch targets (apply, revert, check, status) patch the
# venv's SGLang, building the venv first when missing; with PYTHON=<interpreter> they patch the SGLang
# that interpreter imports instead and build nothing (this package must be pip-installed there).
# SGLANG_DIR=<folder holding sglang/> patches that folder.
SUPPORTED := $(sort $(patsubst sglang_prefill_ext/patches/sglang-%,%,$(wildcard sglang_prefill_ext/patches/sglang-*)))
SGLANG_VERSION ?= 0.5.17
ifeq ($(filter $(SGLANG_VERSION),$(SUPPORTED)),)
$(error SGLang $(SGLANG_VERSION) is not supported; supported versions: $(SUPPORTED))
endif
VENV ?= .venv-$(SGLANG_VERSION)
PY := $(VENV)/bin/python
STAMP := $(VENV)/.prefill-ext-installed
PYTEST_ARGS ?=
# An explicit SGLANG_VERSION is checked against the SGLang found; otherwise its installed version is used.
PATCH_ARGS := $(if $(filter command line environment,$(origin SGLANG_VERSION)),--sglang-version $(SGLANG_VERSION)) \
	$(if $(SGLANG_DIR),--sglang-dir $(SGLANG_DIR))

.PHONY: setup test lint apply revert check status demo clean-venv

setup: $(STAMP)

# A venv with the pinned real SGLang, this package (editable) and the test tools.
$(STAMP): requirements/sglang-$(SGLANG_VERSION).txt pyproject.toml
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

ifeq ($(origin PYTHON),command line)
apply revert check status:
	@$(PYTHON) -c "import sglang_prefill_ext" 2>/dev/null || { \
		echo "sglang-prefill-ext is not installed in $(PYTHON): run $(PYTHON) -m pip install . first" >&2; exit 2; }
	$(PYTHON) -m sglang_prefill_ext.cli $@ $(PATCH_ARGS)
else
apply revert check status: setup
	$(PY) -m sglang_prefill_ext.cli $@ $(PATCH_ARGS)
endif

demo: setup
	PYTHON=$(PY) bash scripts/demo.sh

clean-venv:
	rm -rf $(VENV)
