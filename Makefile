# Every target CI uses lives here; .ci/run calls `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: demo test lint fmt typecheck bench install dev clean

$(VENV)/.core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e .
	touch $@

$(VENV)/.dev: pyproject.toml $(VENV)/.core
	$(VENV)/bin/pip install -q -e ".[dev,postgres,anthropic,openai,google,otel]"
	touch $@

install: $(VENV)/.core
dev: $(VENV)/.dev

## demo: the ETL crash/resume story on an embedded SQLite store, no API key needed
demo: $(VENV)/.core
	$(VENV)/bin/stepstone demo
	@echo "stepstone is installed in $(VENV): run '. $(VENV)/bin/activate' to put it on your PATH"

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check src tests examples bench
	$(VENV)/bin/ruff format --check src tests examples bench
	$(VENV)/bin/lint-imports

fmt: $(VENV)/.dev
	$(VENV)/bin/ruff format src tests examples bench
	$(VENV)/bin/ruff check --fix src tests examples bench

typecheck: $(VENV)/.dev
	$(VENV)/bin/mypy

## test: linters, then the type checker and the whole suite side by side (mypy runs on one
## core; its report is printed after pytest's). PostgreSQL tests start their own server. The
## suite runs in TEST_WORKERS processes (pytest-xdist); most tests wait on processes, servers
## and sockets, so more processes than cores keep both cores busy. TEST_WORKERS=0: one
## process. Python may cache bytecode here even where the environment says not to: a run
## starts hundreds of interpreters, and each would compile the same sources again.
## The exit status is pytest's when it failed (5: no tests ran), else mypy's.
TEST_WORKERS ?= 4
test: lint
	@set +e; log=$$(mktemp); $(VENV)/bin/mypy > $$log 2>&1 & mypy_pid=$$!; \
	PYTHONDONTWRITEBYTECODE= $(VENV)/bin/pytest -n $(TEST_WORKERS) --dist worksteal; status=$$?; \
	wait $$mypy_pid; mypy_status=$$?; echo "mypy:"; cat $$log; rm -f $$log; \
	if [ $$status -eq 0 ]; then status=$$mypy_status; fi; exit $$status

bench: $(VENV)/.dev
	$(PY) bench/plan_overhead.py
	$(PY) bench/plan_step_cost.py --cpu --rounds 7
	$(PY) bench/pg_fanout.py
	$(PY) bench/pg_commit.py
	$(PY) bench/pg_queue.py
	$(PY) bench/sqlite_group.py
	$(PY) bench/sqlite_threads.py
	$(PY) bench/pg_threads.py
	$(PY) bench/workflow_overhead.py
	$(PY) bench/time_and_messages.py sleepers
	$(PY) bench/time_and_messages.py roundtrip
	$(PY) bench/llm_overhead.py
	$(PY) bench/agent_overhead.py
	$(PY) bench/prune_cost.py --mb 256
	$(PY) bench/compare.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
	find src tests examples bench -name __pycache__ -prune -exec rm -rf {} +
