"""results.json and capacity.json as types: what a file holds reads back the same, older files load,
a newer one is refused, and `loadtest compare` reads a report an older kit wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.measurement.figures import ClientFigures
from loadtest.measurement.results import (CAPACITY_SCHEMA, SWEEP_SCHEMA, CapacityLevel, CapacityResults,
                                          LevelResult, SweepResults)
from report_samples import sweep

REPO = Path(__file__).resolve().parents[1]


def test_a_sweep_reads_back_as_it_was_written(tmp_path: Path) -> None:
    results = sweep(repeat=2, users=(1, 8))
    path = results.save(tmp_path / "results.json")
    again = SweepResults.load(tmp_path)
    assert again == results and again.to_json() == json.loads(path.read_text())
    assert json.loads(path.read_text())["schema"] == SWEEP_SCHEMA
    level = again.variants[0].levels[0]
    assert isinstance(level, LevelResult) and level.concurrency == 1 and level.rate is None
    assert "rate" not in json.loads(path.read_text())["variants"][0]["levels"][0]  # None is left out


@pytest.mark.parametrize("schema", [None, 1, 2])
def test_an_older_results_file_loads_and_keeps_what_this_code_does_not_know(tmp_path: Path, schema: int | None) -> None:
    data = sweep(repeat=1, users=(1,)).to_json()
    data.pop("schema")
    if schema is not None:
        data["schema"] = schema
    data["written_by_someone_else"] = {"x": 1}            # a key no version of the kit wrote
    data["variants"][0]["levels"][0]["extra_figure"] = 2.5
    (tmp_path / "results.json").write_text(json.dumps(data))
    results = SweepResults.load(tmp_path / "results.json")
    assert results.schema == SWEEP_SCHEMA and results.variants[0].levels[0].client
    rewritten = results.to_json()
    assert rewritten["written_by_someone_else"] == {"x": 1}
    assert rewritten["variants"][0]["levels"][0]["extra_figure"] == 2.5


def test_a_newer_or_foreign_file_is_refused_clearly(tmp_path: Path) -> None:
    data = sweep(repeat=1, users=(1,)).to_json()
    (tmp_path / "results.json").write_text(json.dumps({**data, "schema": SWEEP_SCHEMA + 1}))
    with pytest.raises(ValueError, match="newer specdeploy"):
        SweepResults.load(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({"meta": {}, "runs": []}))
    with pytest.raises(ValueError, match="not a load test's results.json"):
        SweepResults.load(tmp_path)
    (tmp_path / "capacity.json").write_text(json.dumps({"schema": 1, "variants": []}))
    with pytest.raises(ValueError, match="not a capacity search's capacity.json"):
        CapacityResults.load(tmp_path)


def test_a_capacity_search_of_schema_1_loads(tmp_path: Path) -> None:
    level = CapacityLevel.of(LevelResult(rate=1.0, repeat=1, status="ok", client=ClientFigures(ok=4)), variant="baseline",
                             phase="search", meets_targets=True, why="met every target")
    data = CapacityResults(slo="ttft_p95=1000ms", variants=["baseline"], levels=[level]).to_json()
    (tmp_path / "capacity.json").write_text(json.dumps({**data, "schema": 1}))
    loaded = CapacityResults.load(tmp_path)
    assert loaded.schema == CAPACITY_SCHEMA and loaded.levels == [level] and loaded.levels[0].variant == "baseline"


def test_compare_reads_a_report_an_older_kit_wrote(tmp_path: Path) -> None:
    """`make compare` on a report of schema 2 (the plain-object results.json of the last version)."""
    data = sweep(repeat=1, users=(1, 8)).to_json()
    (tmp_path / "results.json").write_text(json.dumps({**data, "schema": 2}))
    shown = subprocess.run([sys.executable, "-m", "loadtest", "compare", str(tmp_path)], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "spec-k4" in shown.stdout and "baseline" in shown.stdout
