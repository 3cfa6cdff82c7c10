"""Two or more sweep reports side by side (`make compare REPORTS='a b ...'`): a table of the
verdicts and speedups at every batch size (or rate) and an overlaid speedup plot, written as
compare.md and a self-contained compare.html.

Runs that measured different work cannot be compared: reports whose workload, temperature or
output length differ are refused unless told (`--allow-different`). What else differs (machine,
vLLM, commit, config, speculative configs, repeats) is said, not refused: that is usually what the
comparison is for (before and after `make distill`, two CPUs, two vLLM versions).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from loadtest.reports import markdown
from loadtest.reports import page
from loadtest.reports import plots
from loadtest.files import write_atomic
from loadtest.reports.page import Badge, Line, Page, Section
from loadtest.measurement.derive import derive_rates, summarize_speedups, verdict_rule
from loadtest.measurement.results import SweepResults
from loadtest.measurement.figures import ContentSummary, Interval
from loadtest.reports.markdown import interval_text
from loadtest.reports.report import embedded, text_table
from loadtest.reports.sweep_plots import error_bars
from loadtest.reports.sweep_summary import by_rate, loop_text, mean_of, rate_contents, verdict_word

MUST_MATCH = {"workload": "workload", "temperature": "temperature", "max_tokens": "output length (max_tokens)",
              "fixed_length": "fixed output length"}
"""Settings that change the work measured: a speedup under one is not comparable with one under another."""


class Incomparable(ValueError):
    """The reports measured different work (`MUST_MATCH`)."""


def load(folder: Path) -> SweepResults:
    """A sweep's results (results.json in `folder`); a clear error for anything else (no results.json
    here; `SweepResults.load`: not a load test's results.json)."""
    path = folder / "results.json" if folder.is_dir() else folder
    if not path.is_file():
        hint = " (a capacity report: compare its capacity.md instead)" if (folder / "capacity.json").is_file() else ""
        raise ValueError(f"{folder}: no results.json{hint}")
    return SweepResults.load(path)


def _describe(results: SweepResults, what: str) -> str:
    m, s = results.machine or {}, results.settings
    if what == "machine":
        return f"{m.get('cpus')} CPUs, {m.get('platform')}"
    if what == "vLLM":
        return str(m.get("vllm"))
    if what == "commit":
        return str(m.get("commit") or "not recorded")
    if what == "config":
        return str(results.config)
    if what == "speculation":
        return "; ".join(f"{v.name} {v.speculative_config or 'off'}" for v in results.variants
                         if v.name != "baseline") or "none"
    if what == "repeats":
        return str(s.get("repeat"))
    if what == "load":
        return loop_text(s)
    return str(s.get(what))


SAID = ("machine", "vLLM", "commit", "config", "speculation", "repeats", "load")
"""What may differ and is said."""


def differences(runs: list[tuple[str, SweepResults]]) -> tuple[list[str], list[str]]:
    """(refusing, said): what differs between the reports, as lines 'what: a (name), b (name)'."""
    def line(title: str, values: list[str]) -> str:
        return f"{title}: " + ", ".join(f"{v} ({name})" for v, (name, _) in zip(values, runs))

    refusing = []
    for key, title in MUST_MATCH.items():
        values = [r.settings.get(key) for _, r in runs]
        if len({repr(v) for v in values}) > 1:
            refusing.append(line(title, [str(v) for v in values]))
    said = []
    for what in SAID:
        values = [_describe(r, what) for _, r in runs]
        if len(set(values)) > 1:
            said.append(line(what, values))
    return refusing, said


HEADER = ["level", "variant", "report", "speedup (95%)", "verdict", "acceptance", "runs"]


@dataclass(frozen=True)
class Row:
    """One (level, variant, report) of the side-by-side table (`rows`)."""

    level: float
    unit: str
    """`batch` (closed loop) or `req/s` (open loop)."""
    variant: str
    report: str
    speedup: Interval
    verdict: str
    acceptance: float | None
    runs: int
    content: ContentSummary | None

    @property
    def where(self) -> str:
        return f"{self.level:g} req/s" if self.unit == "req/s" else f"batch {self.level}"


def rows(runs: list[tuple[str, SweepResults]]) -> list[Row]:
    """One row per (level, variant, report): the speedup's mean and interval, the verdict, the acceptance."""
    out = []
    for name, results in runs:
        for e in summarize_speedups(results):
            out.append(Row(e.concurrency, "batch", e.variant, name, e.speedup, e.verdict.split(";")[0].split(" (")[0],
                           e.acceptance_rate.mean, e.runs, e.content))
        contents = rate_contents(results)
        for (variant, rate), group in by_rate(r for r in derive_rates(results)
                                              if r.variant != "baseline" and r.tpot_p50_speedup):
            m = mean_of(group, lambda r: r.tpot_p50_speedup)
            accepts = [r.acceptance for r in group if r.acceptance is not None]
            out.append(Row(rate, "req/s", variant, name, m, verdict_rule(m),
                           sum(accepts) / len(accepts) if accepts else None, len(group), contents.get((variant, rate))))
    return sorted(out, key=lambda r: (r.unit, r.level, r.variant, [n for n, _ in runs].index(r.report)))


def _cells(r: Row) -> list[str]:
    """A row's cells in the page's table (the terminal's names the level its own way)."""
    return [f"{r.level:g} {r.unit}", r.variant, r.report, interval_text(r.speedup), r.verdict,
            "-" if r.acceptance is None else f"{r.acceptance:.0%}", str(r.runs)]


def plot(table: list[Row], path: Path) -> Path | None:
    """Every report's speedup by level on one axis, each with its 95% interval, the 1.0 line."""
    pts = [r for r in table if r.speedup.mean is not None]
    if not pts:
        return None
    fig, ax = plots.speedup_axes()
    series = list(dict.fromkeys((r.report, r.variant, r.unit) for r in pts))
    several_variants = len({s[1] for s in series}) > 1
    levels = sorted({r.level for r in pts})
    for j, (report, variant, unit) in enumerate(series):
        mine = sorted((r for r in pts if (r.report, r.variant, r.unit) == (report, variant, unit)),
                      key=lambda r: r.level)
        # Reports side by side at one level: a small offset (in log x) keeps their intervals apart.
        shift = 1.0 + 0.04 * (j - (len(series) - 1) / 2)
        ms = [r.speedup for r in mine]
        ax.errorbar([r.level * shift for r in mine], [m.mean for m in ms], yerr=error_bars(ms), fmt="o-", capsize=4,
                    color=f"C{j}", lw=2, label=report + (f": {variant}" if several_variants else ""))
    unit = series[0][2]
    plots.finish_speedup_axes(ax, levels, "batch size (concurrent requests)" if unit == "batch" else "arrival rate, req/s",
                              "Speedup over the baseline, report by report (95% intervals)")
    fig.tight_layout()
    return plots.save(fig, path)


def compare(folders: list[Path], out: Path, allow_different: bool = False) -> tuple[dict[str, Path], str]:
    """Write compare.md, compare.html and compare-speedup.png for the reports in `folders` under
    `out`; return the files and the terminal's text. Raises `Incomparable` (what differs) unless
    `allow_different`, ValueError for a folder that is no sweep report."""
    if len(folders) < 2:
        raise ValueError("give two or more reports to compare side by side (one: make compare REPORT=...)")
    runs = []
    for folder in folders:
        name = folder.name if folder.is_dir() else folder.parent.name
        if any(name == n for n, _ in runs):
            name = str(folder)
        runs.append((name, load(folder)))
    refusing, said = differences(runs)
    if refusing and not allow_different:
        raise Incomparable("the reports measured different work, so their speedups are not comparable: "
                           + "; ".join(refusing) + ". Compare them anyway with --allow-different "
                           "(make compare ... ALLOW_DIFFERENT=1)")
    table = rows(runs)
    out.mkdir(parents=True, exist_ok=True)
    picture = plot(table, out / "compare-speedup.png")
    sources = embedded([picture]) if picture else {}
    first = _page(runs, table, refusing, said, picture, folders)
    files = {"markdown": write_atomic(out / "compare.md", page.markdown(first)),
             "html": write_atomic(out / "compare.html", page.html(first, sources)),
             **({"plot": picture} if picture else {})}
    text = "\n".join([*(f"DIFFERS (allowed): {d}" for d in refusing), *(f"differs: {d}" for d in said),
                      *([""] if refusing or said else []),
                      *text_table(HEADER, [[r.where, *_cells(r)[1:]] for r in table],
                                  [(r.level, r.variant) for r in table])])
    return files, text


def _page(runs: list[tuple[str, SweepResults]], table: list[Row], refusing: list[str], said: list[str],
          picture: Path | None, folders: list[Path]) -> Page:
    lines = []
    for r in table:
        word, tone = verdict_word(r.verdict, r.content)
        figures = [interval_text(r.speedup)] + ([f"acceptance {r.acceptance:.0%}"] if r.acceptance is not None else [])
        lines.append(Line(f"{r.where}, {r.report}", word,
                          " · ".join([*figures, f"{r.runs} run{'s' if r.runs != 1 else ''}"]), tone))
    first = runs[0][1]
    setup = (f"**Setup.** {len(runs)} reports: " + ", ".join(f"`{f}`" for f in folders) + f". Workload "
             f"`{first.settings.get('workload')}`, {first.settings.get('max_tokens')} output tokens, temperature "
             f"{first.settings.get('temperature')}" + (" in every report" if not refusing else " in the first") + ". "
             + ("Differs: " + "; ".join(said) + "." if said else "Machine, vLLM, commit and config: the same."))
    badges = [Badge("DIFFERENT WORK", d, "differences") for d in refusing]
    body = [_cells(r) for r in table]
    sections = [Section("table", "Side by side", markdown.table(HEADER, body)),
                Section("differences", "What differs", "\n".join(f"- {d}" for d in refusing + said) or "Nothing recorded.")]
    for name, results in runs:
        sections.append(Section(f"report-{len(sections)}", f"{name}: status {results.status}",
                                f"Config `{results.config}`, created {results.created}, machine "
                                f"{_describe(results, 'machine')}, vLLM {_describe(results, 'vLLM')}, commit "
                                f"{_describe(results, 'commit')}."))
    return Page(title="Reports side by side", lines=lines, setup=setup, lead=(
        "Different work measured (allowed by --allow-different): " + "; ".join(refusing) if refusing else ""),
        picture=picture.name if picture else None, picture_alt="Speedup by report", badges=badges, sections=sections)


def default_out() -> Path:
    return Path("reports") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
