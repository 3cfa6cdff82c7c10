"""Load tests of a deployment: batch-size sweeps with and without speculation, as reports.

    python -m loadtest run default.yaml --users 1,32     # `make loadtest`
    python -m loadtest compare                           # `make compare`

Modules: workloads (prompts, request bodies), client (one measured streaming request),
locustfile (the Locust user), locust_run (Locust as subprocesses, distributed too),
prom (/metrics), stats (percentiles, speculation arithmetic), runner (the sweep),
report (results.json, report.md, report.html, plots).
"""
