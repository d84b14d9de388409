PYTHON ?= python3
VENV := .venv
# The stamps live in the venv so `make clean` drops them with it; each re-installs only when pyproject.toml is
# newer than its last install. `make test` installs the test extras too; `make demo` only what a user installs
# ('.[cpu]': the package and the CPU OpenCL runtime), so a demo does not wait for pytest, zig or oclgrind.
STAMP := $(VENV)/.install.stamp
DEMO_STAMP := $(VENV)/.install-cpu.stamp

.PHONY: test demo clean native

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/python -m pip install -e '.[test,cpu]'
	touch $@ $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/python -m pip install -e '.[cpu]'
	touch $@

# The native runtime (native/, C): build/native/{libtuner_runtime.so,tuner-run,asan/tuner-run}, with the
# system gcc; the tests of tests/test_native_runtime.py run them.
native:
	$(MAKE) -C native

# The suite runs in TEST_WORKERS processes (pytest-xdist; auto: one per CPU, 0: in this process); tests of one
# xdist_group share a worker (tests/conftest.py says what a test must do to be safe in parallel).
TEST_WORKERS ?= auto
test: $(STAMP) native
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=15 tests

demo: $(DEMO_STAMP)
	$(VENV)/bin/tuner demo

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
