# corewire: two commands people run.
#   make conformance  - conformance suites against the embedded reference frontend, reports in reports/
#   make test         - every test of the harness itself, the vllm lane (real vLLM frontends) included
# Both bootstrap their own virtualenv in .venv from a fresh clone.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CORE_STAMP := $(VENV)/.corewire-core
VLLM_STAMP := $(VENV)/.corewire-vllm
XDIST  ?= 4
export VLLM_HOST_IP := 127.0.0.1
# Bytecode caching on, whatever the shell says: every xdist worker, nested pytest run and
# driver program imports the harness again, and without .pyc files (and pytest's cached
# assertion rewrites) each start compiles it from source: 2.2 s instead of 0.9 s of CPU
# per collecting process, measured (docs/benchmarks.md).
unexport PYTHONDONTWRITEBYTECODE
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: bench conformance test history compliance coverage spec mutants history-mutants mutation mutation-recheck venv venv-vllm chromium lint clean profiles

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

# Debian's chromium renders the HTML report in its test; skipped (with the reason) if absent.
chromium:
	@command -v chromium >/dev/null 2>&1 || { echo "==> installing chromium (Debian package)"; \
	  (apt-get update -q && apt-get install -y -q chromium) >/dev/null 2>&1 || \
	  echo "    could not install chromium; the HTML screenshot test will be skipped"; }

conformance: $(CORE_STAMP)
	$(BIN)/corewire run --frontend reference --frontend kv:reference --frontend ec:reference \
	  --report-dir reports

# One pytest session: corewire's own tests (vllm lane included) and the conformance suites
# against the reference frontend (in-process and via the subprocess driver protocol) and
# the real vLLM frontends, whose known divergences are tolerated by the baseline.
test: $(VLLM_STAMP) chromium
	$(BIN)/python -m pytest -n $(XDIST) --dist worksteal -p no:cacheprovider tests conformance \
	  --frontend reference --frontend reference-subprocess \
	  --frontend vllm-rs --frontend vllm-py --frontend kv:reference --frontend ec:reference \
	  --baseline fixtures/baselines/vllm-0.33.json --report-dir reports/test

# Measure the frontends under load (docs/bench.md): reference, vllm-rs and vllm-py side by side
# in one run (~3 minutes); reports in reports/bench. Not part of make test (its smoke is).
bench: $(VLLM_STAMP)
	$(BIN)/corewire bench --frontend reference --frontend vllm-rs --frontend vllm-py \
	  --report-dir reports/bench

# Regenerate fixtures/profiles: one protocol profile per vLLM release 0.22.0 ... 0.33.0, read
# from each release's sdist (downloaded once into ~/.cache/corewire/sdists; needs the network).
profiles: $(CORE_STAMP)
	$(BIN)/python scripts/gen_profiles.py

# Regenerate docs/history.md: every case against the Rust frontend of every vLLM release
# 0.22.0 ... 0.33.0 (binaries fetched once by range requests into the cache; ~80 s a release).
history: $(CORE_STAMP)
	$(BIN)/python scripts/history.py -n $(XDIST)
	$(BIN)/python scripts/history.py --skew -n $(XDIST)

# Regenerate docs/compliance.md: every case against every frontend, real vLLM included.
compliance: $(VLLM_STAMP)
	-$(BIN)/corewire run --frontend reference --frontend reference-subprocess \
	  --frontend vllm-rs --frontend vllm-py --frontend kv:reference --frontend ec:reference \
	  --baseline fixtures/baselines/vllm-0.33.json --report-dir reports/compliance
	$(BIN)/corewire compliance reports/compliance/results.json \
	  --baseline fixtures/baselines/vllm-0.33.json --out docs/compliance.md
	$(BIN)/python scripts/gen_spec.py

# Regenerate docs/coverage.md: vLLM 0.33.0's own client tests -> the cases covering them,
# and the field table (fixtures/coverage/fields-0.33.0.toml: every wire field -> its cases)
# (fixtures/coverage/vllm-0.33.0.json + the case specs; no vLLM, no network).
coverage: $(CORE_STAMP)
	$(BIN)/python scripts/gen_coverage.py

# Regenerate docs/spec.md: the engine-core wire protocol as of vLLM 0.33.0 (RFC 2119 form),
# from the protocol profile, the cases' levels and grounds, and docs/compliance.md +
# docs/history.md (regenerate those first when verdicts change); docs/coverage.md with it,
# since both show the cases' levels. No vLLM, no network.
spec: $(CORE_STAMP)
	$(BIN)/python scripts/gen_coverage.py
	$(BIN)/python scripts/gen_spec.py

# The full kill matrix: every case x every hand-written mutant (conformance/<area>/mutants.py),
# recorded in fixtures/kill-matrix.json (commit it) and reports/kill-matrix.md. make test
# re-verifies only a proof drawn from the record (tests/test_mutants.py).
# `make mutants KILL_MATRIX_ARGS=--incremental` runs only the pairs with a new mutant or case.
MUTANT_WORKERS ?= 10
KILL_MATRIX_ARGS ?=
mutants: $(CORE_STAMP)
	$(BIN)/python scripts/kill_matrix.py --workers $(MUTANT_WORKERS) $(KILL_MATRIX_ARGS)

# The history mutants (bug classes from vLLM's own history, history=True in
# conformance/<area>/mutants.py; not in the kill matrix): the whole suite against each, one
# at a time, with the firing check; recorded in fixtures/history-mutants.json (commit it),
# summarised in docs/mutation-history.md. `make history-mutants HISTORY_ARGS=NAME` re-runs one.
HISTORY_ARGS ?=
history-mutants: $(CORE_STAMP)
	$(BIN)/python scripts/history_matrix.py --workers 2 $(HISTORY_ARGS)

# mutmut over the reference frontend, killed by the conformance suite: docs/mutation.md
# (score, every survivor judged in fixtures/mutation/equivalent.json) and the sample of
# generated mutants that make test re-checks (fixtures/mutation/sample.json).
MUTMUT_CHILDREN ?= 4
mutation: $(CORE_STAMP)
	$(BIN)/python scripts/mutation.py run --children $(MUTMUT_CHILDREN)

# Only the mutants the last `make mutation` left alive, against today's suite.
mutation-recheck: $(CORE_STAMP)
	$(BIN)/python scripts/mutation.py recheck --children $(MUTMUT_CHILDREN)

lint: $(CORE_STAMP)
	$(BIN)/ruff check harness mock_engines conformance tests scripts benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) reports/*.json reports/*.xml reports/*.html
