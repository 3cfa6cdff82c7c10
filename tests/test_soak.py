"""`make soak` (tuning/soak.py, tuning/soak_report.py): the drift judgement, the memory sampling
and the report, fast and without an engine; then one short soak of one drafter on the engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from loadtest.measurement.records import RequestRecord
from loadtest.traffic.workloads import Item, Workload, load_workload
from tuning import soak, soak_report
from tuning.soak_report import DrafterSoak, SoakMeta, SoakReport
from tuning.__main__ import main as tuning_main

REPO = Path(__file__).resolve().parent.parent
GIB = soak_report.GIB


def records(n: int, e2e=lambda i: 1.0, ttft=lambda i: 0.1, tpot=lambda i: 0.03, failed=(), gap: float = 0.5
            ) -> list[RequestRecord]:
    """`n` requests sent `gap` seconds apart (handed over shuffled: the judgement sorts them)."""
    out = [RequestRecord(f"code-{i % 12}", "/v1/completions", start=1000.0 + gap * i, ok=i not in failed,
                         e2e_s=e2e(i), ttft_s=ttft(i), per_token_latency_s=tpot(i)) for i in range(n)]
    return out[1::2] + out[::2]


def samples(until: float, rss=lambda t: 2.0 * GIB, every: float = 2.0) -> list[list[float]]:
    t, out = 999.0, []
    while t <= until:
        out.append([t, rss(t), 3])
        t += every
    return out


def test_a_steady_run_is_within_the_tolerance() -> None:
    v = soak_report.judge(records(200), samples(1101), window=50, tolerance=0.1, expected=200)
    assert v.status == "ok" and v.drifts == [] and v.failed == 0
    assert v.first.requests == v.last.requests == 50
    assert v.first.e2e_mean_ms == pytest.approx(1000) and v.last.ttft_p50_ms == pytest.approx(100)
    assert v.first.tpot_p50_ms == pytest.approx(30) and v.first.rss_mean_gib == pytest.approx(2.0)
    assert all(abs(c) < 1e-9 for c in v.change.values())
    line = soak_report.verdict_line(DrafterSoak("bigram", verdict=v, rate=2.0))
    assert line.startswith("bigram: within 10% (") and "last 50 vs first 50 of 200 requests at 2/s, 0 failed" in line


def test_the_last_window_is_held_against_the_first_and_the_drifting_figure_named() -> None:
    # TTFT grows over the run: the last 50 requests' median is 20% above the first 50's.
    v = soak_report.judge(records(200, ttft=lambda i: 0.1 if i < 150 else 0.12), samples(1101), 50, 0.1)
    assert v.status == "drifts" and v.drifts == ["ttft_p50_ms"]
    assert v.change["ttft_p50_ms"] == pytest.approx(0.2)
    line = soak_report.verdict_line(DrafterSoak("ngram", verdict=v))
    assert line.startswith("ngram: DRIFTS beyond 10%: TTFT p50 +20.0%")
    # Within the tolerance, however the middle of the run looks; a fall beyond it drifts too.
    assert soak_report.judge(records(200, e2e=lambda i: 1.0 + (i >= 150) * 0.09), samples(1101), 50, 0.1).drifts == []
    assert soak_report.judge(records(200, e2e=lambda i: 5.0 if 60 < i < 140 else 1.0), samples(1101), 50, 0.1
                             ).drifts == []
    assert soak_report.judge(records(200, tpot=lambda i: 0.03 if i < 150 else 0.025), samples(1101), 50, 0.1
                             ).drifts == ["tpot_p50_ms"]


def test_memory_that_keeps_growing_drifts_in_its_mean_and_its_end_value() -> None:
    # 2 GiB, growing 1 MiB a second: the windows' means 74 s apart, +3.6%.
    slow = samples(1101, rss=lambda t: 2 * GIB + (t - 999) * 2**20)
    v = soak_report.judge(records(200), slow, 50, 0.1)
    assert v.status == "ok" and v.change["rss_mean_gib"] == pytest.approx(74 / 2062)
    # The end of the first window: the first sample after its last response (request 49: 1024.5 + 1 s).
    assert v.first.rss_end_gib == pytest.approx((2 * GIB + 28 * 2**20) / GIB)
    assert v.last.rss_end_gib == pytest.approx(slow[-1][1] / GIB)
    fast = samples(1101, rss=lambda t: 2 * GIB + (t - 999) * 8 * 2**20)  # 8 MiB a second
    v = soak_report.judge(records(200), fast, 50, 0.1)
    assert v.drifts == ["rss_mean_gib", "rss_end_gib"]
    assert "RSS mean +" in soak_report.verdict_line(DrafterSoak("x", verdict=v))


def test_failed_requests_are_counted_and_fail_the_run() -> None:
    v = soak_report.judge(records(200, failed={3, 190}), samples(1101), 50, 0.1, expected=200)
    assert v.status == "failed" and v.failed == 2 and v.drifts == []
    assert v.first.failed == 1 and v.last.failed == 1
    assert "2 of 200 requests failed" in soak_report.verdict_line(DrafterSoak("bigram", verdict=v))
    short = soak_report.judge(records(60), samples(1101), 50, 0.1, expected=200)
    assert short.status == "failed" and "only 60 of 200 requests finished" in short.problems
    assert "cannot fill two windows of 50" in soak_report.verdict_line(DrafterSoak("bigram", verdict=short))
    assert not DrafterSoak(verdict=short).passed
    assert DrafterSoak(verdict=soak_report.judge(records(200), samples(1101), 50, 0.1)).passed


def test_open_loop_requests_are_windowed_by_arrival_and_unsent_ones_fail_the_run() -> None:
    recs = records(40)
    for r in recs:
        r.arrival = int(round((r.start - 1000.0) / 0.5))
    late = next(r for r in recs if r.arrival == 3)
    late.start += 30.0  # sent long after its schedule (a stalled generator): still the 4th arrival
    assert [r.arrival for r in soak_report.in_send_order(recs)] == list(range(40))
    unsent = next(r for r in recs if r.arrival == 39)
    unsent.ok, unsent.e2e_s, unsent.error = False, None, "unsent: the run ended before its arrival time"
    v = soak_report.judge(recs, samples(1101), 10, 0.1, expected=40)
    assert v.first.requests == 10 and v.last.failed == 1 and v.status == "failed"
    assert v.outcomes == {"served": 39, "unsent": 1} and "1 of 40 requests failed (1 unsent)" in v.problems


def test_a_window_between_two_samples_takes_the_next_one() -> None:
    sparse = [[900.0, 1 * GIB, 3], [2000.0, 3 * GIB, 3]]  # none while the first window's requests ran
    v = soak_report.judge(records(200), sparse, 10, 0.1)
    assert v.first.rss_mean_gib == v.first.rss_end_gib == pytest.approx(3.0)


def scrapes(until: float, acceptance=lambda t: 0.5, tpot_ms=lambda t: 30.0, every: float = 5.0) -> list[list[float]]:
    """/metrics scrapes every `every` s from t=995: 100 draft tokens and 40 per-token observations
    per interval, at the acceptance and per-token latency the functions give at its end."""
    t, row, out = 995.0, [995.0, 0.0, 0.0, 0.0, 0.0, 0.0, 4.0], []
    while t <= until:
        out.append(list(row))
        t += every
        row = [t, row[1] + 25, row[2] + 100, row[3] + 100 * acceptance(t), row[4] + 40 * tpot_ms(t) / 1000,
               row[5] + 40, 4.0]
    return out


def test_the_engine_counts_say_whose_a_drift_is_and_are_not_judged() -> None:
    # Steps slow down by a third from t=1075 (the last window), acceptance falls from 0.6 to 0.3.
    engine = scrapes(1110, acceptance=lambda t: 0.6 if t < 1075 else 0.3, tpot_ms=lambda t: 30 if t < 1075 else 40)
    v = soak_report.judge(records(200), samples(1101), 50, 0.1, engine=engine)
    assert v.status == "ok"  # the engine's figures are not judged
    first, last = v.first, v.last
    assert first.acceptance_rate == pytest.approx(0.6) and first.engine_tpot_mean_ms == pytest.approx(30)
    assert last.acceptance_rate == pytest.approx(0.3) and last.engine_tpot_mean_ms == pytest.approx(40)
    assert first.running_mean == pytest.approx(4.0)
    # Without scrapes (or with one) there is nothing to say, and nothing breaks.
    assert soak_report.judge(records(200), samples(1101), 50, 0.1, engine=engine[:1]).first.acceptance_rate is None
    spans = soak_report.engine_intervals(engine, span_s=30)
    assert spans[0][1] == pytest.approx(0.6) and spans[-1][1] == pytest.approx(0.3) and spans[-1][2] == pytest.approx(40)


def test_a_scrape_that_fails_is_skipped_and_the_run_goes_on() -> None:
    from deploy import free_port

    with soak.EngineSampler(f"http://127.0.0.1:{free_port()}", every_s=0.05) as engine:
        time.sleep(0.2)
    assert engine.samples == []


MEMORY_TREE = """
import subprocess, sys, time
blob = bytearray(80 * 2**20)  # touched, so resident
for i in range(0, len(blob), 4096):
    blob[i] = 1
if sys.argv[1] == "parent":
    child = subprocess.Popen([sys.executable, "-c", sys.argv[2], "child", sys.argv[2]])
print("ready", flush=True)
time.sleep(60)
"""


def test_resident_memory_is_summed_over_the_process_tree() -> None:
    """This test's own child, which starts a grandchild; each holds 80 MiB."""
    proc = subprocess.Popen([sys.executable, "-c", MEMORY_TREE, "parent", MEMORY_TREE], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        deadline = time.monotonic() + 30
        while soak.tree_rss(proc.pid)[1] < 2 or soak.tree_rss(proc.pid)[0] < 160 * 2**20:
            assert time.monotonic() < deadline, soak.tree_rss(proc.pid)
            time.sleep(0.1)
        rss, count = soak.tree_rss(proc.pid)
        assert count == 2 and 160 * 2**20 < rss < 400 * 2**20
        mine, mine_count = soak.tree_rss(os.getpid())
        assert mine_count >= 3 and mine > rss  # this process and its children, those two included
        with soak.RssSampler(proc.pid, every_s=0.05) as sampler:
            time.sleep(0.4)
        times = [s[0] for s in sampler.samples]
        assert len(times) >= 4 and times == sorted(times)
        assert all(s[2] == 2 and s[1] > 160 * 2**20 for s in sampler.samples)
    finally:
        proc.kill()
        proc.wait()
    time.sleep(0.2)
    with pytest.raises(soak.psutil.NoSuchProcess):
        soak.tree_rss(proc.pid)
    gone = soak.RssSampler(proc.pid)
    gone.sample()
    assert gone.samples == []  # a server that died: no sample, no crash


def test_consecutive_prompts_must_differ() -> None:
    for name in ("code", "edit", "mixed"):
        soak.check_varied(load_workload(name))
    with pytest.raises(ValueError, match="prompt 2 repeats the one before"):
        soak.check_varied(Workload("w", (Item("a", "x"), Item("b", "y"), Item("c", "y"))))
    with pytest.raises(ValueError, match="one prompt"):
        soak.check_varied(Workload("w", (Item("a", "x"),)))


def test_the_rate_probe_counts_successful_requests_over_the_interval() -> None:
    probe = records(8, e2e=lambda i: 1.0, gap=0.5, failed={0})  # sent over 3.5 s, the last done at 4.5 s
    assert soak.capacity(probe) == pytest.approx(7 / 4.5)
    assert soak.capacity(records(2, failed={0, 1})) is None


def test_settings_that_cannot_be_judged_are_refused_before_any_server(capsys: pytest.CaptureFixture) -> None:
    for argv, message in ((["--requests", "900"], "cannot fill two windows of --window 500"),
                          (["--rate", "0"], "--rate must be above 0"),
                          (["--tolerance", "10"], "--tolerance is a fraction"),
                          (["--drafters", "none"], "invalid choice")):
        with pytest.raises(SystemExit) as exit_:
            tuning_main(["soak", *argv])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    # Every drafter of the embedded default: its own (vLLM's draft-model path) and each alternative.
    assert set(soak.DRAFTERS) == {"native", "plugin", "bigram", "ngram"}


SOAK_META = SoakMeta(requests=200, window=50, tolerance=0.1, max_tokens=32, workload="code", prompts=12,
                     temperature=1.0, seed=0, sample_every_s=2.0, rate_rule="2 requests/s for every drafter",
                     machine="x86_64, 2 CPUs", date="2026-01-01 00:00:00")
"""A soak of 200 requests judged over windows of 50 (what `soak_drafter` produces)."""


def soak_drafter(name: str, ttft) -> DrafterSoak:
    """One drafter's soak result: 200 requests whose TTFT is `ttft(i)`, steady memory and engine."""
    recs, rss, engine = records(200, ttft=ttft), samples(1101), scrapes(1110)
    return DrafterSoak(name, rate=2.0, rate_source="--rate", startup_s=40.0, run_s=100.0, processes=3,
                       verdict=soak_report.judge(recs, rss, 50, 0.1, expected=200, engine=engine),
                       series=soak_report.series(recs, rss, engine))


def test_the_report_leads_with_a_verdict_per_drafter(tmp_path: Path) -> None:
    report = SoakReport(SOAK_META, [soak_drafter("bigram", lambda i: 0.1),
                                    soak_drafter("small_model (plugin)", lambda i: 0.1 + (i >= 150) * 0.05),
                                    DrafterSoak("ngram", error="vLLM exited with code 1 during start-up")])
    out = tmp_path / "run"
    written = soak_report.write(report, out)
    md = written["markdown"].read_text()
    lines = md.splitlines()
    assert lines[2] == "**Incomplete: ngram could not be judged (2 of 3 drafters measured).**"
    assert lines[4].startswith("- **bigram: within 10%** — RSS mean +0.0%")
    assert lines[5].startswith("- **small_model (plugin): DRIFTS: TTFT p50 +50.0%**")
    assert lines[6] == "- **ngram: not measured** — vLLM exited with code 1 during start-up"
    assert "- bigram: within 10%" in md  # the full verdict line, in the drafter's section
    assert "![Change of each judged figure by drafter](soak-summary.png)" in md
    assert soak_report.exit_code(report) == 3  # a drafter not measured
    assert soak_report.exit_code(replace(report, drafters=report.drafters[:2])) == 1  # one drifts
    assert soak_report.exit_code(replace(report, drafters=report.drafters[:1])) == 0
    assert "| TTFT p50 (ms) | 100.0 | 150.0 | +50.0% | DRIFTS |" in md
    assert "| draft acceptance (engine, not judged) | 0.5 | 0.5 | +0.0% | |" in md
    assert "![bigram](soak-bigram.png)" in md and (out / "soak-small_model-plugin.png").stat().st_size > 1000
    html = written["html"].read_text()
    assert "data:image/png;base64," in html and "DRIFTS" in html
    saved = SoakReport.from_json(json.loads((out / "soak.json").read_text()))
    assert [d.drafter for d in saved.drafters] == ["bigram", "small_model (plugin)", "ngram"]
    assert saved.drafters[0].series == report.drafters[0].series and len(saved.drafters[0].series.e2e_ms) == 200
    # A stored soak.json renders as the run's own report did.
    assert soak_report.write(json.loads((out / "soak.json").read_text()), tmp_path / "again")[
        "markdown"].read_text() == md
    assert soak_report.rolling_mean([1.0, None, 3.0, 5.0], 2) == [1.0, 1.0, 3.0, 4.0]


@pytest.mark.engine
@pytest.mark.slow
def test_a_short_soak_of_one_drafter_on_the_engine(tmp_path: Path) -> None:
    """`make soak`, shortened: vLLM's n-gram drafter, 40 requests open loop at 2/s, windows of 10."""
    out = tmp_path / "soak"
    run = subprocess.run([sys.executable, "-m", "tuning", "soak", "--drafters", "ngram", "--requests", "40",
                          "--rate", "2", "--max-tokens", "16", "--window", "10", "--warmup", "2",
                          "--sample-every", "0.5", "--metrics-every", "1", "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "SPECDEPLOY_NO_PROGRESS": "1"})
    saved = SoakReport.from_json(json.loads((out / "soak.json").read_text()))
    [ngram] = saved.drafters
    assert ngram.error is None, ngram.error
    v = ngram.verdict
    # Windows of 10 requests are too short for the verdict to mean much: it must be there.
    assert v.requests == 40 and v.failed == 0 and v.status in ("ok", "drifts"), run.stdout[-2000:]
    assert set(v.change) == set(soak_report.FIGURES) and ngram.rate == 2
    # The engine's counts over each window, from its /metrics: ngram drafts, so acceptance is a rate.
    assert 0 <= v.first.acceptance_rate <= 1 and v.first.engine_tpot_mean_ms > 0, v.first
    assert ngram.processes >= 2 and len(ngram.series.rss) >= 10  # API server and engine core, 20 s
    assert run.returncode == soak_report.exit_code(saved) == (0 if v.status == "ok" else 1), run.stderr[-2000:]
    assert "- ngram: " in (out / "soak.md").read_text()
    assert run.stdout.splitlines()[0].startswith("ngram: ")
