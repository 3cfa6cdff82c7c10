"""Tuning a deployment: measure its engine and decide what to deploy.

    python -m tuning costs default.yaml                  # engine step costs (`make models` keeps the pair's)
    python -m tuning advise default.yaml --batches 1,32  # `make advise`
    python -m tuning tune default.yaml                   # `make tune`
    python -m tuning soak                                # `make soak`

Modules: step_costs (what one engine step costs: plain decode, verification, drafting), advise
(is this draft worth deploying, at which batch sizes), tune (K for each batch size, written into
a tuned YAML and proven by load tests), soak (each drafter's memory and latency over thousands of requests, judged
in soak_report), pair_samples (what the embedded pair's target writes on held-out prompts, judged
by loadtest's content check). They use loadtest's sweeps and reports; loadtest does not use them.
"""
