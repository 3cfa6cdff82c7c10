"""The summary of a sweep at several sampling temperatures (`loadtest.sweeps.temperature`):
acceptance, tokens per step and the speedups against temperature, as temperature.json, temperature.md
(a table, links to each temperature's own report) and temperature.png; and the table alone for the
terminal (`python -m loadtest compare` on a temperature run's folder).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from loadtest.files import write_atomic, write_json
from loadtest.measurement.derive import derive, summarize_speedups
from loadtest.measurement.derived import Comparison
from loadtest.measurement.results import SweepResults
from loadtest.reports import markdown
from loadtest.reports import plots


@dataclass
class TemperatureRun:
    """One temperature's sweep: its results and its report's folder (beside temperature.md)."""

    temperature: float
    report: str
    """The folder's name, `temperature-<T>`."""
    results: SweepResults


@dataclass(frozen=True)
class Spread:
    """Mean and the lowest and highest run: with a few runs per point, the range says more than
    a Student's t interval (two runs give one 25 times as wide as their difference)."""

    n: int = 0
    mean: float | None = None
    min: float | None = None
    max: float | None = None


def spread(values: list[float]) -> Spread:
    return Spread(len(values), sum(values) / len(values), min(values), max(values)) if values else Spread()


SUMMARY_KEYS = ("acceptance_rate", "mean_accepted_length", "speedup", "vllm_bench_speedup", "measured_speedup")
"""The figures of a `Comparison` a row spreads over the repeats, in `TemperatureRow`'s order."""


@dataclass(frozen=True)
class TemperatureRow:
    """A speculative variant at one temperature and batch size, over the repeats (`summary_rows`)."""

    temperature: float
    variant: str
    concurrency: int
    runs: int
    verdict: str
    acceptance_rate: Spread
    mean_accepted_length: Spread
    speedup: Spread
    vllm_bench_speedup: Spread
    measured_speedup: Spread


def summary_rows(runs: list[TemperatureRun]) -> list[TemperatureRow]:
    """Per temperature, concurrency and speculative variant: acceptance, tokens per step and the
    speedups over the repeats (each repeat paired with its own baseline run), and the verdict
    each temperature's report gives."""
    rows = []
    for run in runs:
        verdicts = {(e.variant, e.concurrency): e.verdict for e in summarize_speedups(run.results)}
        groups: dict[tuple[str, int], list[Comparison]] = {}
        for d in derive(run.results):
            groups.setdefault((d.variant, d.concurrency), []).append(d)
        for (variant, concurrency), derived in groups.items():
            rows.append(TemperatureRow(
                run.temperature, variant, concurrency, len(derived), verdicts.get((variant, concurrency), "-"),
                *(spread([v for d in derived if (v := getattr(d, key)) is not None]) for key in SUMMARY_KEYS)))
    return sorted(rows, key=lambda r: (r.concurrency, r.variant, r.temperature))


def _spread_cell(m: Spread, fmt: str) -> str:
    if m.mean is None:
        return "-"
    text = format(m.mean, fmt)
    if m.n > 1:
        text += f" [{format(m.min, fmt)}-{format(m.max, fmt)}]"
    return text


def summary_table(rows: list[TemperatureRow]) -> str:
    header = ["batch", "variant", "temperature", "runs", "acceptance", "tokens per step", "speedup (Locust)",
              "speedup (vLLM's benchmark)", "speedup (engine, per token)", "verdict"]
    return markdown.table(header, [
        [r.concurrency, r.variant, f"{r.temperature:g}", r.runs, _spread_cell(r.acceptance_rate, ".1%"),
         _spread_cell(r.mean_accepted_length, ".2f"), _spread_cell(r.speedup, ".2f"),
         _spread_cell(r.vllm_bench_speedup, ".2f"), _spread_cell(r.measured_speedup, ".2f"), r.verdict] for r in rows])


def load_runs(out: Path) -> list[TemperatureRun]:
    """The sweeps of a temperature run, read back from their folders (to rebuild the summary)."""
    runs = []
    for results_file in sorted(out.glob("temperature-*/results.json")):
        results = SweepResults.load(results_file)
        runs.append(TemperatureRun(float(results.settings["temperature"]), results_file.parent.name, results))
    return sorted(runs, key=lambda r: r.temperature)


def plot_summary(rows: list[TemperatureRow], out: Path) -> Path | None:
    """Acceptance and speedup against temperature, one line per (variant, batch size)."""
    if not rows:
        return None
    fig, (left, right) = plots.pyplot().subplots(1, 2, figsize=(11, 4))
    for key in sorted({(r.variant, r.concurrency) for r in rows}, key=lambda k: (k[1], k[0])):
        series = [r for r in rows if (r.variant, r.concurrency) == key]
        xs = [r.temperature for r in series]
        label = f"{key[0]}, batch {key[1]}"
        left.plot(xs, [r.acceptance_rate.mean for r in series], marker="o", label=label)
        right.plot(xs, [r.speedup.mean for r in series], marker="o", label=label)
    right.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    left.set_ylim(0, 1.05)  # from zero: a fall from 60% to 5% should look like one
    right.set_ylim(bottom=0)
    for ax, title, ylabel in ((left, "Acceptance against temperature", "accepted / drafted tokens (engine)"),
                              (right, "Speedup against temperature", "output tok/s vs no speculation (Locust)")):
        ax.set_xlabel("sampling temperature")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return plots.save(fig, out / "temperature.png", dpi=110)


def run_problems(results: SweepResults) -> list[str]:
    """A sweep's own problems and its runs' (each distinct one once, with where it happened)."""
    found: dict[str, list[str]] = {p: [] for p in results.problems}
    for variant in results.variants:
        if variant.error and not variant.levels:
            found.setdefault(variant.error, []).append(variant.name)
        for level in variant.levels:
            for problem in level.problems:
                found.setdefault(problem, []).append(f"{variant.name} {level.label}")
    return [f"{p} ({', '.join(dict.fromkeys(where))})" if where else p for p, where in found.items()] or ["-"]


def write_summary(runs: list[TemperatureRun], out: Path) -> dict[str, Path]:
    """temperature.json, temperature.md (the table, links to each sweep's report) and temperature.png."""
    out.mkdir(parents=True, exist_ok=True)
    rows = summary_rows(runs)
    first = runs[0].results if runs else SweepResults()  # no runs: an empty sweep's words
    draft = next((v.speculative_config for v in first.variants if v.speculative_config), None)
    # A server the sweep started has the kit's whole speculative_config (greedy unless it says); a
    # running one tells only its K.
    sampling = ("-" if not draft else draft.get("draft_sample_method", "greedy") if "method" in draft
                else "not known (a running server does not say)")
    settings = first.settings
    write_json(out / "temperature.json", {"config": first.config, "draft_sample_method": sampling,
                                          "settings": settings, "rows": [asdict(r) for r in rows],
                                          "sweeps": {f"{r.temperature:g}": {"report": r.report,
                                                                            "status": r.results.status,
                                                                            "problems": r.results.problems}
                                                     for r in runs}})
    plot = plot_summary(rows, out)
    problems = [f"- temperature {r.temperature:g}: {r.results.status}: " + "; ".join(run_problems(r.results))
                for r in runs if r.results.status != "ok"]
    text = "\n".join([
        f"# Acceptance and speedup against temperature: {first.config}", "",
        f"Draft sampling: **{sampling}** (vLLM's `draft_sample_method`). Workload {settings.get('workload')}, "
        f"{settings.get('max_tokens')} output tokens, {settings.get('repeat')} run(s) of each variant at each batch "
        f"size and temperature, each beside a baseline run; means with [lowest-highest run]. Acceptance is the "
        f"engine's (accepted / drafted tokens over a run); tokens per step counts the target's own token. Each "
        f"temperature's report gives 95% intervals and the verdict's reasoning.", "",
        summary_table(rows), "",
        *(["## Problems", "", *problems, ""] if problems else []),
        *([f"![acceptance and speedup against temperature]({plot.name})", ""] if plot else []),
        "## Each temperature's report", "",
        *[f"- T={r.temperature:g}: [{r.report}/report.md]({r.report}/report.md) ({r.results.status})" for r in runs],
        ""])
    md = write_atomic(out / "temperature.md", text)
    return {"json": out / "temperature.json", "markdown": md, **({"plot": plot} if plot else {})}
