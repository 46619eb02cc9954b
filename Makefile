# Two entry points, each working on a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# What a user needs (capture, analysis, the report: `make demo`), then the test extras on top (`make test`).
STAMP := $(VENV)/.stepscope-user
TEST_STAMP := $(VENV)/.stepscope-installed
# torch is pinned for development; pip finds the CPU wheel on this machine's disk.
TORCH_PIN := torch==2.13.0
PIP := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: demo test test-fast lint bench-docs bench clean gpu-check bytecode vega-bundle

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) $(TORCH_PIN)
	$(PIP) -e '.[capture]' $(TORCH_PIN)
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	# DS_BUILD_OPS=0: deepspeed (in the test extra) compiles none of its ops at install (they are built when used)
	DS_BUILD_OPS=0 $(PIP) -e '.[capture,test]' $(TORCH_PIN)
	touch $(TEST_STAMP)

# The editable install leaves stepscope's own modules uncompiled, and where PYTHONDONTWRITEBYTECODE is set
# (as on our machines) every process compiled them again: 0.1 s at each start. Compiled here as pip compiles
# an installed package (only files changed since are compiled again).
bytecode: $(STAMP)
	$(PY) -m compileall -q -j 0 src

demo: bytecode
	$(VENV)/bin/stepscope demo
	@echo "stepscope is installed in $(VENV), not on PATH: 'source $(VENV)/bin/activate' runs the README's commands as written"

# The whole suite (CI); the 20 slowest tests are listed at the end so that a test that grows is seen.
test: bytecode $(TEST_STAMP)
	$(PY) -m pytest -q --durations=20

# Everything but the tests marked slow (multi-process jobs, real training runs): a couple of minutes.
test-fast: bytecode $(TEST_STAMP)
	$(PY) -m pytest -q -m "not slow" --durations=10

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# Every CUDA path of capture on a real GPU (docs/gpu.md); without CUDA, its dry mode. Where python3 already has
# a CUDA build of torch and stepscope's needs (a machine without a package index), use it instead of .venv:
#   make gpu-check GPU_PYTHON=python3 [GPU_CHECK_ARGS="--no-nsys --only overhead ..."]
GPU_PYTHON ?=
GPU_CHECK_OUT ?= gpu_check_out
gpu-check: $(if $(GPU_PYTHON),,$(TEST_STAMP))
	$(or $(GPU_PYTHON),$(PY)) benchmarks/gpu_check.py --out $(GPU_CHECK_OUT) $(GPU_CHECK_ARGS)

# The report's charting library, shipped as a file of the package so that writing a page runs no JavaScript
# engine: rebuilt from vl-convert-python (a test dependency) when it is to be updated, then committed.
vega-bundle: $(TEST_STAMP)
	$(PY) -m stepscope.report.html.vega src/stepscope/report/templates/vega.js

# docs/benchmarks.md's tables, rendered from the results files the benchmarks write (benchmarks/results/*.json).
bench-docs: $(STAMP)
	$(PY) benchmarks/docs_tables.py

clean:
	rm -rf $(VENV) stepscope_runs gpu_check_out
