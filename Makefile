# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the suite).
# Both create .venv and install everything themselves.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
# e.g. `make demo DEMO_ARGS=--no-progress` (the bars are already off when stderr is not a terminal)
DEMO_ARGS ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test demo clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile

demo: $(STAMP)
	$(VENV)/bin/lenx demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) runs
