"""Several drafters against one baseline in one sweep (a config's `alternatives`, `--drafters`),
and traffic by category (Spec-Bench's question.jsonl, the kit's `categories` workload): the
config and workload checks, the report's best drafter and per-category table from stored results,
and one real sweep of the code pair with an alternative drafter on category prompts."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from deploy import load_config
from loadtest.measurement.derive import by_category
from loadtest.measurement.figures import CategoryFigures
from loadtest.measurement.results import SweepResults
from loadtest.reports.report import compare_table, write_report
from loadtest.reports.sweep_summary import best_by_batch, headline, verdict_lines
from loadtest.sweeps.settings import SweepSettings, plan_variants
from loadtest.traffic.workloads import CATEGORIES_FILE, load_workload
from report_samples import sweep
from test_config import minimal, problems

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------- config
def test_each_alternative_is_a_whole_speculation_section_and_becomes_a_variant() -> None:
    config = load_config("default")
    assert list(config.alternatives) == ["plugin", "bigram", "ngram"]
    variants = plan_variants(SweepSettings("default", drafters=["all"]))
    assert [v.name for v in variants] == ["spec-k1", "plugin", "bigram", "ngram", "baseline"]
    ngram = variants[3]
    assert (ngram.drafter, ngram.k, ngram.label) == ("ngram", 3, "ngram K=3")
    # Served in place of `speculation`: the alternative's own fields, nothing of the main drafter's.
    served = load_config("default", list(ngram.overrides))
    assert served.speculation.drafter == "ngram" and served.speculation.model is None
    assert served.speculation.draft_sampling == "greedy"  # its default, not the main drafter's probabilistic
    assert [v.name for v in plan_variants(SweepSettings("default", drafters=["ngram", "plugin"]))] == [
        "spec-k1", "plugin", "ngram", "baseline"]  # the config's order


@pytest.mark.parametrize("alternatives, message", [
    ({"baseline": {"drafter": "ngram"}}, "alternative 'baseline'"),
    ({"spec-k2": {"drafter": "ngram"}}, "alternative 'spec-k2'"),
    ({"Big Draft": {"drafter": "ngram"}}, "alternative 'Big Draft'"),
    ({"off": {"drafter": "none"}}, "drafts nothing"),
    ({"eagle": {"drafter": "eagle3"}}, "needs a draft checkpoint"),
    ({"ngram": {"drafter": "ngram", "num_speculative_token": 3}}, "num_speculative_token"),
])
def test_a_bad_alternative_is_refused_with_its_name(alternatives: dict, message: str) -> None:
    said = "; ".join(problems(minimal(speculation={"drafter": "ngram"}, alternatives=alternatives)))
    assert message in said and "alternatives" in said, said


def test_drafters_that_the_config_does_not_name_are_refused_before_any_server() -> None:
    for argv, message in ((["default.yaml", "--drafters", "eagle"], "no alternative named 'eagle'; this config's: "
                                                                    "plugin, bigram, ngram (or all)"),
                          (["embedded-bigram.yaml", "--drafters", "all"], "this config names no alternatives")):
        run = subprocess.run([sys.executable, "-m", "loadtest", "run", *argv, "--dry-run"], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and message in run.stderr, run.stderr


def test_the_plan_lists_every_drafter_and_the_categories() -> None:
    run = subprocess.run([sys.executable, "-m", "loadtest", "run", "--drafters", "all", "--workload",
                          "categories:code,math", "--users", "1,32", "--repeat", "1", "--dry-run"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "in 2 categories (code, math)" in run.stdout
    for line in ("spec-k1   small_model K=1", "plugin    small_model (plugin) K=1", "bigram    bigram K=2",
                 "ngram     ngram K=3", "baseline  no speculation"):
        assert line in run.stdout, run.stdout


# ---------------------------------------------------------------------------------- categories
def test_spec_bench_questions_are_read_as_vllms_own_loader_reads_them(tmp_path: Path) -> None:
    from vllm.benchmarks.datasets.datasets import SpecBench

    path = tmp_path / "question.jsonl"
    rows = [{"question_id": 81, "category": "writing", "turns": ["Compose a travel blog post.", "Rewrite it."]},
            {"question_id": 82, "category": "math_reasoning", "turns": ["What is 3 + 4?"]},
            {"question_id": 83, "category": "writing", "turns": ["Write a haiku about rain."]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ours = load_workload(str(path))
    theirs = SpecBench(dataset_path=str(path), random_seed=0, disable_shuffle=True).data
    assert sorted(i.messages[0]["content"] for i in ours.items) == sorted(d["prompt"] for d in theirs)
    assert ours.categories == ["writing", "math_reasoning"]
    # Sent in turn over the categories, and one category kept on request.
    assert [i.id for i in ours.items] == ["question-81", "question-82", "question-83"]
    assert [i.id for i in load_workload(f"{path}:writing").items] == ["question-81", "question-83"]


def test_the_kits_category_workload_covers_six_categories_in_turn() -> None:
    workload = load_workload("categories")
    assert workload.categories == ["code", "chat", "math", "summarisation", "rewriting", "qa"]
    assert len(workload.items) == 24 and all(i.messages and not i.prompt for i in workload.items)
    assert [i.category for i in workload.sequence(6)] == workload.categories  # any 6 in a row: one each
    assert CATEGORIES_FILE.name == "categories.jsonl"


@pytest.mark.parametrize("line, message", [
    ({"question_id": 1, "category": "qa", "turns": []}, "'turns' must be a list of non-empty strings"),
    ({"question_id": 1, "category": "qa", "turns": "What?"}, "'turns' must be a list"),
    ({"question_id": 1, "category": ["qa"], "turns": ["What?"]}, "'category' must be a word"),
    ({"question_id": 1, "category": "q a", "turns": ["What?"]}, "'category' must be a word"),
    ({"question_id": 1, "category": "qa"}, "exactly one of 'prompt', 'messages' or 'turns'"),
])
def test_a_malformed_category_file_names_its_line(tmp_path: Path, line: dict, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"question_id": 0, "category": "qa", "turns": ["Fine."]}) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=message) as error:
        load_workload(str(path))
    assert f"{path}:2" in str(error.value)


def test_an_unknown_category_is_refused_with_the_ones_there_are() -> None:
    with pytest.raises(ValueError, match="has no category 'poetry'; its categories: code, chat, math"):
        load_workload("categories:code,poetry")
    with pytest.raises(ValueError, match="its categories: none"):
        load_workload("chat:code")
    run = subprocess.run([sys.executable, "-m", "loadtest", "run", "--workload", "categories:poetry", "--dry-run"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "no category 'poetry'" in run.stderr, run.stderr


# ---------------------------------------------------------------------------------- reports
def three_drafters() -> SweepResults:
    """The sample sweep's spec-k4 (pays at batch 1 and 8) with two more drafters: ngram faster at
    batch 1, bigram slower; per-category figures on each run."""
    results = sweep(flagged=False)
    spec = results.variants[0]
    for name, factor in (("ngram", 1.2), ("bigram", 0.5)):
        other = copy.deepcopy(spec)
        other.name, other.label = name, f"{name} K=4"
        for level in other.levels:
            level.client.output_tokens_per_s *= factor
        results.variants.insert(1, other)
    for variant in results.variants:
        for level in variant.levels:
            speed = level.client.output_tokens_per_s / level.concurrency
            drafted = variant.name != "baseline"
            level.client.by_category = {
                "code": CategoryFigures(2, 256, speed * 1.2, 0.8 if drafted else None, not_text=0),
                "chat": CategoryFigures(2, 256, speed * 0.8, 0.4 if drafted else None, not_text=1)}
    return results


def test_the_report_leads_with_the_best_drafter_at_each_batch_size(tmp_path: Path) -> None:
    results = three_drafters()
    ranked = dict(best_by_batch(results))
    assert [e.variant for e in ranked[1]] == ["ngram", "spec-k4", "bigram"]
    assert [e.variant for e in ranked[32]][0] == "ngram"
    lines = verdict_lines(results)
    assert (lines[0].level, lines[0].verdict, lines[0].tone) == ("batch 1: best drafter", "ngram", "good")
    assert "then spec-k4 1.90x, bigram 0.95x" in lines[0].figures
    # At 32 the best (ngram, 1.12x) pays and the others do not; each drafter's own verdict follows.
    assert lines[2].level == "batch 32: best drafter" and lines[3].level == "batch 1, bigram"
    assert any(x.startswith("batch 1: best drafter ngram, ") for x in headline(results))
    table = compare_table(results, [1])  # the terminal's table of one batch size keeps its best-drafter line
    assert "batch 1: best drafter ngram" in table and "batch 32: best drafter" not in table
    files = write_report(results, tmp_path)
    md = files["markdown"].read_text()
    assert md.split("\n")[2].startswith("- **batch 1: best drafter: ngram** — ngram 2.28x")
    assert "spec-k4: draft_model `embedded-draft`, K=4; bigram: " in md  # the setup names each drafter


def test_acceptance_and_speedup_by_category_against_the_baseline(tmp_path: Path) -> None:
    results = three_drafters()
    rows = {(r.concurrency, r.category, r.variant): r for r in by_category(results)}
    code = rows[1, "code", "ngram"]
    assert code.requests == 6 and code.acceptance == pytest.approx(0.8)  # 3 runs of 2 requests
    assert code.speedup.mean == pytest.approx(rows[1, "code", "spec-k4"].speedup.mean * 1.2)
    assert rows[1, "chat", "baseline"].speedup is None and rows[1, "chat", "bigram"].not_text == 3
    assert [r.category for r in by_category(results)][:4] == ["code"] * 4  # a category's variants together
    md = write_report(results, tmp_path)["markdown"].read_text()
    section = md.split("## By category", 1)[1]
    assert "| 1 | code | ngram | 6 | 80% |" in section


@pytest.mark.engine
def test_a_sweep_of_two_drafters_on_category_prompts(tmp_path: Path, embedded_pair) -> None:
    """`make loadtest CONFIG=embedded-code.yaml DRAFTERS=ngram` on two categories: three servers
    (the draft model, vLLM's n-gram and the baseline) taking turns, per-category figures per run,
    the best drafter leading the report, where each step's time went, and `make compare` on it."""
    out = tmp_path / "report"
    run = subprocess.run([sys.executable, "-m", "loadtest", "run", "embedded-code.yaml", "--drafters", "ngram",
                          "--workload", "categories:code,math", "--users", "2", "--repeat", "1", "--requests", "4",
                          "--max-tokens", "24", "--warmup", "0", "--no-vllm-bench", "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    results = SweepResults.load(out)
    assert run.returncode == 0, run.stderr[-3000:]
    assert [v.name for v in results.variants] == ["spec-k4", "ngram", "baseline"]
    assert results.plan["server_starts"] == 3
    for variant in results.variants:
        (level,) = variant.levels
        figures = level.client.by_category
        assert set(figures) == {"code", "math"} and sum(f.requests for f in figures.values()) == 4
        assert all(f.tokens_per_s > 0 for f in figures.values())
        # The server's per-request counts: drafted tokens where it speculates, none where not.
        assert all((f.acceptance is None) == (variant.name == "baseline") for f in figures.values()), figures
        # Its engine's steps, timed by phase over the measured run: the drafter's share among them.
        assert level.step_ms["steps"] > 0 and level.step_ms["forward"] > 0
        assert (level.step_ms["propose"] > 0) == (variant.name != "baseline")
    rows = by_category(results)
    assert {(r.category, r.variant) for r in rows if r.speedup} == {
        (c, v) for c in ("code", "math") for v in ("spec-k4", "ngram")}
    md = (out / "report.md").read_text()
    first = next(line for line in md.splitlines() if line.startswith("- **"))
    assert first.startswith("- **batch 2: best drafter: "), md[:500]
    assert "## By category" in md and "## Where an engine step's time goes" in md
    assert "in 2 categories (code, math)" in md
    compare = subprocess.run([sys.executable, "-m", "loadtest", "compare", str(out)], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
    assert compare.returncode == 0 and "best drafter" in compare.stdout and "ngram" in compare.stdout, compare.stderr


def test_a_price_per_gpu_hour_gives_gpu_hours_and_the_cost_of_a_million_tokens(tmp_path: Path) -> None:
    results = three_drafters()
    for variant in results.variants:
        variant.gpus, variant.price_per_gpu_hour = 4, 2.5
    from loadtest.measurement.derive import costs

    rows = {r.variant: r for r in costs(results)}
    spec = rows["spec-k4"]
    runs = [lv for lv in results.variants[0].levels if lv.concurrency == 1]
    tps = sum(lv.client.output_tokens_per_s for lv in runs) / len(runs)
    assert spec.cost_per_million_tokens[1] == pytest.approx(2.5 * 4 / 3600 / tps * 1e6)
    seconds = sum(results.variants[0].startup_s) + sum(lv.client.duration_s for lv in results.variants[0].levels)
    assert spec.gpu_hours == pytest.approx(4 * seconds / 3600)
    md = write_report(results, tmp_path)["markdown"].read_text()
    assert "- cost per million output tokens: spec-k4 " in md and "## Cost: GPU-hours" in md
    results.variants[0].price_per_gpu_hour = None  # no price: no cost
    assert "spec-k4" not in {r.variant for r in costs(results)}
