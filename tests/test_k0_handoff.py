"""When a plugin drafts nothing: K = 0 steps of a schedule skip the engine's draft hand-off
(plugins/k0_handoff.py), and requests above `draft_max_temperature` get no drafts
(plugins/temperature_gate.py).

The bigram plugin drafts K = 2 alone and nothing at 2 or more running requests; the skipped
hand-off must change no output and must not stop drafting when the batch shrinks again. Both tests
share one server, gated at T = 0.5."""

from __future__ import annotations

import pytest

from conftest import CODE_PROMPTS, complete, greedy_token_ids, metric_total

SCHEDULE = ["speculation.num_speculative_tokens=2", "speculation.schedule=[[1, 1, 2], [2, 64, 0]]",
            "speculation.draft_max_temperature=0.5"]
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTED = "vllm:spec_decode_num_draft_tokens_total"


@pytest.mark.engine
def test_k0_steps_skip_the_handoff_and_change_nothing(servers, embedded_pair) -> None:
    server = servers.get("embedded-bigram", SCHEDULE)
    alone = [complete(server, p, max_tokens=48)["token_ids"] for p in CODE_PROMPTS]  # K = 2, handed off
    accepted = metric_total(server, ACCEPTED)
    assert accepted > 0, "no draft accepted at batch 1: the schedule's K = 2 did not reach the drafter"
    together = greedy_token_ids(server, CODE_PROMPTS, max_tokens=48)  # 4 running: K = 0, skipped
    assert together == alone  # greedy output is the target's whichever path a step took
    log = server.log_path.read_text()
    assert "draft hand-off to the scheduler is skipped" in log, "no K=0 step skipped its hand-off"
    after_k0 = metric_total(server, ACCEPTED)
    complete(server, CODE_PROMPTS[0], max_tokens=48)  # alone again: drafting resumes
    assert metric_total(server, ACCEPTED) > after_k0


@pytest.mark.engine
def test_requests_above_the_temperature_gate_get_no_drafts(servers, embedded_pair) -> None:
    """vLLM tells custom proposers no temperatures: the gate reaches the plugin only through the
    general plugin that hands it the runner's, so drafts at T=1 mean that path is broken."""
    server = servers.get("embedded-bigram", SCHEDULE)
    for temperature, gets_drafts in ((1.0, False), (0.3, True), (0.0, True), (1.0, False)):
        before = metric_total(server, DRAFTED)
        complete(server, CODE_PROMPTS[1], max_tokens=32, temperature=temperature, seed=7)
        drafted = metric_total(server, DRAFTED) - before
        assert (drafted > 0) == gets_drafts, f"T={temperature}: {drafted:g} draft tokens"
