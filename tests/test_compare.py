"""`make compare REPORTS='a b'`: reports side by side, refused when they measured different work
(unless told), saying what else differs; `make compare REPORT=a` still prints one report's table."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

import report_samples
from loadtest.__main__ import main
from loadtest.measurement.figures import ContentSummary
from loadtest.measurement.results import SweepResults
from loadtest.reports.report import write_report


@pytest.fixture()
def two(tmp_path: Path) -> tuple[Path, Path]:
    t1 = report_samples.sweep(flagged=False)
    greedy = copy.deepcopy(t1)
    greedy.settings["temperature"], greedy.machine["commit"] = 0.0, "abc1234"
    for level in greedy.variants[0].levels:
        level.client.output_tokens_per_s *= 1.15
    write_report(t1, tmp_path / "t1")
    write_report(greedy, tmp_path / "greedy")
    return tmp_path / "t1", tmp_path / "greedy"


def test_reports_that_measured_different_work_are_refused_unless_told(two, tmp_path, capsys) -> None:
    out = tmp_path / "cmp"
    assert main(["compare", *map(str, two), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "refusing to compare" in err and "temperature: 1.0 (t1), 0.0 (greedy)" in err and "ALLOW_DIFFERENT=1" in err
    assert not out.exists()
    assert main(["compare", *map(str, two), "--out", str(out), "--allow-different"]) == 0
    text = capsys.readouterr().out
    assert "DIFFERS (allowed): temperature: 1.0 (t1), 0.0 (greedy)" in text
    assert "differs: commit: e987624 (t1), abc1234 (greedy)" in text
    rows = [line.split() for line in text.splitlines() if line.startswith("batch 1 ")]
    assert [r[3] for r in rows] == ["t1", "greedy"] and rows[1][4] == "2.19x"  # 1.15 x the T=1 speedup of 1.90x
    page = (out / "compare.html").read_text()
    assert "data:image/png;base64," in page and page.count("data-verdict") == 6
    assert (out / "compare-speedup.png").read_bytes()[:4] == b"\x89PNG"
    md = (out / "compare.md").read_text()
    assert md.splitlines()[2].startswith("**Different work measured (allowed by --allow-different): temperature")


def test_the_same_work_on_another_commit_is_compared_and_the_difference_said(two, tmp_path, capsys) -> None:
    t1, greedy = two
    results = report_samples.sweep(flagged=False)
    results.machine.update(commit="abc1234", cpus=4)
    write_report(results, tmp_path / "later")
    assert main(["compare", str(t1), str(tmp_path / "later"), "--out", str(tmp_path / "cmp")]) == 0
    text = capsys.readouterr().out
    assert "differs: machine: 2 CPUs, Linux-x86_64 (t1), 4 CPUs, Linux-x86_64 (later)" in text
    assert "DIFFERS" not in text


def test_one_report_still_prints_its_table_and_a_folder_without_results_is_an_error(two, tmp_path, capsys) -> None:
    assert main(["compare", str(two[0])]) == 0
    assert "batch 1, spec-k4: speculation pays" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(two[0]), str(tmp_path / "empty"), "--out", str(tmp_path / "x")]) == 2
    assert "no results.json" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "results.json").write_text('{"config": "x"}')
    assert main(["compare", str(two[0]), str(tmp_path / "other"), "--out", str(tmp_path / "x")]) == 2
    assert "not a load test's results.json" in capsys.readouterr().err


def test_a_verdict_on_output_that_mostly_loops_is_not_coloured_in_a_comparison(two, tmp_path) -> None:
    """The rule of the report's own first screen (`sweep_summary.verdict_word`): a speedup over
    outputs that mostly loop is said so, uncoloured."""
    t1, greedy = two
    results = SweepResults.load(greedy)
    loops = ContentSummary(checked=32, degenerate=29, degenerate_share=0.906, distinct_4=0.14, loop_share=0.86)
    for level in results.variants[0].levels:
        level.client.content = loops
    write_report(results, greedy)
    assert main(["compare", str(t1), str(greedy), "--out", str(tmp_path / "cmp"), "--allow-different"]) == 0
    page = (tmp_path / "cmp" / "compare.html").read_text()
    tones = dict((level, tone) for tone, level in re.findall(r"<div class='\w+ (\w+)' data-verdict><div class='v'>"
                                                             r"<span class='lv'>([^<]*):</span>", page))
    assert tones["batch 1, t1"] == "good" and tones["batch 1, greedy"] == "none", tones
    assert "speculation pays on looping output" in page and "speculation pays on looping output" in \
        (tmp_path / "cmp" / "compare.md").read_text()
