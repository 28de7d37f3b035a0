# Two commands do everything on a fresh clone:
#   make train   - train the default agent (installs into .venv on first use)
#   make test    - run the test suite
VENV := .venv
PY := $(VENV)/bin/python
EXTRAS ?= test,playground,brax,docs

.PHONY: train test bench
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

train: $(VENV)/.installed
	$(VENV)/bin/nnx-ppo train $(ARGS)

# The linter (ruff, configured in pyproject.toml), then two pytest workers (pytest-xdist),
# each taking whole test files (module fixtures run once), in the order
# tests/conftest.py gives (the longest files first).
test: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder $(ARGS)

bench: $(VENV)/.installed
	$(PY) bench/run_all.py
