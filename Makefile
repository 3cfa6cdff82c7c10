# specdeploy: speculative decoding on vLLM, deployed and measured.
# `make serve` runs the embedded default; `make test` runs the tests. Both set up .venv first.

CONFIG  ?= default.yaml
SET     ?=
USERS   ?= 1,32
WORKERS ?= 0
PY      := .venv/bin/python
STAMP   := .venv/.specdeploy-installed

# CONFIG plus the shared command-line switches: SET="a.b=1 c.d=2", NO_SPEC=1.
CONFIG_ARGS = $(CONFIG) $(foreach s,$(SET),--set $(s)) $(if $(NO_SPEC),--no-spec)

.PHONY: help venv models serve check observability test test-full bench-drafters loadtest compare advise tune distill clean

help:
	@echo "make serve [CONFIG=default.yaml] [SET='field=value ...'] [NO_SPEC=1] [DRY_RUN=1] [NODE_RANK=r]"
	@echo "make check CONFIG=...     validate a config against this machine, print the vLLM command"
	@echo "make observability CONFIG=...   Prometheus scrape config + Grafana dashboard (observability/<config>/)"
	@echo "make models [REBUILD=1]   build the embedded pair from the shipped weights (cached); REBUILD=1 retrains them"
	@echo "make test                 behaviour on real vLLM engines (CPU, the plumbing pair): before every commit"
	@echo "make test-full            make test, then the measurement tests (advise, tune, distill, speedups): before resolving measurement work"
	@echo "make bench-drafters       compare drafters on the embedded default"
	@echo "make loadtest CONFIG=... USERS=1,32 [WORKERS=N] [SLO=ttft_p95=500ms,tpot_p95=50ms] [LOADTEST_ARGS='--k 2,8']"
	@echo "make loadtest URL=http://host:port [BASELINE_URL=http://host:port] [CONFIG=...]   servers already running"
	@echo "make compare [REPORT=reports/...]   batch-1 vs batch-32 table of a report"
	@echo "make advise CONFIG=... [USERS=1,32] [ADVISE_ARGS='--workload my.jsonl --temperature 0.7']   should this draft be deployed, at which batch sizes"
	@echo "make tune CONFIG=... USERS=1,4,16,32 [TUNE_ARGS=--no-prove]   K per batch size measured on the engine, written to <config>-tuned.yaml, proven by load tests"
	@echo "make distill CONFIG=... [DATA=prompts.jsonl] [DISTILL_ARGS='--epochs 5']   a draft fine-tuned on the target's own outputs, <config>-distilled.yaml, acceptance before/after"

$(STAMP): pyproject.toml scripts/install-env.sh
	bash scripts/install-env.sh
	@touch $@

venv: $(STAMP)

# Build the embedded pair, then measure its step costs on the engine (kept beside it).
models: $(STAMP)
	$(PY) -m deploy models $(if $(REBUILD),--retrain)
	$(PY) -m tuning costs default.yaml --pair

serve: $(STAMP)
	$(PY) -m deploy serve $(CONFIG_ARGS) $(if $(DRY_RUN),--dry-run) $(if $(NODE_RANK),--node-rank $(NODE_RANK))

check: $(STAMP)
	$(PY) -m deploy check $(CONFIG_ARGS)

# prometheus.yml + a Grafana dashboard for the config's speculative-decoding metrics.
observability: $(STAMP)
	$(PY) -m deploy observability $(CONFIG_ARGS) --out observability/$(basename $(notdir $(CONFIG)))

# The model pair is built (or found cached) first, so its progress bar shows outside pytest.
# make test: behaviour, on the plumbing pair. make test-full: that, then the measurements (marker
# `full`), each on the cost-faithful pair with no idle server beside it.
test: $(STAMP)
	$(PY) -m deploy models
	$(PY) -m pytest -m "not full" $(PYTEST_ARGS)

test-full: $(STAMP)
	$(PY) -m deploy models
	$(PY) -m pytest $(PYTEST_ARGS)

bench-drafters: $(STAMP)
	$(PY) -m tuning bench-drafters

# With URL the servers already run (make serve, elsewhere): CONFIG is read only when given.
LOADTEST_SERVERS = $(if $(URL),--url $(URL) $(if $(BASELINE_URL),--baseline-url $(BASELINE_URL)) \
	$(if $(filter-out file,$(origin CONFIG)),$(CONFIG)),$(CONFIG_ARGS))

loadtest: $(STAMP)
	$(PY) -m loadtest run $(LOADTEST_SERVERS) --users $(USERS) --workers $(WORKERS) \
	  $(if $(SLO),--slo $(SLO)) $(LOADTEST_ARGS)

# Step costs, acceptance and speedup of the config's drafter on a workload, and a verdict.
advise: $(STAMP)
	$(PY) -m tuning advise $(CONFIG) $(foreach s,$(SET),--set $(s)) --batches $(USERS) $(ADVISE_ARGS)

# K for each batch size, measured on the engine, written to <config>-tuned.yaml and proven by load tests.
tune: $(STAMP)
	$(PY) -m tuning tune $(CONFIG) $(foreach s,$(SET),--set $(s)) --batches $(USERS) $(TUNE_ARGS)

# The draft fine-tuned on the served target's continuations of DATA (default: a domain the embedded
# pair never saw), written with <config>-distilled.yaml; acceptance and speedup measured before/after.
distill: $(STAMP)
	$(PY) -m distill $(CONFIG) $(foreach s,$(SET),--set $(s)) $(if $(DATA),--data $(DATA)) --batches $(USERS) $(DISTILL_ARGS)

compare: $(STAMP)
	$(PY) -m loadtest compare $(REPORT)

clean:
	rm -rf logs reports .pytest_cache
