"""`make distill`: refusals before any work, the training step on its own, and the whole run on the
embedded pair (a real target server collecting, a real load test measuring before and after)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from conftest import BASELINE, TEST_KEY_ENV
from test_config import write_tokenizer

from deploy import ConfigError, LaunchPlan, Server, load_config
from deploy.config import as_overrides
from deploy.preflight import Machine
from distill.collect import Example
from distill.data import load_data, stdlib_test_prompts, write_prompts
from distill.fit import Needs, fit_problems
from distill.run import (Collected, DataRecord, DistillResult, DistillSettings, Measured, MeasuredReport, MeasuredRow,
                         OfflineCheck, check, describe, distill)
from distill.train import Offline, TrainSettings, TrainStats, evaluate, fine_tune
from loadtest.measurement.results import SweepResults

REPO = Path(__file__).resolve().parents[1]


def test_a_data_file_that_cannot_be_used_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_data(tmp_path / "missing.jsonl")
    few = write_prompts([f"def f{i}():\n" for i in range(6)], tmp_path / "few.jsonl")
    with pytest.raises(ValueError, match="5 distinct training and 1 held-out prompts"):
        load_data(few)
    repeated = write_prompts(["same prompt"] * 50, tmp_path / "repeated.jsonl")
    with pytest.raises(ValueError, match="1 distinct training"):
        load_data(repeated)
    (tmp_path / "bad.jsonl").write_text('{"text": "no prompt"}\n')
    with pytest.raises(ValueError, match="prompt"):
        load_data(tmp_path / "bad.jsonl")
    data = load_data(stdlib_test_prompts(tmp_path / "tests.jsonl", count=50))
    assert (len(data.train), len(data.held_out)) == (40, 10) and not set(data.train) & set(data.held_out)


def test_a_run_that_would_not_fit_is_refused_with_what_it_needs() -> None:
    small = Machine(gpus=0, gpu_memory_gib=0, host_memory_gib=16, cpu_ids=(0, 1))
    need, problems = fit_problems(7e9, 100_000, 3, small, max_minutes=60)
    assert need.memory_gib > 100 and "needs about" in problems[0] and "a GPU of at least" in problems[0]
    need, problems = fit_problems(1e8, 10_000_000, 3, small, max_minutes=60)
    assert need.minutes > 60 and "would take about" in problems[0]
    need, problems = fit_problems(3.4e5, 60_000, 3, small, max_minutes=60)  # the embedded draft: minutes at most
    assert not problems and need.minutes < 5


def test_check_refuses_a_draft_with_other_tokens_and_a_config_without_a_draft_model(tmp_path: Path,
                                                                                     embedded_pair) -> None:
    from tokenizers import Tokenizer

    draft = tmp_path / "draft"
    shutil.copytree(embedded_pair.draft, draft)
    vocab = Tokenizer.from_file(str(draft / "tokenizer.json")).get_vocab()
    write_tokenizer(draft, {token: (i + 1) % len(vocab) for token, i in vocab.items()})  # same size, other ids
    config = yaml.safe_load((REPO / "configs" / "embedded-code.yaml").read_text())
    config["speculation"]["model"] = str(draft)
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(config))
    data = write_prompts([f"def f{i}():\n" for i in range(20)], tmp_path / "data.jsonl")
    with pytest.raises(ConfigError, match="not the same ones"):
        check(DistillSettings(str(tmp_path / "other.yaml"), data=str(data), out=tmp_path / "out"))
    config["speculation"] = {"drafter": "ngram"}
    (tmp_path / "ngram.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match="fine-tunes a draft model"):
        check(DistillSettings(str(tmp_path / "ngram.yaml"), data=str(data), out=tmp_path / "out"))
    assert not (tmp_path / "out").exists()  # refused before any work


def test_training_pulls_the_draft_toward_the_targets_distribution(one_torch_thread: None) -> None:
    """A random draft and a 'target' that continues 1, 2, 3, ... (mod 50) with its probability
    mass split 0.9 / 0.1: after fine-tuning the draft predicts the target's top token."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, pad_token_id=0))

    def example(start: int) -> Example:
        prompt = tuple(3 + (start + i) % 50 for i in range(5))
        completion = tuple(3 + (start + 5 + i) % 50 for i in range(12))
        top = tuple({t: -0.105, 3 + (t - 3 + 7) % 50: -2.303} for t in completion)  # 0.9 and 0.1
        return Example(prompt, completion, top, 0.0)

    train = [example(s) for s in range(0, 50, 2)]
    held = [example(s) for s in range(1, 50, 10)]
    before = evaluate(model, held, pad_id=0)
    stats = fine_tune(model, train, TrainSettings(epochs=30, lr=3e-3, batch_size=8), pad_id=0)
    after = evaluate(model, held, pad_id=0)
    assert stats.loss_last < stats.loss_first and after.loss < before.loss
    assert before.greedy_agreement < 0.2 < 0.9 < after.greedy_agreement


def test_the_result_reads_back_and_its_page_tables_each_draft_before_and_after() -> None:
    rows = [MeasuredRow(0.0, 1, "original", 0.6, 2.1, 1.3, runs=2), MeasuredRow(0.0, 1, "distilled", 0.7, None, 1.4)]
    result = DistillResult("x.yaml", {}, DataRecord("d.jsonl", "abc", 40, 10), Needs(0.1, 2.0, "cpu"), "out",
                           Collected(64, 2048, True), TrainStats(10, 3.2, 1.5, 0.9),
                           OfflineCheck(Offline(0.8, 1.2, 100), Offline(0.9, 1.0, 100)), "draft", "x-distilled.yaml",
                           "measured", Measured(rows, [MeasuredReport(0.0, "measure-T0/report.md", "ok")]))
    assert DistillResult.from_json(json.loads(json.dumps(result.to_json()))) == result
    text = describe(result)
    assert "80.0% -> 90.0%" in text and "| 0 | 1 | 60.0% | 70.0% | 2.10 | - | 1.30x | 1.40x |" in text


def _served(plan: LaunchPlan) -> list[str]:
    """A server's command without what differs between two servers of one configuration."""
    argv = list(plan.argv)
    for flag in ("--port", "--kv-cache-memory-bytes"):
        at = argv.index(flag)
        del argv[at:at + 2]
    return argv


@pytest.mark.engine
def test_distill_collects_from_the_served_target_and_writes_a_better_draft(tmp_path: Path, embedded_pair, servers,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole run but the load test: a real target server collects its continuations, the draft
    is fine-tuned on them, and the draft folder and the config that serves it are written. The
    target distill asks for (the code pair, speculation off, the session's API key) is the one the
    session's baseline server runs: distill is handed that server instead of starting its twin (its
    own start runs in `make test-full`'s measured distillation)."""
    target = servers.get(*BASELINE)

    @contextmanager
    def the_running_target(plan: LaunchPlan, *args: object, **kwargs: object) -> Iterator[Server]:
        assert _served(plan) == _served(target.plan) and plan.env == target.plan.env, plan.argv
        yield target

    monkeypatch.setattr("distill.run.start_server", the_running_target)
    data = stdlib_test_prompts(tmp_path / "tests.jsonl", count=40)
    # A short, gentle fine-tune: the shipped draft starts close to the target, and 4 epochs at 5e-4
    # on these 64 sequences took it further away on the held-out prompts.
    settings = DistillSettings("embedded-code.yaml", as_overrides([f"server.api_key_env={TEST_KEY_ENV}"]), data=str(data),
                               max_tokens=32, train=TrainSettings(epochs=2, lr=1e-4), measure=False,
                               output=tmp_path / "default-distilled.yaml", out=tmp_path / "out")
    result = distill(settings)
    assert result.status == "distilled", result
    assert result.collected and result.collected.train_sequences == 64 and result.collected.with_logprobs
    assert result.draft and result.offline
    record = json.loads((Path(result.draft) / "distill.json").read_text())
    assert record["base_draft"] == str(embedded_pair.draft) and record["data"]["sha256"]
    assert result.offline.after.loss < result.offline.before.loss  # closer to the target on prompts it never saw
    config = load_config(tmp_path / "default-distilled.yaml")
    assert config.speculation.model == result.draft and config.speculation.draft_sampling == "probabilistic"
    assert result.measured is None and (tmp_path / "out" / "distill.md").is_file()


@pytest.mark.engine
@pytest.mark.full
def test_distill_measures_the_original_and_the_distilled_draft(tmp_path: Path, embedded_pair, measurement) -> None:
    data = stdlib_test_prompts(tmp_path / "tests.jsonl", count=40)
    settings = DistillSettings("embedded-code.yaml", data=str(data), max_tokens=32, train=TrainSettings(epochs=4, lr=5e-4),
                               batches=[1], measure_temperatures=[0.0], repeat=2, requests=8, measure_max_tokens=64,
                               output=tmp_path / "default-distilled.yaml", out=tmp_path / "out")
    result = distill(settings)
    assert result.status == "measured" and result.measured, result
    rows = {r.draft: r for r in result.measured.rows}
    assert set(rows) == {"original", "distilled"}
    runs = SweepResults.load(tmp_path / "out" / "measure-T0")
    baseline = next(v for v in runs.variants if v.name == "baseline")
    assert len(baseline.levels) == 2  # each draft's speedup pairs its runs with the baseline's beside them
    for row in rows.values():
        assert row.acceptance is not None and row.acceptance > 0.1 and row.runs == 2
        # Both drafts make the cost-faithful target faster at batch 1 (the embedded pair's reason to exist).
        assert row.speedup is not None and row.speedup > 1, row
    assert "| 0 | 1 |" in (tmp_path / "out" / "distill.md").read_text()
