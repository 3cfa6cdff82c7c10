"""`make paymap`: the map's arithmetic (break-even interpolation, cells, K schedule), its report and
plan, and one small map measured on real engines (plumbing pair)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from loadtest.measurement.prom import Snapshot, parse_metrics
from tuning import paymap
from tuning.paymap import PLAIN, SPEC, Deployment, PaymapPlan, PaymapResult, PaymapSettings, Point, Ratio
from tuning.step_costs import BatchFigures, PaymapRun, StepCosts

ROOT = Path(__file__).resolve().parents[1]


# --- acceptance ------------------------------------------------------------------------------------

def test_per_token_acceptance_of_per_position_rates() -> None:
    """a, a^2, a^3 is per-token a; one rate is a itself; the mapping keeps tokens per step."""
    assert paymap.per_token_acceptance([0.62]) == 0.62
    assert paymap.per_token_acceptance(paymap.rates_for(0.7, 4)) == pytest.approx(0.7, abs=1e-6)
    rates = [0.8, 0.5, 0.4, 0.2]
    a = paymap.per_token_acceptance(rates)
    assert 1 + sum(rates) == pytest.approx(sum(a ** i for i in range(5)), abs=1e-6)


@pytest.mark.parametrize("text", ["0", "1.2", "0.5,0.6", "abc", ""])
def test_bad_acceptance_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        paymap.parse_acceptance(text)


def test_acceptance_from_a_servers_counters() -> None:
    text = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{model_name="m"} 200
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 160
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 100
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="2"} 60
"""
    assert paymap.acceptance_from_metrics(Snapshot(parse_metrics(text), 0.0)) == [0.8, 0.5, 0.3]
    assert paymap.acceptance_from_metrics(Snapshot({}, 0.0)) is None


# --- break-even and cells ----------------------------------------------------------------------------

LEVELS = [0.3, 0.5, 0.7, 0.9]


def test_crossing_is_interpolated_between_the_levels_around_one() -> None:
    assert paymap.crossing(LEVELS, [0.7, 0.9, 1.1, 1.5]) == Point(pytest.approx(0.6), "=")
    assert paymap.crossing(LEVELS, [1.1, 1.2, 1.3, 1.4]) == Point(0.3, "<=")
    assert paymap.crossing(LEVELS, [0.5, 0.6, 0.7, 0.9]) == Point(0.9, ">")
    # Noise above a first crossing: the break-even is where every higher level pays.
    assert paymap.crossing(LEVELS, [0.8, 1.05, 0.98, 1.2]).value == pytest.approx(0.7 + 0.02 / 0.22 * 0.2)


def cell(mean: float, half: float | None = 0.05) -> Ratio:
    return Ratio(mean, None if half is None else mean - half, None if half is None else mean + half)


def test_break_even_interval_from_the_cells_intervals() -> None:
    point = paymap.break_even(LEVELS, [cell(0.7), cell(0.9), cell(1.1), cell(1.5)])
    assert point.value == pytest.approx(0.6)
    # Upper ends (0.75, 0.95, 1.15, ...) cross at 0.55; lower ends (0.65, 0.85, 1.05, ...) at 0.65.
    assert point.low.value == pytest.approx(0.55) and point.high.value == pytest.approx(0.65)
    assert paymap.break_even(LEVELS, [cell(0.7, None)] * 4).low is None
    assert paymap.describe_point(point) == "0.60 (95% interval 0.55 to 0.65)"


def test_pays_at_reads_the_break_even() -> None:
    assert paymap.pays_at(Point(0.6, "="), 0.62) is True
    assert paymap.pays_at(Point(0.6, "="), 0.55) is False
    assert paymap.pays_at(Point(0.3, "<="), 0.4) is True
    assert paymap.pays_at(Point(0.3, "<="), 0.2) is None
    assert paymap.pays_at(Point(0.9, ">"), 0.8) is False
    assert paymap.pays_at(Point(0.9, ">"), 0.95) is None


def test_ratio_interval() -> None:
    r = paymap.ratio_interval([110.0, 120.0, 130.0], [100.0, 100.0, 100.0])
    assert r.mean == pytest.approx(1.2) and r.low < 1.2 < r.high
    assert paymap.ratio_interval([120.0], [100.0]).low is None


def test_best_k_prefers_the_shorter_draft_within_a_tie() -> None:
    assert paymap.best_k({1: 1.30, 2: 1.50, 4: 1.49}) == 2
    assert paymap.best_k({1: 1.30, 2: 1.50, 4: 1.60}) == 4


def raw_engines(speedup: dict[tuple[int, float, int], float], batches: list[int], ks: list[int],
                levels: list[float], k0: float | None = None) -> StepCosts:
    """What the two engines return (tuning.step_costs._paymap_cells), for a given speedup per cell."""
    raw = StepCosts()
    for b in batches:
        base = 100.0 * b
        cells = {f"a{a:g}-k{k}": [PaymapRun(0, 40, base * speedup[(b, a, k)] * f, 50, paymap.rates_for(a, max(ks)))
                                  for f in (0.98, 1.0, 1.02)] for a in levels for k in ks}
        if k0 is not None:
            cells["k0"] = [PaymapRun(0, 127, base * k0, 0, [])] * 3
        raw.batches[str(b)] = {PLAIN: BatchFigures(runs=[PaymapRun(tokens_per_s=base)] * 3),
                               SPEC: BatchFigures(cells=cells)}
    return raw


def model_speedup(b: int, a: float, k: int) -> float:
    """A toy cost model: tokens per step over a step cost that grows with batch size and K."""
    return sum(a ** i for i in range(k + 1)) / (1 + 0.1 * k + 0.04 * k * b)


def grid_for(batches: list[int], ks: list[int], k0: float | None = None) -> paymap.Grid:
    speedup = {(b, a, k): model_speedup(b, a, k) for b in batches for a in LEVELS for k in ks}
    return paymap.build_grid(raw_engines(speedup, batches, ks, LEVELS, k0), batches, LEVELS, ks, 128)


def test_grid_cells_best_k_and_break_even() -> None:
    grid = grid_for([1, 16, 32], [1, 2, 4])
    one = grid.column(1, "k2")[1]
    assert one.mean == pytest.approx(model_speedup(1, 0.5, 2)) and one.low < one.mean < one.high
    assert one.expected_tokens_per_step == pytest.approx(1.75)
    for i, a in enumerate(LEVELS):
        options = {k: model_speedup(32, a, k) for k in (1, 2, 4)}
        assert grid.column(32, paymap.BEST)[i].k == paymap.best_k(options)
    # K=1 at batch 1 pays at every level (1.3 / 1.14 at a = 0.3); at batch 16 its step costs 1.74
    # target steps, and its speedup (1 + a) / 1.74 is linear in a: break-even exactly 0.74.
    assert (grid.point(1, "k1").value, grid.point(1, "k1").relation) == (0.3, "<=")
    assert grid.point(16, "k1").value == pytest.approx(0.74)
    assert grid.point(32, "k1").relation == ">" and grid.point(32).relation == ">"


def test_headline_states_the_batch_it_pays_up_to_and_the_need_at_32() -> None:
    grid = grid_for([1, 4, 16, 32], [2])
    assert paymap.headline(grid, 0.62) == ("At acceptance 0.62 this deployment pays up to batch 4; at batch 32 it "
                                           "needs more than 0.90 (it pays at no acceptance measured).")
    assert paymap.headline(grid, 0.31).startswith("At acceptance 0.31 this deployment pays up to batch 1;")
    assert paymap.headline(grid, None).startswith("This deployment's acceptance is not known")
    low = grid_for([16, 32], [2])
    assert paymap.headline(low, 0.5).startswith("At acceptance 0.50 this deployment pays at no batch size measured "
                                                "(batch 16 needs 0.8")


def test_schedule_written_as_a_config(tmp_path: Path) -> None:
    """With several K the schedule at the deployment's acceptance comes out as the input config with
    `speculation.schedule`, its comments kept, and the kit loads it. At a = 0.7 the toy model's best K
    is 4 at batch 1, 2 at batch 4, 1 at batch 16; at batch 32 nothing pays and K=0 (0.9x) beats K=1."""
    batches = [1, 4, 16, 32]
    grid = grid_for(batches, [1, 2, 4], k0=0.9)
    settings = PaymapSettings("embedded-code.yaml", batches=batches, ks=[1, 2, 4], output=tmp_path / "suggested.yaml")
    result = paymap.write_schedule(settings, ROOT / "configs" / "embedded-code.yaml", grid, 0.7, tmp_path)
    assert [r.k for r in result.rows] == [4, 2, 1, 0]
    assert result.schedule == [[1, 2, 4], [3, 8, 2], [9, 22, 1], [23, 64, 0]]
    text = (tmp_path / "suggested.yaml").read_text()
    assert "Suggested by `make paymap`" in text and "The kit's own code pair" in text  # the input's own comments
    written = yaml.safe_load(text)["speculation"]
    assert written["schedule"] == result.schedule and written["num_speculative_tokens"] == 4
    assert "extra" not in written  # the map's synthetic acceptance is not the deployment's


def test_interpolate_is_flat_beyond_the_grid() -> None:
    assert paymap.interpolate(LEVELS, [1, 2, 3, 4], 0.6) == pytest.approx(2.5)
    assert paymap.interpolate(LEVELS, [1, 2, 3, 4], 0.1) == 1 and paymap.interpolate(LEVELS, [1, 2, 3, 4], 0.95) == 4


def test_report_and_heat_map(tmp_path: Path) -> None:
    batches = [1, 4, 16, 32]
    grid = grid_for(batches, [1, 2, 4], k0=0.9)
    assert paymap.plot_heatmap(grid, 0.62, tmp_path / "heatmap.png") == "heatmap.png"
    assert (tmp_path / "heatmap.png").read_bytes()[:4] == b"\x89PNG"
    result = PaymapResult("embedded-code.yaml", plan=PaymapPlan(repeats=3, max_tokens=128), status="mapped", grid=grid,
                          headline=paymap.headline(grid, 0.62), heatmap="heatmap.png",
                          deployment=Deployment(0.62, None, "given"), notes=[paymap.DUMMY_NOTE])
    text = paymap.describe(result)
    assert text.splitlines()[0] == result.headline
    assert "| batch | baseline tok/s | K=1 | K=2 | K=4 | best K |" in text and "dummy weights" in text
    assert paymap.describe(result.to_json()) == text  # a stored paymap.json renders the same


# --- the plan -----------------------------------------------------------------------------------------

def test_dry_run_of_the_70b_preset_prints_the_plan_and_starts_nothing(tmp_path: Path) -> None:
    """On any machine (this one has no GPU): the plan, the exact engine arguments with dummy weights
    and synthetic acceptance, exit 0, and no report folder."""
    done = subprocess.run([sys.executable, "-m", "tuning", "paymap", "llama70b-7b.yaml", "--batches", "1,4,16,32",
                           "--k", "1,2,4", "--dummy-weights", "--acceptance", "0.62", "--dry-run",
                           "--out", str(tmp_path / "report")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SPECDEPLOY_API_KEY": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "2 engine starts" in out
    assert "x K 1,2,4 = 60 cells, plus K=0 at each batch size (4)" in out
    assert out.count('"load_format": "dummy"') == 2
    assert '"rejection_sample_method": "synthetic"' in out and '"model": "meta-llama/Llama-2-70b-chat-hf"' in out
    assert '"tensor_parallel_size": 8' in out and "about " in out
    assert not (tmp_path / "report").exists()


def test_a_config_without_drafter_is_refused() -> None:
    with pytest.raises(ValueError, match="no drafter"):
        paymap.make_plan(PaymapSettings("embedded-code.yaml", ["speculation.drafter=none"]))


# --- on the engines ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_small_map_on_the_engine(tmp_path: Path) -> None:
    """Two engines (plumbing pair): batch 1 and 2, acceptance 0.3 and 0.9, K 1 and 2, one generation
    a cell. The report, heat map and schedule config are written, and every cell's first position
    was accepted, by the engine's own count, at the rate asked (4.5 binomial standard errors)."""
    settings = PaymapSettings("embedded-code.yaml", ["resources.cpu_kvcache_space_gib=0.25"], batches=[1, 2],
                              acceptance=[0.3, 0.9], ks=[1, 2], repeats=1, max_tokens=48,
                              deployment_acceptance=[0.6], out=tmp_path / "report")
    result = paymap.paymap(settings)
    assert result.status == "mapped"
    out = tmp_path / "report"
    assert (out / "paymap.md").read_text().startswith("At acceptance 0.60 ")
    assert (out / "heatmap.png").stat().st_size > 0 and (out / "paymap.json").is_file()
    assert Path(result.schedule.output).is_file()
    for b in (1, 2):
        assert result.grid.k0[str(b)].mean > 0
        for k in (1, 2):
            for c in result.grid.column(b, f"k{k}"):
                assert c.drafts > 0 and c.mean > 0
                bound = 4.5 * math.sqrt(c.a * (1 - c.a) / c.drafts) + 0.02
                assert abs(c.per_position[0] - c.a) <= bound, c


@pytest.mark.parametrize("args, message", [
    (["--grid", "0.5"], "at least two acceptance levels"),
    (["--grid", "0.3,1.0"], "at least two acceptance levels"),
    (["--acceptance", "0.5,0.7"], "cannot rise"),
    (["--acceptance", "0.6", "--url", "http://127.0.0.1:9"], "either as --acceptance or by --url"),
])
def test_bad_command_lines_are_refused_before_any_engine(args: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "tuning", "paymap", "embedded-code.yaml", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr, done.stderr[-1000:]
