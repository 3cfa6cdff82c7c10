"""The sweep at several sampling temperatures: one full sweep (its own servers, report and vLLM
benchmark check) per temperature, then a summary of acceptance and speedup against temperature
(`loadtest.reports.temperature_report`, rewritten after each temperature).

Why a sweep each: a temperature changes what the drafter's tokens are worth (at T > 0 a draft
token survives with a probability, not by equality), and each sweep keeps its own pairing of
speculative and baseline runs, so every speedup is still measured beside its baseline.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from loadtest.reports.report import write_report
from loadtest.reports.temperature_report import TemperatureRun, write_summary
from loadtest.sweeps.settings import SweepSettings, default_out_dir
from loadtest.sweeps.runner import Sweep

log = logging.getLogger("specdeploy.loadtest")


def run_temperatures(settings: SweepSettings, temperatures: list[float]) -> tuple[list[TemperatureRun], Path]:
    """One sweep per temperature into `<out>/temperature-<T>/`; returns each sweep's results (with
    its temperature and report folder) and the parent folder. Ctrl-C stops after the running sweep
    has stopped its servers and written its report."""
    out = settings.out or default_out_dir(settings.config or "running-servers")
    runs: list[TemperatureRun] = []
    for n, temperature in enumerate(temperatures, 1):
        folder = f"temperature-{temperature:g}"
        sub = out / folder
        log.info("temperature %g (%d of %d): sweep into %s", temperature, n, len(temperatures), sub)
        sweep = Sweep(replace(settings, out=sub), temperature=temperature)
        stop: KeyboardInterrupt | None = None
        try:
            sweep.run()
        except KeyboardInterrupt as exc:  # its report and the summary are written first
            stop = exc
        write_report(sweep.results, sub)
        runs.append(TemperatureRun(temperature, folder, sweep.results))
        write_summary(runs, out)  # after each temperature: an interrupted run keeps what it measured
        if stop:
            raise stop
    return runs, out
