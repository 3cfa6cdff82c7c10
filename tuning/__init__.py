"""Tuning a deployment: measure its engine and decide what to deploy (`python -m tuning`: its commands).

Modules: step_costs (what one engine step costs: plain decode, verification, drafting), advise
(is this draft worth deploying, at which batch sizes), tune (K for each batch size, written into
a tuned YAML and proven by load tests), paymap (where speculation pays, over batch size and acceptance),
soak (each drafter's memory and latency over thousands of requests, judged in soak_report), pair_samples
(what the embedded pair's target writes on held-out prompts, judged by loadtest's content check). They
use loadtest's sweeps and reports; loadtest does not use them.
"""
