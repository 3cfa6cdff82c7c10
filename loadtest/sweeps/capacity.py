"""Capacity at a service target: the highest request rate each variant sustains while every run
meets every target, and the rate above which speculation stops paying.

For each variant (speculation, baseline) the search brackets the capacity (from the start rate,
doubling until a rate fails, or halving while the first fails), then narrows the bracket by
bisection at the geometric midpoint until it is within the precision (15%: the lowest failing
rate at most 1.15 x the highest passing one) or the step budget is spent. Both boundary rates
are then measured `repeat` times: a rate passes only when every run at it meets every target, so
one bad run moves the boundary down. A run also fails when the load generator fell behind its
schedule or any request was refused, timed out or failed: the load asked was not the load served.

Every rate either variant visits is measured on both, with the same repeat number (the same
arrival sequence), so speculation and baseline pair up at each rate: the speedup there is the
baseline's per-token latency p50 over speculation's, and where it crosses 1.0 (interpolated on a
log scale of rate) speculation stops paying. The search stops at a variant's first failing rate,
usually below that crossover, so a scan goes on above it while speculation still pays: both
variants at rates sqrt(2) apart, until the speedup falls below 1.0 or neither variant's throughput
grows any more (both saturated: a higher rate then only lengthens the queue). After that: vLLM's benchmark beside Locust at
50% and 80% of the smaller capacity (a second opinion), and each variant at twice its capacity
for a while (overload: the server must survive, every request must end somehow).

The measurements come from a `Levels` (the sweep's servers, or anything shaped like them in the
tests); `capacity.json` is written after every level, so a crash keeps what was done. What the
levels say (pairs, speedups, the crossover, revised capacities, the headline) is read off them by
`loadtest.measurement.capacity_figures`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from loadtest import arg_types
from loadtest.measurement import slo
from loadtest.measurement.capacity_figures import (BASELINE, MemoryPeaks, Overload, Scan, SearchSettings,
                                                   SecondOpinion, VariantCapacity, crossover, paired_speedups, revised)
from loadtest.measurement.figures import FigureAgreement
from loadtest.measurement.records import OUTCOMES, SENT_OUTCOMES
from loadtest.measurement.results import CREATED_FORMAT, CapacityLevel, CapacityResults, LevelResult, Status
from loadtest.sampling import sampling

log = logging.getLogger("specdeploy.loadtest")
SCAN_STEP = math.sqrt(2)
"""Each scan rate is this times the one before."""
SATURATED = 1.05
"""A variant is saturated when its output tokens/s at a scan rate is below this times the rate before's."""
SECOND_OPINION_SHARES = (0.5, 0.8)
"""vLLM's benchmark runs beside Locust at these shares of the smaller capacity (below it: the
targets hold there, so the two clients compare a served load, not a queue)."""

Measure = Callable[[str, float, int], LevelResult]
"""measure(variant, rate, repeat) -> a rate level (see `Levels.measure`)."""


class Levels(Protocol):
    """Where the measurements come from: the sweep's running servers, or a stand-in in tests."""

    variants: list[str]

    def measure(self, variant: str, rate: float, repeat: int, *, vllm_bench: bool = False,
                duration_s: float | None = None) -> LevelResult:
        """One open-loop level of `variant` at `rate` req/s: the level (client, open_loop,
        slo, server, status, problems; with `vllm_bench`, the benchmark beside it). `repeat`
        picks the arrival sequence: the same (rate, repeat) gives every variant the same one."""
        ...

    def alive(self, variant: str) -> str | None:
        """None while the variant's server answers its health check, else why not."""
        ...


@dataclass
class CapacitySettings:
    slo: str
    """Service targets, e.g. `ttft_p95=500ms,tpot_p95=50ms` (`loadtest.measurement.slo`)."""
    start_rate: float = 0.5
    """The first rate tried, req/s: cheap to serve on most deployments, so the bracket usually grows."""
    max_rate: float | None = None
    """Never ask more than this (req/s); a variant passing here has a capacity of at least it."""
    min_rate: float = 0.01
    """Halving down stops here: below it the deployment meets the targets at no useful rate."""
    repeat: int = 2
    """Runs of each boundary rate (the highest passing, the lowest failing)."""
    precision: float = 0.15
    """Bisection stops when lowest failing <= (1 + precision) x highest passing."""
    max_steps: int = 8
    """Distinct rates a variant's search may ask for (bracketing and bisection; repeats extra)."""
    scan_steps: int = 3
    """After the search, while speculation still pays at the highest rate measured on both variants,
    both are measured at up to this many rates above it (each `SCAN_STEP` x the last, never above
    max_rate), until the speedup falls below 1.0 or both variants are saturated: this locates the
    crossover above the capacities. 0: no scan."""
    overload_s: float = 180
    """Seconds of each variant at twice its capacity after the search (0: no overload level)."""
    second_opinion: bool = True
    """vLLM's benchmark beside Locust at 50% and 80% of the smaller capacity."""

    @classmethod
    def add_cli_args(cls, parser: Any) -> None:
        """The search's options, in their own group of `--help` (--slo is the command's)."""
        search = parser.add_argument_group("the search")
        search.add_argument("--start-rate", type=arg_types.positive_float, default=cls.start_rate, metavar="R",
                            help="first rate tried, requests/s; doubled until a rate fails, halved while it fails "
                                 "(default: %(default)s)")
        search.add_argument("--max-rate", type=arg_types.positive_float, default=None, metavar="R",
                            help="never ask more than this; a variant passing here has a capacity of at least it")
        search.add_argument("--repeat", type=arg_types.positive_int, default=cls.repeat,
                            help="runs of the boundary rates (highest passing, lowest failing); a rate passes when "
                                 "every run meets every target (default: %(default)s)")
        search.add_argument("--precision", type=arg_types.share, default=cls.precision, metavar="P",
                            help="stop bisecting when lowest failing <= (1 + P) x highest passing (default: 15%%)")
        search.add_argument("--max-steps", type=arg_types.positive_int, default=cls.max_steps,
                            help="distinct rates a variant's search may ask for, repeats not counted (default: "
                                 "%(default)s)")
        search.add_argument("--scan-steps", type=int, default=cls.scan_steps, metavar="N",
                            help="rates above the search's, sqrt(2) apart, measured on both variants while "
                                 "speculation still pays, to locate the crossover (default: %(default)s; 0: none)")
        search.add_argument("--overload-s", type=float, default=cls.overload_s, metavar="S",
                            help="seconds of each variant at twice its capacity after the search (0: none; default: "
                                 "%(default)s)")
        search.add_argument("--no-second-opinion", dest="second_opinion", action="store_false",
                            help="skip vLLM's benchmark beside Locust at 50%% and 80%% of the smaller capacity")

    def check(self) -> None:
        slo.parse_targets(self.slo)
        if not self.start_rate > 0:
            raise ValueError("--start-rate must be above 0 req/s")
        if self.max_rate is not None and self.max_rate < self.start_rate:
            raise ValueError(f"--max-rate {self.max_rate:g} is below --start-rate {self.start_rate:g}")
        if not 0 < self.precision < 1:
            raise ValueError("--precision must be in (0, 1), e.g. 0.15 for 15%")
        if self.repeat < 1 or self.max_steps < 1:
            raise ValueError("--repeat and --max-steps must be at least 1")
        if self.scan_steps < 0:
            raise ValueError("--scan-steps must be 0 (no scan) or more")


def canonical(rate: float) -> float:
    """A rate rounded to 3 significant digits: the key levels pair on, and what the report shows."""
    return float(f"{rate:.3g}")


# ---------------------------------------------------------------------------------- judging a level
def judge(level: LevelResult) -> tuple[bool, str]:
    """Whether one run meets the targets, and why not: every target met, the generator on its
    schedule, and every request served (a refused, timed-out or failed one means the load asked
    was not the load served, whatever the latencies of the rest)."""
    if level.status in ("failed", "skipped"):
        return False, "not measured: " + ("; ".join(level.problems) or level.status)
    ol = level.open_loop
    if ol and ol.behind:
        achieved, reasons = ol.achieved_rate, ol.behind_reasons
        return False, "the load generator fell behind its schedule" + (
            f" ({'; '.join(reasons)})" if reasons else
            f" (achieved {achieved:.3g} of {level.rate or 0:.3g} req/s)" if achieved is not None else "")
    outcomes = ol.outcomes if ol else {}
    lost = {k: outcomes[k] for k in ("refused", "timed_out", "failed", "unsent") if outcomes.get(k)}
    if lost:
        return False, "requests not served: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in lost.items())
    client = level.client
    if client and client.failed:
        return False, f"{client.failed} of {client.requests} requests failed"
    if not level.slo or not level.ok_client:
        return False, "no request served"
    if not level.slo.met:
        missed = [f"{name} {_ms(t.value_ms)} > {_ms(t.bound_ms)} ms"
                  for name, t in level.slo.targets.items() if not t.met]
        return False, "missed " + ", ".join(missed)
    return True, "met every target"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


# ---------------------------------------------------------------------------------- the search
@dataclass
class VariantSearch:
    """One variant's search, driven only by what was measured: `propose` says what to measure next."""

    name: str
    settings: CapacitySettings
    runs: dict[float, list[bool]] = field(default_factory=dict)
    """rate -> whether each run there met the targets, in repeat order."""
    asked: list[float] = field(default_factory=list)
    """The distinct rates this variant's own search asked for (the step budget counts them)."""
    stopped: str = ""
    """Why the search ended early (its server died, an interrupt), else empty."""

    def record(self, rate: float, passed: bool) -> None:
        self.runs.setdefault(rate, []).append(passed)

    def bracket(self) -> tuple[float | None, float | None]:
        """(highest passing rate below the lowest failing one, lowest failing rate). A pass above
        a failure (noise) is ignored: the lowest failure bounds the capacity."""
        failing = [r for r, runs in self.runs.items() if not all(runs)]
        hi = min(failing) if failing else None
        passing = [r for r, runs in self.runs.items() if all(runs) and (hi is None or r < hi)]
        return (max(passing) if passing else None), hi

    def propose(self) -> tuple[float, int, bool] | None:
        """The next (rate, repeat, new) to measure, or None when the search is done; `new`: a rate
        this search has not asked for yet (`take` counts it against the step budget)."""
        if self.stopped:
            return None
        s = self.settings
        lo, hi = self.bracket()
        if hi is None and lo is None:
            rate = canonical(s.start_rate)
        elif hi is None:
            assert lo is not None
            if s.max_rate is not None and lo >= canonical(s.max_rate):
                return self._boundary(lo, None)  # at least max_rate: nothing above it is asked
            rate = canonical(min(2 * lo, s.max_rate) if s.max_rate is not None else 2 * lo)
        elif lo is None:
            rate = canonical(hi / 2)
            if rate < s.min_rate:
                return self._boundary(None, hi)
        else:
            rate = canonical(math.sqrt(lo * hi))
            if self._narrow(lo, hi):
                return self._boundary(lo, hi)
        if rate in self.runs or len(self.asked) >= s.max_steps:  # known already, or the budget is spent
            return self._boundary(lo, hi)
        return rate, 1, True

    def take(self) -> tuple[float, int] | None:
        """`propose`, with a new rate counted as one step of this search."""
        proposal = self.propose()
        if proposal is None:
            return None
        rate, repeat, new = proposal
        if new:
            self.asked.append(rate)
        return rate, repeat

    def _narrow(self, lo: float, hi: float) -> bool:
        """The bracket is within the precision (or no 3-digit rate lies inside it)."""
        return hi <= (1 + self.settings.precision) * lo or canonical(math.sqrt(lo * hi)) in (lo, hi)

    def _boundary(self, lo: float | None, hi: float | None) -> tuple[float, int, bool] | None:
        """The boundary rates' remaining repeats, then done."""
        for rate in (lo, hi):
            if rate is not None and len(self.runs.get(rate, [])) < self.settings.repeat:
                return rate, len(self.runs.get(rate, [])) + 1, False
        return None

    def result(self) -> VariantCapacity:
        """The capacity (highest passing rate), its interval and how the search ended."""
        s = self.settings
        lo, hi = self.bracket()
        if lo is None:
            status = "none passing"
        elif hi is None:
            status = "at least" if s.max_rate is not None and lo >= canonical(s.max_rate) else "open"
        else:
            status = "found" if self._narrow(lo, hi) else "budget"
        if self.stopped:
            status = "stopped"
        return VariantCapacity(variant=self.name, capacity=lo, interval=[lo, hi], status=status, steps=len(self.asked),
                               stopped=self.stopped or None, lowest_tried=min(self.runs) if self.runs else None,
                               runs={f"{r:g}": v for r, v in sorted(self.runs.items())})


def search(measure: Measure, variants: Sequence[str], settings: CapacitySettings,
           searches: dict[str, VariantSearch] | None = None) -> dict[str, VariantCapacity]:
    """Every variant's capacity. Whichever variant leads a step (they take turns), every variant
    is measured at its (rate, repeat), so each rate visited pairs them up. `measure` returns the
    level; `judge` reads it. Returns each variant's `VariantSearch.result()`."""
    searches = searches if searches is not None else {v: VariantSearch(v, settings) for v in variants}
    done: set[tuple[str, float, int]] = set()
    turn = 0
    while True:
        rotated = [*variants[turn % len(variants):], *variants[:turn % len(variants)]]
        leader = next((v for v in rotated if searches[v].propose() is not None), None)
        if leader is None:
            break
        rate, repeat = searches[leader].take()  # type: ignore[misc]
        # Who goes first flips with the repeat, as in the sweep: a steady drift cancels over pairs.
        order = list(variants) if repeat % 2 else list(reversed(variants))
        for v in order:
            if (v, rate, repeat) in done or searches[v].stopped:
                continue
            done.add((v, rate, repeat))
            passed, _ = judge(measure(v, rate, repeat))
            searches[v].record(rate, passed)
        turn += 1
    return {v: searches[v].result() for v in variants}


# ---------------------------------------------------------------------------------- memory
@dataclass
class MemoryWatch(MemoryPeaks):
    """Peak resident memory of this process and of the Locust processes it runs, sampled in an overload."""

    def sample(self) -> None:
        import psutil

        me = psutil.Process()
        self.self_peak_mib = max(self.self_peak_mib, me.memory_info().rss / 2**20)
        total, pids = 0.0, set()
        for child in me.children(recursive=True):
            try:
                if "locust" not in " ".join(child.cmdline()):
                    continue
                rss = child.memory_info().rss / 2**20
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            pids.add(child.pid)
            total += rss
            self.locust_process_peak_mib = max(self.locust_process_peak_mib, rss)
        self.locust_peak_mib = max(self.locust_peak_mib, total)
        self.locust_processes = max(self.locust_processes, len(pids))
        self.samples += 1

    def peaks(self) -> MemoryPeaks:
        """The peaks so far, to 0.1 MiB."""
        return MemoryPeaks(**{k: round(v, 1) if k.endswith("_mib") else v for k, v in self.to_json().items()})


# ---------------------------------------------------------------------------------- the whole command
class Capacity:
    """The search, the crossover, the second opinion and the overload, with `capacity.json` kept
    current after every level (`save`)."""

    def __init__(self, levels: Levels, settings: CapacitySettings, out: Path, context: dict[str, Any] | None = None):
        """`context`: what the search ran on (config, machine, traffic, request: `CapacityResults`' fields,
        as types or as capacity.json keeps them)."""
        settings.check()
        self.levels, self.settings, self.out = levels, settings, out
        variants = list(levels.variants)
        self.spec = next((v for v in variants if v != BASELINE), None)
        self.result = CapacityResults.from_json({
            "slo": settings.slo, "settings": SearchSettings(**asdict(settings)), "variants": variants,
            "spec_variant": self.spec, "created": time.strftime(CREATED_FORMAT), **(context or {})})
        self.searches = {v: VariantSearch(v, settings) for v in variants}

    def save(self) -> Path:
        return self.result.save(self.out / "capacity.json")

    def _measure(self, variant: str, rate: float, repeat: int, phase: str, **options: Any) -> CapacityLevel:
        began = time.monotonic()
        try:
            level = self.levels.measure(variant, rate, repeat, **options)
        except Exception as exc:  # noqa: BLE001 - a level that could not run fails, the search goes on
            log.exception("%s at %g req/s", variant, rate)
            level = LevelResult(status="failed", problems=[f"{type(exc).__name__}: {exc}"])
        passed, why = judge(level)
        entry = CapacityLevel.of(level, variant=variant, rate=rate, repeat=repeat, phase=phase,
                                 sequence=len(self.result.levels) + 1, wall_s=round(time.monotonic() - began, 1),
                                 meets_targets=passed, why=why)
        if not passed and level.status in ("failed", "skipped"):
            gone = self.levels.alive(variant)
            if gone:
                entry.server_gone = gone
                self.searches[variant].stopped = f"server not answering: {gone}"
        self.result.levels.append(entry)
        log.info("%s at %g req/s (run %d, %s): %s", variant, rate, repeat, phase, why)
        self.save()
        return entry

    def run(self) -> CapacityResults:
        try:
            self._search()
            self._scan()
            if self.settings.second_opinion:
                self._second_opinion()
            if self.settings.overload_s > 0:
                self._overload()
        except KeyboardInterrupt:
            self.result.status = "interrupted"
            self.result.problems.append("interrupted: the levels measured so far are kept")
            raise
        finally:
            self._conclude()
            self.save()
        return self.result

    def _search(self) -> None:
        search(lambda v, r, n: self._measure(v, r, n, "search"), self.levels.variants, self.settings, self.searches)
        self._conclude()  # the capacities found

    def _conclude(self) -> None:
        self.result.capacity = {v: s.result() for v, s in self.searches.items()}
        if self.spec and BASELINE in self.searches:
            points = self.result.speedups = paired_speedups(self.result.levels, self.spec)
            self.result.crossover = crossover([(p.rate, p.speedup) for p in points])
            self.result.crossover.e2e = crossover([(p.rate, p.e2e_speedup) for p in points])
        # Capacities a later run at a lower rate contradicts (`revised`): for programs, as the headline says them.
        self.result.revised = {v: r for v in self.result.capacity if (r := revised(self.result, v))}
        if self.result.status in ("running", "ok", "flagged"):
            self.result.status = self._status()

    def _status(self) -> Status:
        if any(c.status == "stopped" for c in self.result.capacity.values()):
            return "failed"
        flagged = self.result.problems or self.result.revised or any(
            r.agrees is False or r.error for r in self.result.second_opinion) or any(
            o.problems for o in self.result.overload.values())
        return "flagged" if flagged else "ok"

    def _scan(self) -> None:
        """Above the search's rates, both variants at rates `SCAN_STEP` apart while speculation
        still pays at the highest paired rate: ends when the speedup falls below 1.0 (the crossover
        lies below that rate), both variants are saturated, max_rate or the step budget is reached,
        or a server stops answering."""
        s = self.settings
        variants = list(self.levels.variants)
        if not self.spec or BASELINE not in self.searches or s.scan_steps <= 0:
            return
        scan = self.result.scan = Scan()
        while True:
            points = [p for p in paired_speedups(self.result.levels, self.spec) if p.speedup is not None]
            if not points:
                scan.ended = "no rate measured on both variants"
                break
            top = points[-1]
            if top.speedup < 1:  # type: ignore[operator]
                scan.ended = f"the speedup is below 1.0 at {top.rate:g} req/s"
                break
            if scan.saturated_at is not None:
                scan.ended = f"both variants saturated at {scan.saturated_at:g} req/s"
                break
            if any(self.searches[v].stopped for v in variants):
                scan.ended = "a server stopped answering"
                break
            if len(scan.rates) >= s.scan_steps:
                scan.ended = f"{s.scan_steps} scan rates measured (--scan-steps)"
                break
            rate = canonical(SCAN_STEP * top.rate)
            if s.max_rate is not None and rate > canonical(s.max_rate):
                scan.ended = f"the next rate, {rate:g} req/s, is above --max-rate"
                break
            repeat = max(self._next_repeat(v, rate) for v in variants)
            scan.rates.append(rate)
            before = {v: self._throughput(v, top.rate) for v in variants}
            for v in (variants if repeat % 2 else list(reversed(variants))):
                self._measure(v, rate, repeat, "scan")
            after = {v: self._throughput(v, rate) for v in variants}
            if all(before[v] and after[v] and after[v] < SATURATED * before[v] for v in variants):  # type: ignore[operator]
                scan.saturated_at = top.rate
        self._conclude()
        self.save()

    def _throughput(self, variant: str, rate: float) -> float | None:
        """Mean output tokens/s of the variant's served runs at `rate` (overload levels aside)."""
        figures = [c.output_tokens_per_s for lv in self.result.levels
                   if lv.variant == variant and lv.rate == rate and lv.phase != "overload"
                   and (c := lv.ok_client) and c.output_tokens_per_s]
        return sum(figures) / len(figures) if figures else None

    def _next_repeat(self, variant: str, rate: float) -> int:
        """A repeat number not used at this rate yet (each run its own files and arrivals)."""
        used = [lv.repeat for lv in self.result.levels if lv.rate == rate and lv.variant == variant]
        return max(used, default=0) + 1

    def _second_opinion(self) -> None:
        cap = min((c.capacity for c in self.result.capacity.values() if c.capacity is not None), default=None)
        if cap is None:
            self.result.problems.append("second opinion skipped: no variant met the targets at any rate")
            return
        for share in SECOND_OPINION_SHARES:
            rate = canonical(share * cap)
            repeat = max(self._next_repeat(v, rate) for v in self.levels.variants)
            for v in self.levels.variants:
                if self.searches[v].stopped:
                    continue
                level = self._measure(v, rate, repeat, "second opinion", vllm_bench=True)
                self.result.second_opinion.append(second_opinion_row(level, share))

    def _overload(self) -> None:
        for v in self.levels.variants:
            # Twice the capacity every run allows: the search's, or the revised one (`revised`).
            cap = (revised(self.result, v) or self.result.capacity[v]).capacity
            if cap is None or self.searches[v].stopped:
                why = "no capacity found" if cap is None else self.searches[v].stopped
                self.result.overload[v] = Overload(skipped=why)
                continue
            rate = canonical(2 * cap)
            watch = MemoryWatch()
            with sampling(watch.interval_s, watch.sample, "memory-watch"):
                level = self._measure(v, rate, self._next_repeat(v, rate), "overload",
                                      duration_s=self.settings.overload_s)
            gone = self.levels.alive(v)
            self.result.overload[v] = overload_summary(level, gone, watch.peaks(), self.settings.overload_s)
            self.save()


def second_opinion_row(level: CapacityLevel, share: float) -> SecondOpinion:
    """Locust against vLLM's benchmark in one level, figure by figure (`second_opinion.compare`'s verdicts)."""
    agreement = level.vllm_bench_agreement
    figures = {k: FigureAgreement(locust=a.locust, vllm_bench=a.vllm_bench, tolerance=a.tolerance, agrees=a.agrees,
                                  difference=a.difference if a.difference_adjusted is None else a.difference_adjusted)
               for k, a in (agreement.figures() if agreement else {}).items()}
    return SecondOpinion(variant=level.variant, rate=level.rate, share=share, figures=figures,
                         agrees=agreement.agrees if agreement else None,
                         error=level.vllm_bench.error if level.vllm_bench else None,
                         achieved_rate=level.open_loop.achieved_rate if level.open_loop else None)


def overload_summary(level: LevelResult, gone: str | None, memory: MemoryPeaks, duration_s: float) -> Overload:
    """What an overload level shows: the server up after it, every request accounted for (sent ==
    served + refused + timed out + failed), and the kit's own peak memory."""
    ol = level.open_loop
    outcomes = {k: (ol.outcomes if ol else {}).get(k) for k in OUTCOMES}
    ended = sum(outcomes[k] or 0 for k in SENT_OUTCOMES)
    sent = ol.sent if ol else level.client.requests if level.client else None
    problems = []
    if gone:
        problems.append(f"the server did not survive the overload: {gone}")
    if level.status in ("failed", "skipped"):
        problems.append("the level did not finish: " + "; ".join(level.problems or [level.status]))
    if sent is None:
        problems.append("the level reports no count of sent requests")
    elif sent != ended:
        problems.append(f"{sent - ended} of {sent} sent requests have no outcome (sent {sent}, ended {ended})")
    return Overload(rate=level.rate, duration_s=duration_s, achieved_rate=ol.achieved_rate if ol else None,
                    behind=ol.behind if ol else None, sent=sent, outcomes=outcomes, accounted=sent == ended,
                    server_up_after=gone is None, server_gone=gone, memory=memory, status=level.status,
                    problems=problems)


class SweepLevels:
    """`Levels` over a sweep serving its variants (inside `Sweep.serving()`): each level is one
    `Sweep.rate_level`, with vLLM's benchmark on only where asked and an overload's length as a
    duration (the requests arriving in it at the level's rate)."""

    def __init__(self, sweep: Any):
        self.sweep = sweep
        self.variants = sweep.variants()

    def measure(self, variant: str, rate: float, repeat: int, *, vllm_bench: bool = False,
                duration_s: float | None = None) -> LevelResult:
        """One level; `duration_s`: the requests arriving in this long instead of the sweep's own
        count or duration (the sweep's settings stay as they are)."""
        return self.sweep.rate_level(variant, rate, repeat, vllm_bench=vllm_bench, duration_s=duration_s)

    def alive(self, variant: str) -> str | None:
        return self.sweep.server_health(variant)
