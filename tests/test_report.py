"""The report's documents (results.json with derived speedups, report.md, the self-contained
report.html rendered from it, plots) and the choice of the newest report. Pure: no servers."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from loadtest.__main__ import main
from loadtest.measurement.derive import derive, summarize_speedups
from loadtest.measurement.figures import (Agreement, ClientFigures, Consistency, ContentReference, ContentSummary,
                                          Distribution, FigureAgreement, HistogramFigures, LocustRun, ServerFigures)
from loadtest.measurement.results import LevelResult, SweepResults, VariantResult
from loadtest.reports.report import compare_table, newest_report, report_markdown, write_report
from loadtest.reports.sweep_summary import headline

REPO = Path(__file__).resolve().parents[1]

ERROR = "exit 1: <html> & a | pipe\nsecond line"  # a cell with HTML, a table's separator and a line break


def _level(c: int, tps: float, tpot_ms: float, accept: float | None = None, length: float | None = None,
           **more: Any) -> LevelResult:
    """A measured closed-loop level: 4 requests of 128 tokens, every latency `tpot_ms`."""
    dist = Distribution(n=4, mean=tpot_ms, std=0.0, p50=tpot_ms, p90=tpot_ms, p95=tpot_ms, p99=tpot_ms)
    client = ClientFigures(requests=4, ok=4, failed=0, output_tokens=512, output_tokens_per_s=tps, duration_s=512 / tps,
                           request_throughput=1.0, per_user_tokens_per_s=dataclasses.replace(dist, p50=tps / c),
                           ttft_ms=dist, per_token_latency_ms=dist, chunk_gap_ms=dist, tokens_per_chunk=dist,
                           e2e_ms=dist, peak_output_tokens_per_s=tps)
    server = ServerFigures(generation_tokens=512, acceptance_rate=accept, mean_accepted_length=length,
                           histograms={"per_token_latency_s": HistogramFigures(mean=tpot_ms / 1000)},
                           output_tokens_per_s=tps)
    return LevelResult(**{"concurrency": c, "status": "ok", "client": client, "server": server,
                          "consistency": Consistency(ok=True, relative_error=0.0, client_output_tokens=512,
                                                     server_generation_tokens=512),
                          "locust": LocustRun(html=f"locust/c{c}.html", cpu_s=1.0, wall_s=10.0), **more})


def _sweep(*variants: VariantResult, **settings: Any) -> SweepResults:
    return SweepResults(config="default", status="ok", settings={"tolerance": 0.05, **settings}, machine={},
                        variants=list(variants))


def _spec_and_baseline() -> SweepResults:
    """spec-k4 at twice the baseline's tokens/s at batch 1 and 0.9x at batch 32."""
    return _sweep(VariantResult("spec-k4", "K=4", k=4, status="ok",
                                levels=[_level(1, 200, 4.0, 0.7, 3.0), _level(32, 900, 30.0, 0.7, 3.0)]),
                  VariantResult("baseline", "off", status="ok", levels=[_level(1, 100, 10.0), _level(32, 1000, 32.0)]),
                  users=[1, 32])


def test_report_files_speedup_and_compare_table(tmp_path):
    results = _spec_and_baseline()
    files = write_report(results, tmp_path)
    for name in ("json", "markdown", "html", "throughput", "latency", "acceptance", "speedup"):
        assert files[name].is_file() and files[name].stat().st_size > 100
    assert "data:image/png;base64," in files["html"].read_text()
    rows = {(d.variant, d.concurrency): d for d in derive(results)}
    assert rows[("spec-k4", 1)].speedup == pytest.approx(2.0)
    assert rows[("spec-k4", 32)].speedup == pytest.approx(0.9)
    # r = 4 ms x 3 tokens / 10 ms = 1.2; at batch 32: 30 x 3 / 32 = 2.8125
    assert rows[("spec-k4", 1)].step_cost_ratio == pytest.approx(1.2)
    assert rows[("spec-k4", 32)].step_cost_ratio == pytest.approx(2.8125)
    assert rows[("spec-k4", 1)].per_token_source == "server"
    table = compare_table(results)
    assert "2.00x" in table and "0.90x" in table and "70%" in table
    assert json.loads(files["json"].read_text())["comparisons"]
    assert results.comparisons is None  # the sweep's own results are not rewritten behind its back


def test_speedup_is_split_by_which_run_of_the_pair_went_first():
    # Two repeats in the runner's alternating order: spec before baseline, then after it.
    def run(c: int, tps: float, repeat: int, sequence: int) -> LevelResult:
        return _level(c, tps, 10.0, 0.5, 2.0, repeat=repeat, sequence=sequence)

    results = _sweep(VariantResult("spec-k2", "K=2", k=2, status="ok", levels=[run(32, 90, 1, 1), run(32, 110, 2, 4)]),
                     VariantResult("baseline", "off", status="ok", levels=[run(32, 100, 1, 2), run(32, 100, 2, 3)]),
                     users=[32])
    assert [r.went_first for r in derive(results)] == [True, False]
    [entry] = summarize_speedups(results)
    assert entry.speedup_by_order == pytest.approx({"first": 0.9, "second": 1.1})
    assert "Locust 0.90x in runs before the baseline's, 1.10x in runs after it" in headline(results)[0]
    assert headline(results)[0].endswith("(2 runs, each beside a baseline run)")
    # A grouped sweep (each server started once, on GPUs) pairs the runs by repeat, not in time.
    results.plan = {"order": "grouped"}
    assert headline(results)[0].endswith("(2 runs, each paired with the baseline's run of the same repeat)")
    results.plan = None
    # Without a baseline (--no-baseline) the line gives what was measured and claims no pairing.
    alone = dataclasses.replace(results, variants=results.variants[:1])
    assert headline(alone)[0].startswith("batch 32, spec-k2: no baseline to compare with; acceptance ")
    assert headline(alone)[0].endswith("(2 runs)")
    # One order only (a single repeat, or results from before the order was recorded): no split.
    results.variants[0].levels.pop()
    assert summarize_speedups(results)[0].speedup_by_order is None


def test_a_full_disk_never_truncates_results_json(tmp_path):
    """The report rewrites results.json; when the disk fills mid-write (here: RLIMIT_FSIZE, the
    same EFBIG/ENOSPC path) the measured file must survive whole."""
    levels = [_level(c, 100.0 + c, 10.0).to_json() for c in range(1, 40)]
    results = {"config": "default", "status": "ok", "settings": {"users": list(range(1, 40)), "tolerance": 0.05},
               "machine": {}, "problems": [], "variants": [{"name": "baseline", "label": "off", "k": None,
                                                            "status": "ok", "levels": levels}]}
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps(results))
    size = saved.stat().st_size
    script = (
        "import json, resource, signal, sys\n"
        "from pathlib import Path\n"
        "from loadtest.measurement.results import SweepResults\n"
        "from loadtest.reports.report import write_report\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({size // 2}, {size // 2}))\n"
        "out = Path(sys.argv[1])\n"
        "try:\n"
        "    write_report(SweepResults.load(out), out)\n"
        "except OSError as exc:\n"
        "    print('write failed:', exc); sys.exit(7)\n")
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 7, run.stdout + run.stderr
    assert json.loads(saved.read_text()) == results  # whole, as it was
    assert not [p.name for p in tmp_path.iterdir() if ".tmp" in p.name]  # no temporary file left behind


def _results() -> SweepResults:
    return _sweep(VariantResult("spec-k4", "K=4", k=4, status="ok", levels=[_level(1, 200, 4.0, 0.7, 3.0)]),
                  VariantResult("baseline", "off", status="ok", levels=[_level(1, 100, 10.0)]),
                  VariantResult("broken", "x", k=2, status="failed", error=ERROR), users=[1])


class _Tables(HTMLParser):
    """Rows of the page's tables (cell texts), the images' sources and the <pre> blocks' text."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.images: list[str] = []
        self.pre: list[str] = []
        self._cell: list[str] | None = None
        self._in_pre = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.images.append(dict(attrs)["src"] or "")
        elif tag == "pre":
            self._in_pre = True
            self.pre.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None
        elif tag == "pre":
            self._in_pre = False

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._in_pre:
            self.pre[-1] += data


def test_html_report_leads_with_the_answer_and_keeps_the_evidence_in_details(tmp_path):
    files = write_report(_results(), tmp_path)
    page = files["html"].read_text()
    md = files["markdown"].read_text()
    assert "<title>Load test: default</title>" in page and "<style>" in page and "<table>" in page
    # The first screen: a verdict line, the speedup picture, the setup; then sections that open on click.
    body = page.split("<body>", 1)[1]
    assert body.index("data-verdict") < body.index("data-answer") < body.index("Setup.") < body.index("<details>")
    assert "<b>speculation pays</b>" in page and "2.00x output tok/s" in page
    assert md.splitlines()[2] == "**Incomplete: 2 runs measured; failed: broken.**"  # its server did not start
    assert md.splitlines()[4].startswith("- **batch 1: speculation pays** — 2.00x output tok/s")
    assert md.index("![Speedup of speculation") < md.index("**Setup.**") < md.index("## Batch comparison")
    # Markdown's bold is bold, not stripped and not left as asterisks.
    assert "Status <strong>ok</strong>" in page and "Status **ok**" in md
    # The raw HTML in an error message is shown as text, not passed into the page.
    assert "<html>" not in body and "&lt;html&gt; &amp; a | pipe second line" in page
    parsed = _Tables()
    parsed.feed(page)
    variants = next(r for r in parsed.rows if r and r[0] == "broken")
    assert len(variants) == 6 and variants[-1] == "exit 1: <html> & a | pipe second line"  # the pipe split nothing
    assert "exit 1: <html> & a \\| pipe second line |" in md
    # Every plot is inside the page as a PNG; report.md links the files beside it.
    assert len(parsed.images) == len([p for p in files if p in ("throughput", "latency", "acceptance", "speedup")])
    for src in parsed.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(b"\x89PNG")
    assert "![throughput](throughput.png)" in md
    # The method (the cost model's formulas, how agreement is judged) is in docs/load-tests.md, linked.
    assert "E(a*, K) = r" not in page and "docs/load-tests.md#the-cost-model" in page
    docs = (REPO / "docs" / "load-tests.md").read_text()
    for anchor in re.findall(r"docs/load-tests\.md#([a-z0-9-]+)", page):
        assert f"(#{anchor})" in docs or _anchor_of_heading(docs, anchor), anchor
    assert '<a href="locust/c1.html">' in page


def _anchor_of_heading(docs: str, anchor: str) -> bool:
    """Whether a heading of docs/load-tests.md gets `anchor` (GitHub's rule: lower case, spaces to
    dashes, punctuation dropped)."""
    for line in docs.splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            if re.sub(r"[^a-z0-9 -]", "", text).replace(" ", "-") == anchor:
                return True
    return False


def test_the_exit_status_matches_the_words():
    from loadtest.reports import sweep_summary as ss

    results = _results()
    results.variants = results.variants[:2]
    assert ss.exit_code(results) == ss.OK == 0
    # Flags (a second opinion that disagrees) are shown, not an error: every level was measured.
    flagged = results.variants[1].levels[0]
    flagged.status, flagged.problems = "flagged", ["vLLM's benchmark disagrees"]
    results.status = "flagged"
    assert ss.exit_code(results) == 0
    results.variants[0].levels[0].consistency = Consistency(ok=False)
    assert ss.exit_code(results) == ss.UNTRUSTED == 4
    failed = _results()  # a variant whose server did not start: a measurement missing
    assert ss.exit_code(failed) == ss.INCOMPLETE == 3
    assert "Incomplete" in ss.lead(failed) and "failed: broken" in ss.lead(failed)
    failed.status = "interrupted"
    assert ss.exit_code(failed) == ss.INTERRUPTED == 130
    assert ss.exit_code(SweepResults(status="failed")) == ss.USAGE == 2


def test_an_interrupted_sweep_leads_with_what_it_is_and_a_single_run_says_it_has_no_interval():
    from loadtest.reports import sweep_summary as ss

    alone = _results()
    alone.variants = alone.variants[:1]
    alone.status, alone.plan = "interrupted", {"planned_runs": 4, "variants": ["spec-k4", "baseline"]}
    assert ss.lead(alone) == "Interrupted after 1 of 4 runs measured; not measured: baseline; no comparison."
    [line] = ss.verdict_lines(alone)
    assert (line.verdict, line.tone) == ("no comparison", "none") and "baseline was not measured" in line.figures
    md = report_markdown(alone, [])
    assert md.splitlines()[2] == "**Interrupted after 1 of 4 runs measured; not measured: baseline; no comparison.**"
    complete = _results()
    complete.variants = complete.variants[:2]
    assert ss.lead(complete).startswith("One run per level: no 95% interval can be given")
    complete.settings["repeat"] = 3
    assert ss.lead(complete) == ""


def test_a_flag_is_a_badge_that_links_to_its_detail(tmp_path):
    from loadtest.reports import sweep_summary as ss

    results = _results()
    results.variants = results.variants[:2]
    level = results.variants[1].levels[0]
    level.vllm_bench_agreement = Agreement(ttft_p50_ms=FigureAgreement(difference=0.15, difference_adjusted=0.147,
                                                                       agrees=False), agrees=False)
    level.consistency = Consistency(ok=False, relative_error=0.07)
    badges = {(b.label, b.target): b.text for b in ss.badges(results)}
    assert badges[("FLAG", "second-opinion")] == "batch 1 baseline run 1: vLLM bench TTFT differs +14.7%"
    assert badges[("UNTRUSTED", "trust")] == "batch 1 baseline run 1: client tokens vs server counter 7.0% apart"
    # Locust says slower, the engine's clock says faster: the verdict carries a DISAGREE badge.
    results.variants[0].levels[0].client.output_tokens_per_s = 50.0
    badges = {(b.label, b.target): b.text for b in ss.badges(results)}
    assert badges[("DISAGREE", "second-opinion")] == ("batch 1 spec-k4: Locust's verdict contradicted by per token on "
                                                      "the engine's clock")


def test_markdown_table_cells_keep_backslashes_and_pipes():
    results = _results()
    results.variants[2].error = "C:\\tmp\\| x"
    row = next(line for line in report_markdown(results, []).splitlines() if line.startswith("| broken |"))
    assert row.endswith("| C:\\\\tmp\\\\\\| x |")


def _report(root: Path, name: str, content: str | dict, mtime: float) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    path = folder / "results.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    os.utime(path, (mtime, mtime))
    os.utime(folder, (mtime, mtime))
    return folder


def test_newest_report_is_chosen_by_creation_time_not_file_times(tmp_path):
    assert newest_report(tmp_path) is None
    now = time.time()
    newest = _report(tmp_path, "x-20240101-000000", {"created": "2024-06-01T12:00:00+0000"}, now - 3600)
    # Later as text and touched last, but 11:00 UTC.
    _report(tmp_path, "y-20240101-000000", {"created": "2024-06-01T13:00:00+0200"}, now)
    _report(tmp_path, "z-20240301-000000", {"created": "2024-03-01T00:00:00+0000"}, now)
    _report(tmp_path, "broken", "{not json", now + 10)
    _report(tmp_path, "undated", {"config": "default"}, now + 10)
    assert newest_report(tmp_path) == newest
    # Without `created`, the time in the folder's name (default_out_dir's) counts.
    named = _report(tmp_path, "default-20240701-000000", {"config": "default"}, now - 7200)
    assert newest_report(tmp_path) == named


def test_compare_without_a_report_reads_the_newest_created(tmp_path, monkeypatch, capsys):
    results = {"config": "default", "status": "ok", "variants": []}
    _report(tmp_path / "reports", "old", {**results, "config": "old", "created": "2024-01-01T00:00:00+0000"},
            time.time())
    _report(tmp_path / "reports", "new", {**results, "created": "2024-02-01T00:00:00+0000"}, time.time() - 3600)
    monkeypatch.chdir(tmp_path)
    assert main(["compare"]) == 0
    assert capsys.readouterr().out.startswith(f"{Path('reports') / 'new'}: config default")


@pytest.mark.parametrize("content", ["", "[1, 2]"])
def test_newest_report_without_times_falls_back_to_the_name(tmp_path, content):
    _report(tmp_path, "a", content or "{}", time.time())
    b = _report(tmp_path, "b", content or "{}", time.time() - 100)
    assert newest_report(tmp_path) == b


def test_a_verdict_resting_on_loops_says_so_first_and_free_lengths_are_given(tmp_path):
    """The content check's figures (as `stats.summarize` writes them) reach the report's first lines."""
    looping = ContentSummary(checked=4, degenerate=3, degenerate_share=0.75, distinct_4=0.2, loop_share=0.8,
                             reference=ContentReference(0.89, "the embedded pair's held-out code"),
                             acceptance_valid=0.4, acceptance_degenerate=0.97, tokens_per_s_valid=20.0)
    text = dataclasses.replace(looping, degenerate=0, degenerate_share=0.0, distinct_4=0.93, loop_share=0.0,
                               vs_reference=1.04, like_reference=True, tokens_per_s_valid=10.0)
    spec, base = _level(1, 200, 4.0, 0.9, 4.6), _level(1, 100, 10.0)
    spec.client.content, base.client.content = looping, text
    for level in (spec, base):
        level.client.output_tokens_per_request = Distribution(n=4, p50=90.0, min=12, max=128)
    results = _sweep(VariantResult("spec-k4", "K=4", k=4, status="ok", levels=[spec]),
                     VariantResult("baseline", "off", status="ok", levels=[base]),
                     users=[1], fixed_length=False, max_tokens=128)
    lines = headline(results)
    assert lines[0].startswith("batch 1, spec-k4: CONTENT: speculation's output rests mostly on degenerate output: "
                               "3 of 4 requests degenerate")
    assert "acceptance over the content-valid requests 40%, over the degenerate ones 97%" in lines[0]
    assert not any("the baseline's" in line for line in lines)  # the baseline's output is text
    verdict = next(line for line in lines if "speculation pays" in line)
    assert "2.00x per-request tokens/s over the content-valid requests" in verdict
    text_md = report_markdown(results, [])
    assert "## Content: is the output text?" in text_md and "3 (75%)" in text_md
    assert "not fixed: each ends at the model's end of text; output lengths p50 90, from 12 to 128" in text_md


def test_a_verdict_on_output_that_mostly_loops_is_not_coloured_as_a_gain():
    from loadtest.reports import sweep_summary as ss

    results = _spec_and_baseline()
    loops = ContentSummary(checked=32, degenerate=29, degenerate_share=0.906, distinct_4=0.14, loop_share=0.86)
    results.variants[0].levels[0].client.content = loops
    one, thirty_two = ss.verdict_lines(results)
    assert (one.verdict, one.tone) == ("speculation pays on looping output", "none")
    assert "29 of 32 degenerate" in one.figures
    assert (thirty_two.verdict, thirty_two.tone) == ("speculation does not pay", "bad")
    # Mostly noise (as the report's NOISE warning judges it) is treated alike.
    noise = ContentSummary(checked=32, degenerate=0, degenerate_share=0.0, noise_checked=32, noise=20,
                           noise_share=0.625, distinct_4=0.99, loop_share=0.0, known_words=0.7)
    results.variants[0].levels[1].client.content = noise
    thirty_two = ss.verdict_lines(results)[1]
    assert (thirty_two.verdict, thirty_two.tone) == ("speculation does not pay on noise", "none")


def test_a_temperature_run_is_summarized_from_its_sweeps_folders(tmp_path):
    """Each temperature-<T>/results.json is read back (`load_runs`) and summarized side by side."""
    from loadtest.reports import temperature_report as tr

    for t in (1.0, 0.0):
        results = _spec_and_baseline()
        results.settings["temperature"] = t
        if t:
            results.status = "flagged"
            results.variants[1].levels[0].problems = ["slow"]
        write_report(results, tmp_path / f"temperature-{t:g}")
    runs = tr.load_runs(tmp_path)
    assert [(r.temperature, r.report, r.results.status) for r in runs] == [
        (0.0, "temperature-0", "ok"), (1.0, "temperature-1", "flagged")]
    rows = tr.summary_rows(runs)
    assert [(r.concurrency, r.temperature) for r in rows] == [(1, 0.0), (1, 1.0), (32, 0.0), (32, 1.0)]
    assert rows[0].speedup.mean == pytest.approx(2.0) and rows[0].verdict == "pays"
    files = tr.write_summary(runs, tmp_path)
    md = files["markdown"].read_text()
    assert "- temperature 1: flagged: slow (baseline c=1)" in md
    assert "- T=0: [temperature-0/report.md](temperature-0/report.md) (ok)" in md
    summary = json.loads(files["json"].read_text())
    assert summary["sweeps"]["1"] == {"report": "temperature-1", "status": "flagged", "problems": []}


def test_a_temperature_runs_problems_name_each_level_by_its_load():
    """A closed-loop level by its users (`c=1`), an open-loop one by its rate (`2/s`), not `c=None`."""
    from loadtest.reports import temperature_report as tr

    results = SweepResults(variants=[VariantResult("spec-k4", levels=[
        LevelResult(concurrency=1, problems=["slow"]), LevelResult(rate=2.0, problems=["behind"])])])
    assert tr.run_problems(results) == ["slow (spec-k4 c=1)", "behind (spec-k4 2/s)"]
