"""`make paymap CONFIG=... USERS=1,4,16,32`: where speculation pays, over batch size and acceptance.

For each batch size B and per-token acceptance a of a grid, output tokens/s of the config's
drafter with speculation over the same deployment without it, measured on the engine: vLLM's
synthetic acceptance runs the real drafter and the real verification and accepts draft position i
with the unconditional rate a^i (the acceptance model of Leviathan et al., `loadtest.measurement.stats`).
So the costs are the deployment's own and only acceptance is chosen: a map can be drawn before any
traffic exists, with `--dummy-weights` before the weights are downloaded. Every speculative cell
comes from one engine, its acceptance and K switched between generations (`engine_variants`), so
cells differ by what they cost, not by which engine ran faster. What the report shows and how to
read it: docs/tuning.md, `make paymap`.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from deploy import load_config, plan_from_config
from deploy.config import Override, resolve_config_path
from deploy.engine_args import engine_arguments, is_secret
from loadtest.reports import markdown
from loadtest.reports import plots
from loadtest.files import bullet_sections, write_atomic
from loadtest.sweeps.plan import ServerInfo, assumed_start_s, assumed_tokens_per_s, duration_text
from loadtest.sweeps.settings import default_out_dir
from loadtest.measurement.prom import Snapshot, delta, scrape
from loadtest.measurement.serial import Serial
from loadtest.measurement.stats import expected_tokens_per_step, implied_per_token_acceptance
from loadtest.traffic.client import auth_headers
from tuning import step_costs
from tuning.advise import PLAIN, CommandResult, drafter_config
from tuning.step_costs import PaymapJob, PaymapRun, StepCosts
from tuning.tune import SPEC, ScheduleRow, best_k, cost_variants, deployed_k, schedule_from, tuned_yaml

log = logging.getLogger("specdeploy.paymap")

DEFAULT_ACCEPTANCE = (0.3, 0.45, 0.6, 0.75, 0.9)
"""Per-token acceptance levels of the grid: from a poor draft to a very good one."""
REFERENCE_BATCH = 32
"""The batch size the report's first line quotes the break-even acceptance at."""
DUMMY_NOTE = ("Every engine loaded dummy weights (`load_format: dummy`): the models' real shapes and kernels "
              "with random values. A step costs what it costs with the real weights (the same matrix products "
              "over the same shapes), and acceptance is synthetic either way, so the map is the real weights' "
              "map; the generated text means nothing.")
SYNTHETIC_NOTE = ("Acceptance is synthetic: draft position i is accepted with probability a^i whatever the draft "
                  "says (vLLM's rejection_sample_method: synthetic). Real acceptance varies with the text and the "
                  "temperature and is not the same at every position, so read a deployment's own acceptance as "
                  "the per-token a with the same tokens per step (1 + p_1 + ... + p_K).")


@dataclass
class PaymapSettings:
    config: str
    overrides: list[str] = field(default_factory=list)
    batches: list[int] = field(default_factory=lambda: [1, 4, 16, 32])
    acceptance: list[float] = field(default_factory=lambda: list(DEFAULT_ACCEPTANCE))
    """Per-token acceptance levels a of the grid (draft position i accepted with rate a^i)."""
    ks: list[int] | None = None
    """K values to map (default: the config's num_speculative_tokens)."""
    repeats: int = 3
    """Generations per cell (and per baseline batch size); the speedup is their mean."""
    max_tokens: int = 128
    """Output tokens of every request (EOS ignored)."""
    temperature: float = 0.0
    """Temperature of the generations (0: vLLM's greedy verification path; > 0 its sampled path)."""
    dummy_weights: bool = False
    deployment_acceptance: list[float] | None = None
    """The deployment's own acceptance: one per-token a, or per-position rates as vLLM counts them."""
    url: str | None = None
    """A running deployment whose /metrics give its per-position acceptance."""
    output: Path | None = None
    """The schedule suggestion's YAML (default: in the report folder)."""
    out: Path | None = None


# --- what a map holds (paymap.json) ---------------------------------------------------------------

K0_CELL = "k0"
"""The speculative engine's cell told to draft nothing (`step_costs._paymap_cells`)."""
BEST = "best"
"""The best K's cells and break-even beside each K's (`k<K>`) in the grid."""


@dataclass
class Ratio(Serial):
    """A speedup, mean(spec) / mean(base), with its 95% interval where there are runs enough (`ratio_interval`)."""

    mean: float = 0.0
    low: float | None = None
    high: float | None = None
    n: int = 0


@dataclass
class Cell(Ratio):
    """One cell of the grid: a batch size, per-token acceptance `a` and K."""

    a: float = 0.0
    k: int = 0
    tokens_per_s: float = 0.0
    per_position: list[float | None] = field(default_factory=list)
    """The engine's own count of acceptance per draft position."""
    drafts: float = 0.0
    tokens_per_step: float = 0.0
    expected_tokens_per_step: float = 0.0


@dataclass
class Point(Serial):
    """A break-even acceptance (`crossing`): `relation` "=" where the speedup crosses 1.0 at `value`,
    "<=" where it pays at every level (`value` the lowest), ">" where at none (the highest); `low`
    and `high`: its interval's ends (`break_even`)."""

    value: float = 0.0
    relation: str = "="
    low: Point | None = None
    high: Point | None = None


@dataclass
class Baseline(Serial):
    """The plain engine at one batch size: its runs' output tokens/s and their mean."""

    tokens_per_s: float = 0.0
    runs: list[float] = field(default_factory=list)


@dataclass
class Grid(Serial):
    """The map (`build_grid`); each table by batch size (its text), the cells and break-evens then
    by K (`k<K>`) and the best K's (`best`)."""

    batches: list[int] = field(default_factory=list)
    acceptance: list[float] = field(default_factory=list)
    ks: list[int] = field(default_factory=list)
    cells: dict[str, dict[str, list[Cell]]] = field(default_factory=dict)
    """One cell per acceptance level."""
    baseline: dict[str, Baseline] = field(default_factory=dict)
    k0: dict[str, Ratio] = field(default_factory=dict)
    best: dict[str, list[Cell]] = field(default_factory=dict)
    break_even: dict[str, dict[str, Point]] = field(default_factory=dict)

    def column(self, batch: int, key: str) -> list[Cell]:
        return self.best[str(batch)] if key == BEST else self.cells[str(batch)][key]

    def point(self, batch: int, key: str = BEST) -> Point:
        return self.break_even[str(batch)][key]


@dataclass
class EngineServer(Serial):
    """One engine a map starts, with its exact arguments (secrets masked)."""

    name: str = ""
    label: str = ""
    device: str = ""
    weight_gib: float | None = None
    generations: int = 0
    engine_args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class PaymapPlan(Serial):
    """What a map starts and measures, and about how long it takes (`make_plan`)."""

    config: str = ""
    servers: list[EngineServer] = field(default_factory=list)
    starts: int = 0
    ks: list[int] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    acceptance: list[float] = field(default_factory=list)
    repeats: int = 0
    cells: int = 0
    """batch x acceptance x K, K=0 not counted (`k0_cells`)."""
    k0_cells: int = 0
    max_tokens: int = 0
    temperature: float = 0.0
    dummy_weights: bool = False
    estimated_s: float = 0.0
    machine_problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    max_batch: int = 0


@dataclass
class Deployment(Serial):
    """The deployment's own acceptance: per-token `a`, per position where given so, and its source."""

    a: float = 0.0
    per_position: list[float] | None = None
    source: str = ""


@dataclass
class MapRow(ScheduleRow):
    """A batch size's K at the deployment's acceptance, from each K's speedup interpolated there."""

    options: dict[int, float] = field(default_factory=dict)


@dataclass
class ScheduleSuggestion(Serial):
    """The K schedule at the deployment's acceptance and the config it was written to (`write_schedule`)."""

    rows: list[MapRow] = field(default_factory=list)
    schedule: list[list[int]] = field(default_factory=list)
    k: int = 0
    written_schedule: list[list[int]] | None = None
    output: str = ""


@dataclass
class PaymapResult(CommandResult):
    """A map as paymap.json holds it; `status` `mapped` or `cannot_measure`."""

    plan: PaymapPlan = field(default_factory=PaymapPlan)
    settings: dict[str, Any] = field(default_factory=dict)
    deployment: Deployment | None = None
    raw: StepCosts | None = None
    grid: Grid | None = None
    headline: str | None = None
    heatmap: str | None = None
    schedule: ScheduleSuggestion | None = None


# --- acceptance --------------------------------------------------------------------------------


def parse_acceptance(text: str) -> list[float]:
    """`0.62` (per-token a) or `0.8,0.6,0.45,0.3` (per-position rates, non-increasing), each in (0, 1]."""
    try:
        values = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ValueError(f"'{text}' is not an acceptance: give a per-token rate (0.62) or per-position rates "
                         f"(0.8,0.6,0.45)") from None
    if not values or any(not 0 < v <= 1 for v in values):
        raise ValueError(f"acceptance '{text}': every rate must lie in (0, 1]")
    if any(b > a for a, b in zip(values, values[1:])):
        raise ValueError(f"acceptance '{text}': per-position rates cannot rise (a position is reached only "
                         f"through the ones before it)")
    return values


def rates_for(a: float, k: int) -> list[float]:
    """vLLM's per-position unconditional rates for per-token acceptance a: a, a^2, ..., a^K."""
    return [a ** i for i in range(1, k + 1)]


def per_token_acceptance(rates: Sequence[float]) -> float:
    """The per-token a with the same tokens per step as these per-position rates (one rate is a itself)."""
    if len(rates) == 1:
        return float(rates[0])
    tokens = 1.0 + sum(rates)
    a = implied_per_token_acceptance(tokens, len(rates))
    if a is None:
        raise ValueError(f"per-position rates {list(rates)} give no per-token acceptance")
    return a


def acceptance_from_metrics(samples: Snapshot) -> list[float] | None:
    """Per-position acceptance (accepted at position i / drafts) since the server started, from a
    /metrics snapshot; None where the server counted no drafts."""
    rates = delta(Snapshot({}, 0.0), samples).per_position_acceptance
    # A later position can only be reached through the earlier ones; rounding aside, keep them non-increasing.
    return [min(rates[: i + 1]) for i in range(len(rates))] or None


def acceptance_from_url(url: str, api_key_env: str = "") -> list[float]:
    """A running deployment's per-position acceptance since it started."""
    rates = acceptance_from_metrics(scrape(url, headers=auth_headers(api_key_env)))
    if rates is None:
        raise ValueError(f"{url}/metrics shows no drafts (vllm:spec_decode_num_drafts_total): the server at {url} "
                         f"does not speculate or has served nothing yet")
    return rates


# --- the grid's arithmetic ---------------------------------------------------------------------

R = TypeVar("R", bound=Ratio)


def ratio_interval(spec: Sequence[float], base: Sequence[float], kind: type[R] = Ratio, **fields: Any) -> R:
    """mean(spec) / mean(base) and its 95% interval (delta method: the two means' relative standard
    errors add in quadrature; Student's t with the smaller sample's degrees of freedom), as a `kind`
    with `fields` besides. The engines are separate, so runs are not paired."""
    from scipy.stats import t

    ms, mb = statistics.fmean(spec), statistics.fmean(base)
    out = kind(mean=ms / mb, n=min(len(spec), len(base)), **fields)
    if len(spec) >= 2 and len(base) >= 2:
        rel = math.sqrt((statistics.stdev(spec) / ms) ** 2 / len(spec) + (statistics.stdev(base) / mb) ** 2 / len(base))
        half = t.ppf(0.975, min(len(spec), len(base)) - 1) * rel * ms / mb
        out.low, out.high = max(ms / mb - half, 0.0), ms / mb + half  # a speedup is never negative
    return out


def crossing(levels: Sequence[float], speedups: Sequence[float]) -> Point:
    """Where speedup over acceptance crosses 1.0: the acceptance above which every level measured
    pays, interpolated linearly between the last level that does not pay and the next; "<=" the
    lowest level (pays everywhere measured), or ">" the highest (pays nowhere measured)."""
    points = sorted(zip(levels, speedups))
    losing = [i for i, (_, s) in enumerate(points) if s < 1.0]
    if not losing:
        return Point(points[0][0], "<=")
    i = losing[-1]
    if i == len(points) - 1:
        return Point(points[-1][0], ">")
    (a0, s0), (a1, s1) = points[i], points[i + 1]
    return Point(a0 + (1.0 - s0) * (a1 - a0) / (s1 - s0), "=")


def break_even(levels: Sequence[float], cells: Sequence[Ratio]) -> Point:
    """Break-even acceptance of one batch size from its cells' speedups, with an interval: where
    the cells' upper ends cross 1.0 (lowest) and their lower ends (highest)."""
    result = crossing(levels, [c.mean for c in cells])
    if all(c.low is not None for c in cells):
        result.low = crossing(levels, [c.high for c in cells])
        result.high = crossing(levels, [c.low for c in cells])
    return result


def pays_at(point: Point, a: float) -> bool | None:
    """Whether acceptance a pays at a batch size whose break-even is `point` (None: the grid cannot say)."""
    if point.relation == "=":
        return a > point.value
    if point.relation == "<=":
        return True if a >= point.value else None
    return False if a <= point.value else None


def interpolate(levels: Sequence[float], values: Sequence[float], a: float) -> float:
    """Linear interpolation over the acceptance grid, held flat beyond its ends."""
    points = sorted(zip(levels, values))
    if a <= points[0][0]:
        return points[0][1]
    for (a0, v0), (a1, v1) in zip(points, points[1:]):
        if a <= a1:
            return v0 + (a - a0) * (v1 - v0) / (a1 - a0)
    return points[-1][1]


def schedule_rows(grid: Grid, a: float) -> list[MapRow]:
    """Per batch size, each K's speedup interpolated at acceptance a (K=0 as measured, where it was)
    and the K chosen, as `tune.schedule_from` reads them."""
    rows = []
    for batch in grid.batches:
        options = {k: interpolate(grid.acceptance, [c.mean for c in grid.column(batch, f"k{k}")], a) for k in grid.ks}
        if str(batch) in grid.k0:
            options[0] = grid.k0[str(batch)].mean
        chosen = best_k(options)
        rows.append(MapRow(batch=batch, k=chosen, predicted_speedup=options[chosen], options=options))
    return rows


def measured_cell(runs: list[PaymapRun], base: list[float], a: float, k: int, max_tokens: int) -> Cell:
    """One cell from its generations: the speedup over the baseline's runs and the engine's own acceptance."""
    drafts = sum(r.drafts for r in runs)
    counted = [sum(r.per_position[i] * r.drafts for r in runs) / drafts if drafts else None for i in range(k)]
    return ratio_interval([r.tokens_per_s for r in runs], base, Cell, a=a, k=k,
                          tokens_per_s=statistics.fmean(r.tokens_per_s for r in runs), per_position=counted,
                          drafts=drafts, expected_tokens_per_step=expected_tokens_per_step(a, k),
                          # The prefill step makes the first token, each later step one plus the accepted drafts.
                          tokens_per_step=statistics.fmean((max_tokens - 1) / max(r.steps - 1, 1) for r in runs))


def build_grid(raw: StepCosts, batches: list[int], levels: list[float], ks: list[int], max_tokens: int) -> Grid:
    """The measured engines' runs -> per batch size and K, each acceptance level's speedup (mean and
    interval), the engine's own acceptance, the best K per cell and the break-even acceptance."""
    grid = Grid(batches, levels, ks)
    for batch in batches:
        engines = raw.batches[str(batch)]
        base = [r.tokens_per_s for r in engines[PLAIN].runs or []]
        grid.baseline[str(batch)] = Baseline(statistics.fmean(base), base)
        spec = engines[SPEC].cells or {}
        per_k = {f"k{k}": [measured_cell(spec[f"a{a:g}-k{k}"], base, a, k, max_tokens) for a in levels] for k in ks}
        grid.cells[str(batch)] = per_k
        if K0_CELL in spec:
            grid.k0[str(batch)] = ratio_interval([r.tokens_per_s for r in spec[K0_CELL]], base)
        best = [per_k[f"k{best_k({k: per_k[f'k{k}'][i].mean for k in ks})}"][i] for i in range(len(levels))]
        grid.best[str(batch)] = best
        grid.break_even[str(batch)] = {**{key: break_even(levels, cells) for key, cells in per_k.items()},
                                       BEST: break_even(levels, best)}
    return grid


def headline(grid: Grid, a: float | None) -> str:
    """The report's first line."""
    batches = grid.batches
    reference = REFERENCE_BATCH if REFERENCE_BATCH in batches else batches[-1]
    needs = f"at batch {reference} it needs {describe_point(grid.point(reference))}"
    if a is None:
        return (f"This deployment's acceptance is not known (give --acceptance A or URL=): at batch {batches[0]} "
                f"speculation needs {describe_point(grid.point(batches[0]))}; {needs}.")
    verdicts = [pays_at(grid.point(batch), a) for batch in batches]
    paying = batches[:next((i for i, v in enumerate(verdicts) if v is not True), len(batches))]
    if verdicts[0] is None:
        return f"At acceptance {a:.2f} the map cannot say whether this deployment pays (outside the grid); {needs}."
    if not paying:
        return (f"At acceptance {a:.2f} this deployment pays at no batch size measured (batch {batches[0]} needs "
                f"{describe_point(grid.point(batches[0]))}); {needs}.")
    tail = " (the largest measured)" if paying[-1] == batches[-1] else ""
    return f"At acceptance {a:.2f} this deployment pays up to batch {paying[-1]}{tail}; {needs}."


def describe_point(point: Point) -> str:
    """A break-even acceptance as a person reads it, with its interval where there is one."""
    if point.relation == "<=":
        return _bound(point) + " (it pays at every acceptance measured)"
    if point.relation == ">":
        return _bound(point) + " (it pays at no acceptance measured)"
    if point.low and point.high:
        return f"{point.value:.2f} (95% interval {_bound(point.low)} to {_bound(point.high)})"
    return f"{point.value:.2f}"


def _bound(point: Point) -> str:
    if point.relation == "=":
        return f"{point.value:.2f}"
    return f"at most {point.value:.2f}" if point.relation == "<=" else f"more than {point.value:.2f}"


# --- plan, measurement, report -----------------------------------------------------------------


def engine_variants(settings: PaymapSettings, k_max: int, max_batch: int) -> dict[str, tuple[list[Override], bool]]:
    """`make tune`'s two engines (`tune.cost_variants`: K can be capped per cell as it caps it), the
    speculative one with synthetic acceptance (its starting rates are the grid's first level; the
    worker switches them)."""
    dummy = [Override("engine_args.load_format", "dummy")] if settings.dummy_weights else []
    first = [round(r, 6) for r in rates_for(settings.acceptance[0], k_max)]
    variants = cost_variants(k_max, max_batch)
    variants[SPEC][0].extend([Override("speculation.extra.rejection_sample_method", "synthetic"),
                              Override("speculation.extra.synthetic_acceptance_rates", first)])
    return {name: ([*extra, *dummy], no_spec) for name, (extra, no_spec) in variants.items()}


def make_plan(settings: PaymapSettings) -> PaymapPlan:
    """What a paymap run starts and measures, the exact engine arguments, and about how long it takes
    (assumed start times and speeds of `loadtest.sweeps.plan`: this machine may not run it)."""
    config = drafter_config(settings.config, settings.overrides, "map")
    ks = sorted(set(settings.ks or [config.speculation.num_speculative_tokens]))
    max_batch = config.resources.max_num_seqs or 256
    if max(settings.batches) > max_batch:
        raise ValueError(f"batch {max(settings.batches)} exceeds the config's resources.max_num_seqs ({max_batch})")
    plan = PaymapPlan(settings.config, ks=ks, batches=settings.batches, acceptance=settings.acceptance,
                      repeats=settings.repeats, cells=len(settings.batches) * len(settings.acceptance) * len(ks),
                      k0_cells=len(settings.batches) if len(ks) > 1 else 0, max_tokens=settings.max_tokens,
                      temperature=settings.temperature, dummy_weights=settings.dummy_weights, max_batch=max_batch)
    cells = len(settings.acceptance) * len(ks) + (1 if len(ks) > 1 else 0)
    for name, (extra, no_spec) in engine_variants(settings, max(ks), max_batch).items():
        resolved, engine = plan_from_config(settings.config, [*settings.overrides, *extra], no_spec, plan_only=True)
        plan.machine_problems += [p for p in resolved.machine_problems if p not in plan.machine_problems]
        # Preflight's memory estimates are for a server; the rest (a plumbing target, a dtype) says what ran.
        plan.notes += [n for n in resolved.notes if n not in plan.notes and not n.startswith("memory estimate")]
        weights = resolved.weight_bytes / 2 ** 30 if resolved.weight_bytes else None
        info = ServerInfo(name, name, resolved.device, 0, "", "", weight_gib=weights)
        per_batch = settings.repeats * (cells if name == SPEC else 1)
        run_s = sum(per_batch * (b * settings.max_tokens + b * 6) / assumed_tokens_per_s(resolved.device, b)
                    for b in settings.batches)
        plan.estimated_s += assumed_start_s(info) + run_s
        args = step_costs.llm_arguments(engine_arguments(resolved))
        plan.servers.append(EngineServer(
            name, "speculation off (baseline)" if no_spec else
            f"{config.speculation.drafter}, synthetic acceptance, K capped per cell", resolved.device, weights,
            len(settings.batches) * per_batch, {n: ("***" if is_secret(n) else v) for n, v in args.items()},
            {n: v for n, v in engine.env.items() if not is_secret(n)}))
    plan.starts = len(plan.servers)
    return plan


def describe_plan(plan: PaymapPlan) -> str:
    lines = [f"paymap plan for {plan.config}: {plan.starts} engine starts, one after the other",
             f"  grid: batch {','.join(map(str, plan.batches))} x per-token acceptance "
             f"{','.join(f'{a:g}' for a in plan.acceptance)} x K {','.join(map(str, plan.ks))} = {plan.cells} "
             f"cells" + (f", plus K=0 at each batch size ({plan.k0_cells})" if plan.k0_cells else "")
             + f"; {plan.repeats} generations each, {plan.max_tokens} output tokens a request, "
               f"T={plan.temperature:g}",
             f"  about {duration_text(plan.estimated_s)} (assumed start times and speeds of a "
             f"{plan.servers[0].device} machine; two engine starts)"]
    if plan.dummy_weights:
        lines.append("  dummy weights (load_format: dummy) in every engine: no weight download")
    for s in plan.servers:
        weights = f", {s.weight_gib:.1f} GiB of weights" if s.weight_gib else ""
        lines += [f"engine '{s.name}' ({s.label}; {s.device}{weights}; {s.generations} generations)",
                  "  vllm.LLM(**" + json.dumps(s.engine_args, sort_keys=True) + ")"]
        if s.env:
            lines.append("  environment: " + " ".join(f"{n}={v}" for n, v in sorted(s.env.items())))
    for p in plan.machine_problems:
        lines.append(f"this machine cannot run it: {p}")
    return "\n".join(lines)


ASYNC_NOTE = ("Both engines run with async scheduling off (as every step-cost engine: `tuning/step_costs.py`); a "
              "served plain or draft-model server overlaps scheduling with the forward pass. The two engines run "
              "one after the other; on a shared machine one engine can be ~10% faster than the next, which "
              "shifts a whole batch size's row, not the order of its cells.")


def paymap(settings: PaymapSettings) -> PaymapResult:
    """Measure the grid and write the report (paymap.json / paymap.md); its `status` is `mapped`
    or `cannot_measure`."""
    path = resolve_config_path(settings.config)
    out = settings.out or default_out_dir(f"paymap-{path.stem}")
    plan = make_plan(settings)
    own = deployment_acceptance(settings, load_config(settings.config, settings.overrides))
    result = PaymapResult(settings.config, str(out), plan=plan, deployment=own, settings={
        "overrides": settings.overrides, "repeats": settings.repeats, "max_tokens": settings.max_tokens,
        "temperature": settings.temperature, "dummy_weights": settings.dummy_weights})
    if plan.machine_problems:
        result.status, result.problems = "cannot_measure", plan.machine_problems
        return result.write("paymap", describe(result))
    job = PaymapJob(settings.acceptance, plan.ks, settings.max_tokens, settings.temperature)
    log.info("paymap %s: %d cells at batch %s, 2 engines", settings.config, plan.cells, settings.batches)
    result.raw = step_costs.measure_steps(settings.config, engine_variants(settings, max(plan.ks), plan.max_batch),
                                          tuple(settings.batches), settings.repeats, tuple(settings.overrides),
                                          paymap=job)
    result.grid = grid = build_grid(result.raw, settings.batches, settings.acceptance, plan.ks, settings.max_tokens)
    a = own.a if own else None
    result.headline = headline(grid, a)
    result.notes = [SYNTHETIC_NOTE, *([DUMMY_NOTE] if settings.dummy_weights else []), ASYNC_NOTE, *plan.notes]
    out.mkdir(parents=True, exist_ok=True)
    result.heatmap = plot_heatmap(grid, a, out / "heatmap.png")
    if len(plan.ks) > 1 and a is not None:
        result.schedule = write_schedule(settings, path, grid, a, out)
    result.status = "mapped"
    return result.write("paymap", describe(result))


def deployment_acceptance(settings: PaymapSettings, config: Any) -> Deployment | None:
    """The deployment's own acceptance, as given or read from its server: per-token a and per position."""
    if settings.deployment_acceptance:
        rates, source = settings.deployment_acceptance, "given (--acceptance)"
    elif settings.url:
        rates = acceptance_from_url(settings.url, config.server.api_key_env or "")
        source = f"read from {settings.url}/metrics (vllm:spec_decode_num_accepted_tokens_per_pos_total)"
    else:
        return None
    return Deployment(per_token_acceptance(rates), rates if len(rates) > 1 else None, source)


def write_schedule(settings: PaymapSettings, path: Path, grid: Grid, a: float, out: Path) -> ScheduleSuggestion:
    """The K schedule at acceptance a, written as the input config's text with it (as `make tune` does)."""
    rows = schedule_rows(grid, a)
    max_batch = load_config(settings.config, settings.overrides).resources.max_num_seqs or 256
    schedule = schedule_from(rows, max_batch)
    k, written = deployed_k(schedule)
    ks = sorted(rows[0].options)
    comments = [f"Suggested by `make paymap` at per-token acceptance {a:.2f} (synthetic acceptance on the engine):",
                "K per running batch size (vLLM's num_speculative_tokens_per_batch_size). Speedup over no",
                "speculation at that acceptance, interpolated on the map, for each K:",
                "batch  " + "  ".join(f"K={kk:<4}" for kk in ks) + "  chosen",
                *(f"{row.batch:>5}  " + "  ".join(f"{row.options[kk]:>5.2f}x" for kk in ks) + f"  K={row.k}"
                  for row in rows)]
    if any(r.predicted_speedup < 1 for r in rows):
        comments.append("Below 1.0x no K pays: serve that traffic without speculation (NO_SPEC=1) where it matters.")
    output = settings.output or out / f"{path.stem}-paymap.yaml"
    write_atomic(output, tuned_yaml(path.read_text(), k, written, comments))
    load_config(output, settings.overrides)  # what it writes must be a config the kit serves
    return ScheduleSuggestion(rows, schedule, k, written, str(output))


def plot_heatmap(grid: Grid, a: float | None, path: Path) -> str:
    """Speedup over batch size x acceptance, one panel per K (and the best K's where there are
    several), the 1.0 contour drawn, each cell's speedup written in it."""
    plt = plots.pyplot()
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    panels = [(f"K={k}", f"k{k}") for k in grid.ks] + ([("best K", BEST)] if len(grid.ks) > 1 else [])
    batches, levels = grid.batches, grid.acceptance
    tables = {key: np.array([[grid.column(b, key)[i].mean for b in batches] for i in range(len(levels))])
              for _, key in panels}
    values = np.concatenate([t.ravel() for t in tables.values()])
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(values.min(), 0.99), vmax=max(values.max(), 1.01))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.8 * len(panels) + 1.2, 4), squeeze=False,
                             layout="constrained")
    for ax, (title, key) in zip(axes[0], panels):
        z = tables[key]
        image = ax.imshow(z, origin="lower", cmap="RdBu", norm=norm, aspect="auto")
        if z.shape[0] > 1 and z.shape[1] > 1 and z.min() < 1.0 < z.max():
            x, y = np.meshgrid(np.arange(len(batches)), np.arange(len(levels)))
            ax.contour(x, y, z, levels=[1.0], colors="black", linewidths=2)
        for i in range(len(levels)):
            for j, b in enumerate(batches):
                label = f"{z[i, j]:.2f}x" + (f"\nK={grid.column(b, BEST)[i].k}" if key == BEST else "")
                dark = abs(float(norm(z[i, j])) - 0.5) > 0.35
                ax.text(j, i, label, ha="center", va="center", fontsize=8, color="white" if dark else "black")
        if a is not None and levels[0] <= a <= levels[-1]:
            ax.axhline(interpolate(levels, list(range(len(levels))), a), color="black", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(batches)), [str(b) for b in batches])
        ax.set_yticks(range(len(levels)), [f"{v:g}" for v in levels])
        ax.set_xlabel("batch size (running requests)")
        if ax is axes[0][0]:
            ax.set_ylabel("per-token acceptance a (position i: a^i)")
        ax.set_title(f"speedup, {title}")
    fig.colorbar(image, ax=axes[0].tolist(), label="output tokens/s over no speculation")
    plots.save(fig, path, dpi=110)
    return path.name


def describe(result: PaymapResult | dict[str, Any]) -> str:
    """The report as a person reads it (paymap.md, also from a stored paymap.json); its first line is the headline."""
    result = PaymapResult.from_json(result)
    plan, grid, own = result.plan, result.grid, result.deployment
    if result.status != "mapped" or grid is None:
        lines = [f"Not measured: this machine cannot run {result.config} (problems below).", "",
                 "```text", describe_plan(plan), "```"]
        return "\n".join(lines + bullet_sections(result, {"problems": "Problems:"})) + "\n"
    lines = [result.headline, "", f"# Where speculation pays: {result.config}", "",
             f"![speedup over batch size and acceptance]({result.heatmap})", ""]
    if own:
        per = " (per position " + " ".join(f"{p:.2f}" for p in own.per_position) + ")" if own.per_position else ""
        lines += [f"The deployment's acceptance: per-token {own.a:.3f}{per}, {own.source}.", ""]
    lines += [f"Output tokens/s of closed-loop batches ({plan.max_tokens} output tokens a request, "
              f"T={plan.temperature:g}, {plan.repeats} generations a cell) with speculation at synthetic "
              "per-token acceptance a (position i accepted at a^i), over the baseline's at the same batch size; the mean, with its 95% interval.", "",
              "## Break-even acceptance per batch size", "", _break_even_table(grid),
              "", "## Speedup per cell", "", _cells_table(grid)]
    if grid.k0:
        lines += ["", "K=0 (the speculative engine told to draft nothing; no acceptance involved): "
                  + ", ".join(f"batch {b}: {_cell(c)}" for b, c in grid.k0.items())]
    if result.schedule:
        chosen = ", ".join(f"batch {lo}-{hi}: K={k}" for lo, hi, k in result.schedule.schedule)
        lines += ["", "## Schedule at the deployment's acceptance", "",
                  f"{chosen}; written to `{result.schedule.output}` (the input config with `speculation.schedule`, as "
                  "`make tune` writes it; `make tune` then measures the real acceptance and proves it with load "
                  "tests)."]
    lines += bullet_sections(result, {"notes": "Notes:"})
    return "\n".join(lines) + "\n"


def _cell(cell: Ratio) -> str:
    if cell.low is None:
        return f"{cell.mean:.2f}x"
    return f"{cell.mean:.2f}x [{cell.low:.2f}-{cell.high:.2f}]"


def _break_even_table(grid: Grid) -> str:
    keys = [f"k{k}" for k in grid.ks] + ([BEST] if len(grid.ks) > 1 else [])  # "best K" only where there is a choice
    rows = [[str(b), f"{grid.baseline[str(b)].tokens_per_s:.0f}", *(describe_point(grid.point(b, k)) for k in keys)]
            for b in grid.batches]
    header = ["batch", "baseline tok/s", *(f"K={k}" for k in grid.ks), *(("best K",) if len(grid.ks) > 1 else ())]
    return markdown.table(header, rows, align="rr")


def _cells_table(grid: Grid) -> str:
    best = len(grid.ks) > 1
    rows = []
    for b in grid.batches:
        for i, a in enumerate(grid.acceptance):
            cells = [grid.column(b, f"k{k}")[i] for k in grid.ks]
            counted = " ".join(f"{p:.2f}" for p in cells[-1].per_position if p is not None)
            asked = " ".join(f"{p:.2f}" for p in rates_for(a, grid.ks[-1]))
            rows.append([str(b), f"{a:g}", *(_cell(c) for c in cells), f"{counted} (asked {asked})",
                         *([str(grid.column(b, BEST)[i].k)] if best else [])])
    header = ["batch", "a", *(f"K={k}" for k in grid.ks), "engine-counted acceptance (largest K)",
              *(("best K",) if best else ())]
    return markdown.table(header, rows, align="rr" + "r" * len(grid.ks) + "lr")
