# querylab: `make run` (set up + main job on the embedded default), `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.querylab-installed

.PHONY: setup run test bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/querylab run

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf .querylab artifacts
