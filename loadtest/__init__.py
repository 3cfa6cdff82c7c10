"""Load tests of a deployment: batch-size sweeps with and without speculation, as reports.

    python -m loadtest run default.yaml --users 1,32     # `make loadtest`
    python -m loadtest compare                           # `make compare`

By stage, each package using only the ones before it:
  measurement/  what a request's record holds, statistics, /metrics, the content check, service targets,
                the shape of results.json
  traffic/      what is sent and how: workloads, request settings, arrivals, the Locust user and its
                processes, running endpoints, vLLM's serving benchmark
  reports/      Markdown, HTML and plots of a sweep, a capacity search, a comparison
  sweeps/       the closed- and open-loop sweep, its plan, the capacity search, the temperature sweep
Shared by every stage and by tuning/ and distill/: `files` (atomic writes), `arg_types` (argparse
types), `progress` (the bar over a Locust run), `sampling` (a background sampler). The command line:
`__main__` (run, compare, rejudge) and `capacity_cli`.
"""
