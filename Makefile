# corewire: two commands people run.
#   make conformance  - conformance suites against the embedded reference frontend, reports in reports/
#   make test         - every test of the harness itself, the vllm lane (real vLLM frontends) included
# Both bootstrap their own virtualenv in .venv from a fresh clone.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CORE_STAMP := $(VENV)/.corewire-core
VLLM_STAMP := $(VENV)/.corewire-vllm
XDIST  ?= 2
export VLLM_HOST_IP := 127.0.0.1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: conformance test venv venv-vllm lint clean

venv: $(CORE_STAMP)
venv-vllm: $(VLLM_STAMP)

$(CORE_STAMP): pyproject.toml
	@echo "==> creating $(VENV) and installing corewire (dev extras)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

# The vllm lane: vllm 0.33.0 without CUDA (torch CPU build, vllm itself with --no-deps).
$(VLLM_STAMP): $(CORE_STAMP) requirements/vllm-cpu.txt
	@echo "==> installing the vllm lane: torch (CPU) and vllm 0.33.0 (--no-deps); this takes a few minutes"
	$(BIN)/python -m pip install --progress-bar on -r requirements/vllm-cpu.txt
	$(BIN)/python -m pip install --progress-bar on --no-deps vllm==0.33.0
	touch $@

conformance: $(CORE_STAMP)
	$(BIN)/python -m harness.cli run --frontend reference

test: $(VLLM_STAMP)
	$(BIN)/python -m pytest -n $(XDIST) tests conformance

lint: $(CORE_STAMP)
	$(BIN)/ruff check harness mock_engines conformance tests scripts benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) reports/*.json reports/*.xml reports/*.html
