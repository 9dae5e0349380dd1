# sglang-prefill-ext — every target takes SGLANG_VERSION (default 0.5.17), one of the versions with
# patches in patches/. The patch targets (apply, revert, check, status) run scripts/apply_patch.sh on
# the venv's SGLang, building the venv first when missing; with PYTHON=<interpreter> on the SGLang
# that interpreter imports instead, building nothing. SGLANG_DIR=<folder holding sglang/> patches
# that folder.
SUPPORTED := $(sort $(patsubst patches/sglang-%,%,$(wildcard patches/sglang-*)))
SGLANG_VERSION ?= 0.5.17
ifeq ($(filter $(SGLANG_VERSION),$(SUPPORTED)),)
$(error SGLang $(SGLANG_VERSION) is not supported; supported versions: $(SUPPORTED))
endif
VENV ?= .venv-$(SGLANG_VERSION)
PY := $(VENV)/bin/python
STAMP := $(VENV)/.prefill-ext-installed
PYTEST_ARGS ?=
# An explicit SGLANG_VERSION is checked against the SGLang found; otherwise its installed version is used.
PATCH_VERSION := $(if $(filter command line environment,$(origin SGLANG_VERSION)),$(SGLANG_VERSION))

.PHONY: setup test lint apply revert check status demo clean-venv

setup: $(STAMP)

# A venv with the pinned real SGLang, this package (editable) and the test tools.
$(STAMP): requirements/sglang-$(SGLANG_VERSION).txt pyproject.toml setup.py
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

# PYTHON=<interpreter> on the command line: that interpreter's SGLang, and no venv is built.
GIVEN_PYTHON := $(filter command line,$(origin PYTHON))
apply revert check status: $(if $(GIVEN_PYTHON),,setup)
	PYTHON=$(if $(GIVEN_PYTHON),$(PYTHON),$(PY)) scripts/apply_patch.sh $@ '$(PATCH_VERSION)' '$(SGLANG_DIR)'

demo: setup
	PYTHON=$(PY) bash scripts/demo.sh

clean-venv:
	rm -rf $(VENV)
