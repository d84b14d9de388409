PYTHON ?= python3
VENV := .venv
# The stamp lives in the venv so `make clean` drops both; it re-installs only
# when pyproject.toml is newer than the last install.
STAMP := $(VENV)/.install.stamp

.PHONY: test demo clean native

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/python -m pip install -e '.[test,cpu]'
	touch $@

# The native runtime (native/, C): build/native/{libtuner_runtime.so,tuner-run,asan/tuner-run}, with the
# system gcc; the tests of tests/test_native_runtime.py run them.
native:
	$(MAKE) -C native

# The suite runs in TEST_WORKERS processes (pytest-xdist; auto: one per CPU, 0: in this process); tests of one
# xdist_group share a worker (tests/conftest.py says what a test must do to be safe in parallel).
TEST_WORKERS ?= auto
test: $(STAMP) native
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup tests

demo: $(STAMP)
	$(VENV)/bin/tuner demo

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
