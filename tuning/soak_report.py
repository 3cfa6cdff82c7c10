"""What a soak run shows: each drafter's last requests against its first, and the report.

A drafter's run is judged on two windows of `window` requests in the order they were sent, the
first and the last (`judge`, the figures `FIGURES`): a figure of the last window more than
`tolerance` away from the first's (either way) DRIFTS, and a run with failed requests does not
pass either. Beside them, not judged, what the engine counted over each window (`ENGINE_FIGURES`):
they say whose a latency drift is, the drafter's when its acceptance moved, the engine's (or the
machine's) when acceptance held and each step got slower. The method: docs/drafters.md, `make soak`.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.reports import page
from loadtest.reports import plots
from loadtest.measurement.records import RequestRecord
from loadtest.measurement.serial import Serial
from loadtest.reports.markdown import table as markdown_table
from loadtest.files import write_atomic
from loadtest.reports.page import METHOD_DOC, Badge, Line, Page, Section, method_link
from loadtest.reports.report import embedded
from loadtest.measurement.stats import percentile

GIB = 2**30
FIGURES: dict[str, str] = {
    "rss_mean_gib": "RSS mean (GiB)",
    "rss_end_gib": "RSS at the window's end (GiB)",
    "e2e_mean_ms": "e2e mean (ms)",
    "tpot_p50_ms": "TPOT p50 (ms)",
    "ttft_p50_ms": "TTFT p50 (ms)",
}
"""The judged figures (fields of `WindowFigures`), as the report names them."""
SHORT = {"rss_mean_gib": "RSS mean", "rss_end_gib": "RSS at end", "e2e_mean_ms": "e2e mean",
         "tpot_p50_ms": "TPOT p50", "ttft_p50_ms": "TTFT p50"}

Sample = Sequence[float]
"""One RSS sample: [epoch seconds, resident bytes of the process tree, processes in it]."""
EngineSample = Sequence[float]
"""One /metrics scrape: [epoch seconds, drafts, draft tokens, accepted tokens (counters), the per-token
latency histogram's sum (s) and count, requests running (a gauge)]."""
ENGINE_FIGURES: dict[str, str] = {
    "acceptance_rate": "draft acceptance (engine, not judged)",
    "engine_tpot_mean_ms": "per-token latency mean (engine, not judged)",
    "running_mean": "requests running (engine, not judged)",
}


@dataclass
class WindowFigures(Serial):
    """One window of requests (`window_figures`): the judged figures (`FIGURES`), the engine's
    (`ENGINE_FIGURES`) and the load it offered."""

    requests: int = 0
    failed: int = 0
    start: float = 0.0
    end: float = 0.0
    arrivals_per_s: float | None = None
    """The load the window offered (not judged): the same in both when the last window replays the first's gaps."""
    rss_mean_gib: float | None = None
    rss_end_gib: float | None = None
    e2e_mean_ms: float | None = None
    tpot_p50_ms: float | None = None
    ttft_p50_ms: float | None = None
    acceptance_rate: float | None = None
    engine_tpot_mean_ms: float | None = None
    running_mean: float | None = None


@dataclass
class Judgement(Serial):
    """A drafter's run judged (`judge`): its first and last windows, each judged figure's change."""

    requests: int = 0
    failed: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    window: int = 0
    tolerance: float = 0.0
    problems: list[str] = field(default_factory=list)
    first: WindowFigures | None = None
    last: WindowFigures | None = None
    change: dict[str, float | None] = field(default_factory=dict)
    """By judged figure (`FIGURES`): last / first - 1 (None: not measured)."""
    drifts: list[str] = field(default_factory=list)
    status: str = "failed"
    """`ok` (every figure within the tolerance, no request failed), `drifts` (a figure beyond it) or
    `failed` (requests failed, or too few finished to fill two windows)."""

    def pair(self, key: str) -> list[Any]:
        """A `WindowFigures` field in the first window and the last (None where not judged)."""
        return [None if w is None else getattr(w, key) for w in (self.first, self.last)]

    def changes(self, sep: str, keys: Sequence[str] | None = None) -> str:
        """Each judged figure's change (of `keys` alone where given: the drifts)."""
        return sep.join(f"{SHORT[k]} {_pct(self.change[k])}" for k in (self.change if keys is None else keys))


@dataclass
class SoakSeries(Serial):
    """What the plots draw (`series`): times in seconds from `t0` (epoch seconds), latencies of each
    request in send order (None: it failed)."""

    t0: float = 0.0
    rss: list[list[float]] = field(default_factory=list)
    """[seconds, resident bytes, processes] per sample."""
    e2e_ms: list[float | None] = field(default_factory=list)
    ttft_ms: list[float | None] = field(default_factory=list)
    tpot_ms: list[float | None] = field(default_factory=list)
    engine: list[list[float]] = field(default_factory=list)
    """The /metrics scrapes (`EngineSample`), seconds from `t0`."""


@dataclass
class DrafterSoak(Serial):
    """One drafter's soak (`soak._Run.soak`): how it ran and its judgement, or the error that stopped it."""

    drafter: str = ""
    overrides: list[str] | None = None
    startup_s: float | None = None
    rate: float | None = None
    """Requests per second offered."""
    probe_requests_per_s: float | None = None
    rate_source: str | None = None
    run_s: float | None = None
    processes: int | None = None
    """The most processes in the server's tree at a sample."""
    verdict: Judgement | None = None
    series: SoakSeries | None = None
    error: str | None = None
    wall_s: float | None = None

    @property
    def judged(self) -> bool:
        """Measured, and enough requests finished to fill both windows."""
        return not self.error and self.verdict is not None and self.verdict.first is not None

    @property
    def passed(self) -> bool:
        return not self.error and self.verdict is not None and self.verdict.status == "ok"


@dataclass
class SoakMeta(Serial):
    """How the soak ran (`soak.soak`'s settings)."""

    config: str | None = None
    requests: int = 0
    window: int = 0
    tolerance: float = 0.0
    max_tokens: int = 0
    workload: str = ""
    prompts: int = 0
    temperature: float = 0.0
    seed: int = 0
    warmup: int | None = None
    sample_every_s: float = 0.0
    metrics_every_s: float | None = None
    rate_rule: str = ""
    repeat_head: int | None = None
    """Arrivals at the end that repeat the first's gaps and prompts."""
    machine: str = ""
    date: str = ""


@dataclass
class SoakReport(Serial):
    """soak.json: the settings and each drafter's soak."""

    meta: SoakMeta = field(default_factory=SoakMeta)
    drafters: list[DrafterSoak] = field(default_factory=list)


def in_send_order(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """Open loop: by place in the arrival schedule (a request never sent has one too); else by start."""
    return sorted(records, key=lambda r: (r.arrival is None, r.arrival or 0, r.start))


def rss_at(samples: Sequence[Sample], when: float) -> float | None:
    """The first sample taken at or after `when` (the last one if none was)."""
    if not samples:
        return None
    return next((s[1] for s in samples if s[0] >= when), samples[-1][1])


def rss_mean(samples: Sequence[Sample], start: float, end: float) -> float | None:
    """Mean of the samples taken in [start, end]; a window shorter than the sampling interval
    may hold none: then the sample at its end."""
    inside = [s[1] for s in samples if start <= s[0] <= end]
    return statistics.fmean(inside) if inside else rss_at(samples, end)


def engine_figures(engine: Sequence[EngineSample], start: float, end: float
                   ) -> tuple[float | None, float | None, float | None]:
    """What the engine counted (`ENGINE_FIGURES`, in order) between the last scrape at or before `start`
    and the first at or after `end` (the scrapes nearest the window, when none lies outside it); None
    without two scrapes."""
    if len(engine) < 2:
        return None, None, None
    before = next((e for e in reversed(engine) if e[0] <= start), engine[0])
    after = next((e for e in engine if e[0] >= end), engine[-1])
    running = [e[6] for e in engine if before[0] <= e[0] <= after[0]]
    return *_between(before, after), statistics.fmean(running) if running else None


def _between(a: EngineSample, b: EngineSample) -> tuple[float | None, float | None]:
    """Draft acceptance and the engine's mean per-token latency (ms) between two scrapes (None: nothing counted)."""
    drafted, observed = b[2] - a[2], b[5] - a[5]
    return ((b[3] - a[3]) / drafted if drafted > 0 else None,
            1000 * (b[4] - a[4]) / observed if observed > 0 else None)


def window_figures(window: Sequence[RequestRecord], samples: Sequence[Sample], end_rss: float | None,
                   engine: Sequence[EngineSample] = ()) -> WindowFigures:
    """One window's figures: RSS the mean of the samples taken while its requests ran and `end_rss`
    (the sample at its end), latencies over its successful requests."""
    ok = [r for r in window if r.ok]
    start, end = min(r.start for r in window), max(r.end for r in window)
    mean = rss_mean(samples, start, end)

    def ms(values: list[float], p: float | None = None) -> float | None:
        if not values:
            return None
        return 1000 * (statistics.fmean(values) if p is None else percentile(values, p))

    sent = sorted(r.planned_start or r.start for r in window)
    acceptance, engine_tpot, running = engine_figures(engine, start, end)
    return WindowFigures(
        requests=len(window), failed=len(window) - len(ok), start=start, end=end,
        arrivals_per_s=(len(sent) - 1) / (sent[-1] - sent[0]) if sent[-1] > sent[0] else None,
        rss_mean_gib=None if mean is None else mean / GIB,
        rss_end_gib=None if end_rss is None else end_rss / GIB,
        e2e_mean_ms=ms([r.e2e_s for r in ok if r.e2e_s is not None]),
        tpot_p50_ms=ms([r.per_token_latency_s for r in ok if r.per_token_latency_s is not None], 50),
        ttft_p50_ms=ms([r.ttft_s for r in ok if r.ttft_s is not None], 50),
        acceptance_rate=acceptance, engine_tpot_mean_ms=engine_tpot, running_mean=running)


def _change(first: float | None, last: float | None) -> float | None:
    return last / first - 1 if first and last is not None else None


def judge(records: Sequence[RequestRecord], samples: Sequence[Sample], window: int, tolerance: float,
          expected: int | None = None, engine: Sequence[EngineSample] = ()) -> Judgement:
    """The first and the last `window` requests' figures (and the engine's, from the scrapes
    `engine`, not judged), each judged figure's change, and the verdict (`Judgement.status`)."""
    ordered = in_send_order(records)
    failed = sum(not r.ok for r in ordered)
    out = Judgement(requests=len(ordered), failed=failed, outcomes=dict(Counter(r.outcome for r in ordered)),
                    window=window, tolerance=tolerance)
    if expected and len(ordered) < expected:
        out.problems.append(f"only {len(ordered)} of {expected} requests finished")
    if failed:
        how = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in out.outcomes.items() if k != "served")
        out.problems.append(f"{failed} of {len(ordered)} requests failed ({how})")
    if len(ordered) < 2 * window:
        out.problems.append(f"{len(ordered)} requests cannot fill two windows of {window}")
        return out
    head, tail = ordered[:window], ordered[-window:]
    out.first = window_figures(head, samples, rss_at(samples, max(r.end for r in head)), engine)
    out.last = window_figures(tail, samples, samples[-1][1] if samples else None, engine)
    out.change = {k: _change(*out.pair(k)) for k in FIGURES}
    out.drifts = [k for k, c in out.change.items() if c is not None and abs(c) > tolerance]
    missing = [k for k, c in out.change.items() if c is None]
    if missing:
        out.problems.append("not measured: " + ", ".join(SHORT[k] for k in missing))
    out.status = "drifts" if out.drifts else ("failed" if failed or missing or out.problems else "ok")
    return out


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:+.1f}%"


def verdict_line(result: DrafterSoak) -> str:
    """One line per drafter: the verdict, then what it rests on."""
    name, v = result.drafter, result.verdict
    if result.error or v is None:
        return f"{name}: FAILED: {result.error}"
    tol = f"{100 * v.tolerance:g}%"
    basis = (f"last {v.window} vs first {v.window} of {v.requests} requests"
             + (f" at {result.rate:.2g}/s" if result.rate else "") + f", {v.failed} failed")
    if v.status == "drifts":
        return f"{name}: DRIFTS beyond {tol}: {v.changes(', ', v.drifts)} ({basis})"
    if v.status == "failed":
        return f"{name}: FAILED: {'; '.join(v.problems)} ({basis})"
    return f"{name}: within {tol} ({v.changes(', ')}; {basis})"


def series(records: Sequence[RequestRecord], samples: Sequence[Sample], engine: Sequence[EngineSample] = ()
           ) -> SoakSeries:
    """What the plots draw, kept in soak.json: RSS over time, each request's latencies in send order
    and the engine's scrapes."""
    ordered = in_send_order(records)
    t0 = min([r.start for r in ordered] + [s[0] for s in samples[:1]], default=0.0)

    def ms(value: float | None) -> float | None:
        return None if value is None else round(1000 * value, 2)

    return SoakSeries(t0=t0, rss=[[round(s[0] - t0, 2), int(s[1]), int(s[2])] for s in samples],
                      e2e_ms=[ms(r.e2e_s) if r.ok else None for r in ordered],
                      ttft_ms=[ms(r.ttft_s) if r.ok else None for r in ordered],
                      tpot_ms=[ms(r.per_token_latency_s) if r.ok else None for r in ordered],
                      engine=[[round(e[0] - t0, 2), *e[1:]] for e in engine])


def rolling_mean(values: Sequence[float | None], width: int) -> list[float | None]:
    """At each index, the mean of the values of the last `width` requests that have one."""
    out: list[float | None] = []
    for i in range(len(values)):
        kept = [v for v in values[max(0, i - width + 1):i + 1] if v is not None]
        out.append(statistics.fmean(kept) if kept else None)
    return out


def plot(result: DrafterSoak, path: Path) -> Path | None:
    """RSS over time and rolling latencies over request index, the two windows shaded."""
    s, v, name = result.series, result.verdict, result.drafter
    if not s or not s.e2e_ms or v is None:
        return None
    plt = plots.pyplot()

    window = v.window
    width = max(window // 10, 1)
    engine = s.engine
    fig, axes = plt.subplots(1, 3 if len(engine) > 2 else 2, figsize=(16.5 if len(engine) > 2 else 11, 4))
    mem, lat = axes[0], axes[1]
    if s.rss:
        mem.plot([r[0] / 60 for r in s.rss], [r[1] / GIB for r in s.rss], "-", color="C0")
    for key, w, color in (("first", v.first, "C2"), ("last", v.last, "C3")):
        if w is not None:
            mem.axvspan((w.start - s.t0) / 60, (w.end - s.t0) / 60, color=color, alpha=0.12, label=f"{key} {window}")
    mem.set(title=f"{name}: resident memory of the server's processes", xlabel="minutes", ylabel="RSS (GiB)")
    n = len(s.e2e_ms)
    for values, label, color in ((s.e2e_ms, "e2e", "C0"), (s.ttft_ms, "TTFT", "C1"), (s.tpot_ms, "TPOT", "C4")):
        lat.plot(range(n), rolling_mean(values, width), "-", color=color, label=f"{label} (mean of {width})")
    lat.axvspan(0, min(window, n), color="C2", alpha=0.12)
    lat.axvspan(max(n - window, 0), n, color="C3", alpha=0.12)
    lat.set_yscale("log")
    lat.set(title=f"{name}: latency over the run", xlabel="request (in send order)", ylabel="ms")
    if len(engine) > 2:
        _plot_engine(axes[2], name, engine)
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    plots.save(fig, path, dpi=100)
    return path


def engine_intervals(engine: Sequence[EngineSample], span_s: float = 60.0) -> list[tuple[float, float | None, float | None]]:
    """(middle, acceptance rate, engine per-token mean in ms) over consecutive spans of about
    `span_s` seconds between scrapes: the engine's figures over time."""
    out, begin = [], 0
    for i in range(1, len(engine)):
        if engine[i][0] - engine[begin][0] >= span_s or i == len(engine) - 1:
            a, b = engine[begin], engine[i]
            out.append(((a[0] + b[0]) / 2, *_between(a, b)))
            begin = i
    return out


def _plot_engine(ax: Any, name: str, engine: Sequence[EngineSample]) -> None:
    """Acceptance (left axis) and the engine's per-token latency (right axis) per minute of the run."""
    spans = engine_intervals(engine)
    minutes = [t / 60 for t, _, _ in spans]
    ax.plot(minutes, [a for _, a, _ in spans], "-", color="C2", label="draft acceptance")
    ax.set(title=f"{name}: what the engine counted", xlabel="minutes", ylabel="acceptance rate")
    right = ax.twinx()
    right.plot(minutes, [ms for _, _, ms in spans], "-", color="C4", label="per-token latency (engine)")
    right.set_ylabel("ms")
    right.legend(fontsize=8, loc="lower right")


def slug(name: str) -> str:
    return name.replace(" ", "-").replace("(", "").replace(")", "")


def _fmt(key: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if key.startswith("rss") else f"{value:.1f}"


def _drafter_body(r: DrafterSoak, window: int, plots: dict[str, str]) -> str:
    """One drafter's evidence: how its run went, the two windows side by side and its plot."""
    v = r.verdict
    if r.error or v is None:
        return f"Failed: {r.error}"
    lines = [f"- {verdict_line(r)}", "",
             f"Rate {r.rate:.2f} requests/s ({r.rate_source}); server start {r.startup_s:.0f} s; "
             f"the run took {r.run_s / 60:.1f} min; {v.requests} requests, {v.failed} failed; "
             f"{r.processes} processes in the server's tree."
             + (" Problems: " + "; ".join(v.problems) + "." if v.problems else ""), ""]
    if v.first is not None:
        lines += [markdown_table(["figure", f"first {window}", f"last {window}", "change", ""], _window_rows(v),
                                 align="lrrrl"), ""]
    if r.drafter in plots:
        lines += [f"![{r.drafter}]({plots[r.drafter]})", ""]
    return "\n".join(lines)


def _method(meta: SoakMeta) -> str:
    window = meta.window
    return (f"{meta.requests} requests per drafter, open loop (Poisson arrivals, seed {meta.seed}) at each "
            f"drafter's rate" + (f"; the last {meta.repeat_head} repeat the first {meta.repeat_head}'s gaps and "
                                 f"prompts, so both judged windows offer the same load"
                                 if meta.repeat_head else "") + f", {meta.max_tokens} output tokens each "
            f"(ignore_eos), workload `{meta.workload}` ({meta.prompts} prompts in turn, no two consecutive alike), "
            f"temperature {meta.temperature:g}; {meta.rate_rule}. Resident memory: RSS summed over the server's "
            f"process tree (API server, engine core, workers), sampled every {meta.sample_every_s:g} s. Each figure "
            f"of the last {window} requests (in send order) against the first {window}: within "
            f"{100 * meta.tolerance:g}% either way, or DRIFTS. Latencies over the window's successful requests; RSS "
            f"mean over the samples taken while its requests ran, RSS at the end: the sample after the first window's "
            f"last response, and the final one." + (f" Not judged: what the engine counted over each window (its "
                                                    f"/metrics, scraped every {meta.metrics_every_s:g} s): draft "
                                                    f"acceptance, its own per-token latency, requests running; they "
                                                    f"say whether a drift is the drafter's or the steps'."
                                                    if meta.metrics_every_s else "")
            + f" {meta.machine}; {meta.date}.")


def _line(r: DrafterSoak, tolerance: float) -> Line:
    v = r.verdict
    if r.error or v is None:
        return Line(r.drafter, "not measured", r.error or "")
    changes = v.changes(" · ")
    accept = v.pair("acceptance_rate")
    if None not in accept:
        changes += f" · acceptance {accept[0]:.0%} → {accept[1]:.0%}"
    basis = f"{v.requests} requests" + (f" at {r.rate:.2g}/s" if r.rate else "") + f", {v.failed} failed"
    if v.status == "drifts":
        return Line(r.drafter, f"DRIFTS: {v.changes(', ', v.drifts)}", f"{changes} · {basis}", "bad")
    if v.status == "failed":
        return Line(r.drafter, "FAILED", "; ".join(v.problems) + f" · {basis}", "bad" if v.first is not None else "none")
    return Line(r.drafter, f"within {100 * tolerance:g}%", f"{changes} · {basis}", "good")


def summary_plot(soak: SoakReport, path: Path) -> Path | None:
    """The first screen's picture: each drafter's change of every judged figure (last window against
    the first), the tolerance band shaded; a bar outside it drifts."""
    judged = [r for r in soak.drafters if not r.error and r.verdict and r.verdict.change]
    if not judged:
        return None
    plt = plots.pyplot()

    tol = 100 * soak.meta.tolerance
    fig, ax = plt.subplots(figsize=(6.4, 4.3), dpi=100)
    keys = list(FIGURES)
    height = 0.8 / len(keys)
    for i, key in enumerate(keys):
        ys = [j + (i - (len(keys) - 1) / 2) * height for j in range(len(judged))]
        xs = [100 * (r.verdict.change.get(key) or 0.0) for r in judged]
        ax.barh(ys, xs, height=height, color=f"C{i}", label=SHORT[key])
        ax.plot(xs, ys, "|", color=f"C{i}", ms=8)  # a figure that did not move is a tick at 0, not nothing
    ax.axvspan(-tol, tol, color="green", alpha=0.08)
    for x in (-tol, tol):
        ax.axvline(x, color="green", lw=1, ls="--")
    ax.axvline(0, color="black", lw=1)
    ax.set_yticks(range(len(judged)))
    ax.set_yticklabels([r.drafter for r in judged], fontsize=10)
    ax.invert_yaxis()
    ax.set_xlabel(f"last window against the first, % (within ±{tol:g}%: green band)", fontsize=10)
    ax.set_title("Soak: how far each figure moved", fontsize=12)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    plots.save(fig, path)
    return path


SUMMARY = "soak-summary.png"


def first_page(soak: SoakReport, plots: dict[str, str], summary: str | None, out: Path | None = None) -> Page:
    """soak.md and soak.html: a verdict line per drafter and the summary picture first."""
    meta, drafters = soak.meta, soak.drafters
    missing = [r.drafter for r in drafters if not r.judged]
    lead = (f"Incomplete: {', '.join(missing)} could not be judged ({len(drafters) - len(missing)} of "
            f"{len(drafters)} drafters measured)." if missing else "")
    badges = []
    for r in drafters:
        v = r.verdict or Judgement()
        if r.error:
            badges.append(Badge("FAILED", f"{r.drafter}: {r.error}"[:90], slug(r.drafter)))
        elif v.status == "drifts":
            badges.append(Badge("DRIFT", f"{r.drafter}: " + ", ".join(SHORT[k] for k in v.drifts), slug(r.drafter)))
        elif v.problems:
            badges.append(Badge("FLAG", f"{r.drafter}: {'; '.join(v.problems)}"[:90], slug(r.drafter)))
    setup = (f"**Setup.** Each drafter on the embedded default: {meta.requests} requests open loop, "
             f"{meta.max_tokens} output tokens, workload `{meta.workload}`, temperature {meta.temperature:g}; "
             f"{meta.rate_rule}; the last {meta.window} requests judged against the first {meta.window}, "
             f"within {100 * meta.tolerance:g}%. {meta.machine}; {meta.date}. Method: "
             f"{method_link('long-runs-make-soak', out, METHOD_DOC.parent / 'drafters.md')}.")
    sections = [Section(slug(r.drafter), r.drafter, _drafter_body(r, meta.window, plots)) for r in drafters]
    sections.append(Section("method", "How the soak ran", _method(meta)))
    return Page(title="Soak: each drafter on the embedded default", lines=[_line(r, meta.tolerance) for r in drafters],
                setup=setup, picture=summary, picture_alt="Change of each judged figure by drafter", lead=lead,
                badges=badges, sections=sections)


def exit_code(soak: SoakReport) -> int:
    """0: every drafter within the tolerance, no request failed; 1: a drafter drifts or failed
    requests (the soak's verdict: not stable); 3: a drafter could not be measured or judged (its
    server did not start, too few requests finished to fill two windows, a figure not measured)."""
    if any(not r.judged or None in r.verdict.change.values() for r in soak.drafters):
        return 3
    return 0 if all(r.passed for r in soak.drafters) else 1


def write(soak: SoakReport | dict[str, Any], out: Path) -> dict[str, Path]:
    """soak.json, the plots, soak.md and a self-contained soak.html (plots embedded) in `out`; `soak`
    may be a stored soak.json's content."""
    soak = SoakReport.from_json(soak)
    out.mkdir(parents=True, exist_ok=True)
    saved = soak.save(out / "soak.json")
    plotted = {r.drafter: plot(r, out / f"soak-{slug(r.drafter)}.png") for r in soak.drafters if not r.error}
    files = {name: path for name, path in plotted.items() if path}
    summary = SUMMARY if summary_plot(soak, out / SUMMARY) else None
    text = page.markdown(first_page(soak, {k: p.name for k, p in files.items()}, summary, out))
    sources = embedded([*files.values(), *([out / SUMMARY] if summary else [])])
    html = page.html(first_page(soak, {k: sources[p.name] for k, p in files.items()}, summary, out), sources)
    return {"json": saved, "markdown": write_atomic(out / "soak.md", text), "html": write_atomic(out / "soak.html", html)}


def _window_rows(v: Judgement) -> list[list[str]]:
    """The soak table's rows: each judged figure, failures, the engine's figures and the load offered,
    first window against last."""
    rows = []
    for key, title in FIGURES.items():
        change = v.change[key]
        mark = "DRIFTS" if key in v.drifts else ("within" if change is not None else "n/a")
        rows.append([title, *(_fmt(key, x) for x in v.pair(key)), _pct(change), mark])
    rows.append(["failed requests", *map(str, v.pair("failed")), "", ""])
    for key, title in ENGINE_FIGURES.items():
        pair = v.pair(key)
        if pair != [None, None]:
            rows.append([title, *("n/a" if x is None else f"{x:.3g}" for x in pair), _pct(_change(*pair)), ""])
    rates = v.pair("arrivals_per_s")
    rows.append(["arrivals/s (the load offered, not judged)", *("n/a" if x is None else f"{x:.2f}" for x in rates), "", ""])
    return rows
