"""Synthetic acceptance on CPUs (plugins/vllm_fixes.py): vLLM 0.32's CPU rejection kernels lack the
synthetic branch; the kit supplies it. Checked against the Triton kernels' loop, inside vLLM's own
`rejection_sample`, and on a real engine whose counters must show the rates asked for."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import torch

from plugins import vllm_fixes
from conftest import auth_headers

PLACEHOLDER = -1


def kernel_loop(cu: list[int], drafts: list[int], rejected: list[int], bonus: list[int], rows: list[bool],
                uniform: list[float], rates: list[float], max_spec_len: int) -> list[list[int]]:
    """The Triton kernels' synthetic branch, request by request (vllm/v1/sample/rejection_sampler.py)."""
    out = [[PLACEHOLDER] * (max_spec_len + 1) for _ in cu]
    for i, end in enumerate(cu):
        if not rows[i]:
            continue
        start = cu[i - 1] if i else 0
        rejected_yet = False
        for pos in range(end - start):
            if rejected_yet:
                break
            draft = drafts[start + pos]
            accepted = draft >= 0 and uniform[start + pos] < rates[pos]
            out[i][pos] = draft if accepted else rejected[start + pos]
            rejected_yet = not accepted
        if not rejected_yet:
            out[i][end - start] = bonus[i]
    return out


@pytest.mark.parametrize("seed", range(5))
def test_synthetic_sample_is_the_kernels_loop(seed: int) -> None:
    """Random batches (drafts of 0..K tokens, padding drafts of -1, a subset of rows): the vectorised
    branch writes exactly what the kernels' loop writes."""
    g = torch.Generator().manual_seed(seed)
    k, batch = 4, 9
    counts = torch.randint(0, k + 1, (batch,), generator=g).tolist()
    cu = torch.tensor(counts).cumsum(0).tolist()
    n = cu[-1]
    drafts = torch.randint(0, 50, (n,), generator=g)
    drafts[torch.rand(n, generator=g) < 0.1] = -1
    rejected, bonus = torch.randint(50, 100, (n,), generator=g), torch.randint(100, 150, (batch, 1), generator=g)
    uniform = torch.rand(n, generator=g, dtype=torch.float64)
    rates = torch.tensor([0.9, 0.7, 0.5, 0.3])
    rows = torch.rand(batch, generator=g) < 0.7
    out = torch.full((batch, k + 1), PLACEHOLDER, dtype=torch.int32)
    vllm_fixes.synthetic_sample(out, torch.tensor(cu, dtype=torch.int32), drafts.to(torch.int32), rejected,
                                bonus, rows, uniform, rates, k)
    assert out.tolist() == kernel_loop(cu, drafts.tolist(), rejected.tolist(), bonus[:, 0].tolist(), rows.tolist(),
                                       uniform.tolist(), rates.tolist(), k)


def test_vllm_rejection_sample_accepts_at_the_rates_on_cpu() -> None:
    """In a fresh interpreter, in a worker's order (general plugins, then vLLM's CPU kernels):
    vLLM's own `rejection_sample` in synthetic mode runs (vLLM alone asserts), for greedy and
    sampled requests, and accepts position i of 20,000 drafts at the unconditional rate asked
    (within 4.5 standard errors)."""
    script = """
import json, sys, torch
from plugins import vllm_fixes
if not vllm_fixes._cpu_overrides_in_use():
    sys.exit(3)
from vllm.plugins import load_general_plugins
from vllm.platforms import current_platform
load_general_plugins()
current_platform.register_triton_kernel_overrides()
from vllm.v1.sample import rejection_sampler as rs
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.spec_decode.utils import unconditional_to_conditional_rates
rates = [0.9, 0.6, 0.3, 0.1]
conditional = torch.tensor(unconditional_to_conditional_rates(rates), dtype=torch.float32)
batch, k, vocab = 20000, 4, 8
torch.manual_seed(0)
out = {}
for greedy in (True, False):
    temperature = torch.full((batch,), 0.0 if greedy else 1.0)
    meta = SamplingMetadata(temperature=None if greedy else temperature, all_greedy=greedy, all_random=not greedy,
                            top_p=None, top_k=None, generators={}, max_num_logprobs=None, no_penalties=True,
                            prompt_token_ids=None, frequency_penalties=torch.zeros(batch),
                            presence_penalties=torch.zeros(batch), repetition_penalties=torch.ones(batch),
                            output_token_ids=[[] for _ in range(batch)], allowed_token_ids_mask=None,
                            bad_words_token_ids={}, logitsprocs=None)
    cu = torch.arange(1, batch + 1, dtype=torch.int32) * k
    # The target's favourite (and the token a rejection emits) is the last one, never drafted.
    drafts = torch.randint(0, vocab - 1, (batch * k,), dtype=torch.int32)
    logits = torch.zeros(batch * k, vocab)
    logits[:, -1] = 20.0
    tokens = rs.rejection_sample(drafts, [k] * batch, k, cu, None, logits,
                                 torch.randint(0, vocab, (batch, 1)), meta, synthetic_mode=True,
                                 synthetic_conditional_rates=conditional)
    accepted = (tokens[:, :k] == drafts.view(batch, k)).int().cumprod(1)
    out["greedy" if greedy else "sampled"] = {"per_position": accepted.float().mean(0).tolist(),
                                              "filled": bool((tokens[:, 0] >= 0).all())}
print(json.dumps(out))
"""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode == 3:
        pytest.skip("vLLM's CPU kernel fallbacks are not in use here")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for kind, figures in result.items():
        assert figures["filled"], f"{kind}: position 0 left as a placeholder"
        for rate, seen in zip([0.9, 0.6, 0.3, 0.1], figures["per_position"]):
            bound = 4.5 * math.sqrt(rate * (1 - rate) / 20000)
            assert abs(seen - rate) <= bound, (kind, figures["per_position"])


# --- on the engine ---------------------------------------------------------------------------------

RATES = [0.9, 0.6, 0.3, 0.1]
SYNTHETIC = ["speculation.extra.rejection_sample_method=synthetic",
             f"speculation.extra.synthetic_acceptance_rates={json.dumps(RATES)}"]
PROMPTS = ["def __init__(self, *args, **kwargs):\n", "import os\nimport sys\n\n\ndef main():\n",
           "class Error(Exception):\n    \"\"\"", "    for i in range(len("]
MAX_TOKENS = 160
Z = 4.5
"""Standard errors of the acceptance bound: a correct engine fails the test with a chance below 1e-5 per position."""


def spec_counters(server) -> tuple[float, list[float]]:
    """(drafts, accepted tokens per position) from the server's /metrics."""
    from loadtest.measurement.prom import parse_metrics

    text = requests.get(f"{server.base_url}/metrics", headers=auth_headers(server), timeout=30).text
    samples = parse_metrics(text)
    drafts = sum(v for _, v in samples.get("vllm:spec_decode_num_drafts_total", []))
    per_pos: dict[int, float] = {}
    for labels, value in samples.get("vllm:spec_decode_num_accepted_tokens_per_pos_total", []):
        position = int(dict(labels)["position"])
        per_pos[position] = per_pos.get(position, 0.0) + value
    return drafts, [per_pos.get(i, 0.0) for i in range(len(RATES))]


def acceptance_bound(rate: float, drafts: float) -> float:
    """Z binomial standard errors of a rate measured over `drafts` drafts (each draft's positions
    are drawn independently of other drafts), at least 0.01."""
    return max(Z * math.sqrt(rate * (1 - rate) / drafts), 0.01)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_counts_the_synthetic_rates_asked(servers, temperature: float) -> None:
    """A real engine (plumbing pair, the default config's draft model, K=4) with `speculation.extra:
    {rejection_sample_method: synthetic, synthetic_acceptance_rates: [0.9, 0.6, 0.3, 0.1]}` starts on
    the CPU, serves every token asked for, and its own per-position counters
    (vllm:spec_decode_num_accepted_tokens_per_pos_total / vllm:spec_decode_num_drafts_total) show
    the rates asked, greedy (vLLM's greedy kernel) and sampled (its random kernel), within
    4.5 binomial standard errors (+-0.03 to +-0.05 at ~1,000 drafts)."""
    server = servers.get("embedded-code", SYNTHETIC)
    drafts0, accepted0 = spec_counters(server)

    def complete(i_prompt: tuple[int, str]) -> dict:
        i, prompt = i_prompt
        body = {"model": server.plan.served_name, "prompt": prompt, "max_tokens": MAX_TOKENS,
                "temperature": temperature, "ignore_eos": True, "seed": i}
        response = requests.post(f"{server.base_url}/v1/completions", json=body, headers=auth_headers(server),
                                 timeout=600)
        response.raise_for_status()
        return response.json()

    with ThreadPoolExecutor(2 * len(PROMPTS)) as pool:  # vLLM wants n = 1 at T=0: each prompt twice
        answers = list(pool.map(complete, enumerate(PROMPTS * 2)))
    for answer in answers:
        assert answer["usage"]["completion_tokens"] == MAX_TOKENS
    drafts1, accepted1 = spec_counters(server)
    drafts = drafts1 - drafts0
    # 8 sequences x 160 tokens at ~2.9 tokens a step: about 440 drafts; fewer would loosen the bound.
    assert drafts >= 300, f"only {drafts:.0f} drafts"
    seen = [(a1 - a0) / drafts for a0, a1 in zip(accepted0, accepted1)]
    for position, (rate, value) in enumerate(zip(RATES, seen)):
        bound = acceptance_bound(rate, drafts)
        assert abs(value - rate) <= bound, (f"T={temperature:g}, position {position}: {value:.3f} accepted, "
                                            f"{rate} asked (bound +-{bound:.3f}, {drafts:.0f} drafts); all: {seen}")


def test_paymap_reads_a_running_servers_acceptance(servers) -> None:
    """`make paymap URL=...` places a deployment on the map by its per-position acceptance from
    /metrics: on the synthetic server that is the rates it was started with."""
    from tuning.paymap import acceptance_from_url

    server = servers.get("embedded-code", SYNTHETIC)
    body = {"model": server.plan.served_name, "prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True}
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        list(pool.map(lambda _: requests.post(f"{server.base_url}/v1/completions", json=body, timeout=600)
                      .raise_for_status(), range(len(PROMPTS))))
    drafts, _ = spec_counters(server)
    rates = acceptance_from_url(server.base_url)
    assert len(rates) == len(RATES)
    for rate, value in zip(RATES, rates):
        assert abs(value - rate) <= acceptance_bound(rate, drafts), (rates, drafts)
