"""The reports as a person sees them: each report.html (a closed-loop sweep, an open-loop one, an
interrupted one, a capacity search, a soak, reports side by side) rendered by headless Chromium at
1400 px wide. The first 900 px must hold every verdict line and the picture that answers the
question, and every image on the page must load.

Needs Debian's `chromium` (scripts/install-env.sh installs it where it may use apt). Without it
the test says it could not run; under CI=true it fails instead."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import report_samples
from loadtest.measurement.serial import Serial

WIDTH, FIRST_SCREEN = 1400, 900

PROBE = """<pre id="probe"></pre><script>
addEventListener('load', () => {
  const box = e => { const r = e.getBoundingClientRect();
                     return {top: r.top + scrollY, bottom: r.bottom + scrollY, left: r.left, right: r.right}; };
  document.getElementById('probe').textContent = 'PROBE' + JSON.stringify({
    width: innerWidth,
    verdicts: [...document.querySelectorAll('[data-verdict]')].map(e => ({text: e.innerText, ...box(e)})),
    answer: [...document.querySelectorAll('img[data-answer]')].map(box),
    lead: [...document.querySelectorAll('[data-lead]')].map(e => ({text: e.innerText, ...box(e)})),
    badges: [...document.querySelectorAll('a.badge')].map(a => ({target: a.hash,
                                                                found: !!document.getElementById(a.hash.slice(1))})),
    images: [...document.querySelectorAll('img')].map(i => ({loaded: i.complete && i.naturalWidth > 0,
                                                            alt: i.alt}))}) + 'END';
});
</script>"""


@dataclass
class Box(Serial):
    """Where an element lies on the page (px; top and bottom from the page's top), and its text."""

    top: float = 0.0
    bottom: float = 0.0
    left: float = 0.0
    right: float = 0.0
    text: str = ""


@dataclass
class BadgeLink(Serial):
    target: str = ""
    found: bool = False
    """Whether the page has the element the badge links to."""


@dataclass
class Image(Serial):
    alt: str = ""
    loaded: bool = False


@dataclass
class Layout(Serial):
    """The page as Chromium laid it out (the probe's JSON)."""

    width: int = 0
    verdicts: list[Box] = field(default_factory=list)
    answer: list[Box] = field(default_factory=list)
    lead: list[Box] = field(default_factory=list)
    badges: list[BadgeLink] = field(default_factory=list)
    images: list[Image] = field(default_factory=list)


def chromium() -> str:
    """The browser's command, or a skip (a failure under CI) saying plainly that the test could not run."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    message = ("could not run: no headless Chromium on PATH (Debian: apt-get install chromium; "
               "scripts/install-env.sh installs it where it may use apt)")
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def render(page: Path, browser: str, tmp: Path) -> Layout:
    """The page's layout as Chromium lays it out at 1400 px: the probe's JSON."""
    probed = tmp / f"probed-{page.parent.name}-{page.name}"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--window-size={WIDTH},{FIRST_SCREEN}", "--virtual-time-budget=5000",
                           f"--user-data-dir={tmp / 'profile'}", "--dump-dom", probed.as_uri()],
                          capture_output=True, text=True, timeout=120)
    found = re.search(r"PROBE(.*?)END", done.stdout, re.S)
    assert found, f"Chromium gave no layout for {page} (exit {done.returncode}): {done.stderr[-1500:]}"
    return Layout.from_json(json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&")))


def first_screen_holds_the_answer(layout: Layout, page: Path, verdicts: int, picture: bool = True) -> None:
    assert layout.width == WIDTH, layout.width
    assert len(layout.verdicts) == verdicts, (page, [v.text for v in layout.verdicts])
    for v in layout.verdicts:
        assert v.bottom <= FIRST_SCREEN and v.right <= WIDTH, (page, v)
    if picture:
        [answer] = layout.answer
        assert answer.bottom <= FIRST_SCREEN and answer.right <= WIDTH and answer.bottom - answer.top > 200, (page, answer)
    assert all(b.found for b in layout.badges), (page, layout.badges)  # each badge leads to its detail
    broken = [i.alt for i in layout.images if not i.loaded]
    assert layout.images and not broken, (page, broken)


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    chromium()  # says it cannot run before building anything
    return report_samples.write_all(tmp_path_factory.mktemp("reports"))


def test_a_sweep_report_shows_its_verdicts_and_speedup_picture_first(pages, tmp_path) -> None:
    browser = chromium()
    layout = render(pages["sweep"], browser, tmp_path)
    first_screen_holds_the_answer(layout, pages["sweep"], verdicts=3)
    assert layout.verdicts[0].text.startswith("batch 1: speculation pays")
    assert "1.90x (95% 1.71-2.09)" in layout.verdicts[0].text
    assert not layout.lead  # a complete run of three repeats needs no lead
    assert [b.target for b in layout.badges] == ["#second-opinion"]  # the flagged run's badge
    # One repeat: the first screen says that no interval can be given, above the verdicts.
    one = render(pages["sweep-one-run"], browser, tmp_path)
    first_screen_holds_the_answer(one, pages["sweep-one-run"], verdicts=3)
    [lead] = one.lead
    assert "no 95% interval" in lead.text and lead.bottom <= one.verdicts[0].top


def test_an_interrupted_sweep_leads_with_what_it_is_and_draws_no_verdict(pages, tmp_path) -> None:
    layout = render(pages["interrupted"], chromium(), tmp_path)
    first_screen_holds_the_answer(layout, pages["interrupted"], verdicts=2, picture=False)
    [lead] = layout.lead
    assert lead.text.startswith("Interrupted after 2 of 18 runs measured") and "no comparison" in lead.text
    assert all("no comparison" in v.text and "pays" not in v.text for v in layout.verdicts)


def test_rates_capacity_soak_and_comparison_reports_follow_the_same_pattern(pages, tmp_path) -> None:
    browser = chromium()
    rates = render(pages["rates"], browser, tmp_path)
    first_screen_holds_the_answer(rates, pages["rates"], verdicts=3)
    assert rates.verdicts[0].text.startswith("1 req/s: speculation pays")
    capacity = render(pages["capacity"], browser, tmp_path)
    first_screen_holds_the_answer(capacity, pages["capacity"], verdicts=1 + 12)  # capacity, then every rate paired
    assert capacity.verdicts[0].text.startswith("capacity: speculation raises capacity +137%")
    soak = render(pages["soak"], browser, tmp_path)
    first_screen_holds_the_answer(soak, pages["soak"], verdicts=4)
    assert "DRIFTS: TTFT p50 +50.0%" in soak.verdicts[1].text
    compared = render(pages["compare"], browser, tmp_path)
    first_screen_holds_the_answer(compared, pages["compare"], verdicts=6)
