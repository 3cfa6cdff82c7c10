"""Ask the served target for its continuations of the training prompts, with its top
log-probabilities at every generated position: what the draft learns to predict.

Prompts go as token ids (tokenized here with the target's tokenizer), and tokens come back as
ids (`return_tokens_as_token_ids`), so the draft trains on exactly the sequence the target saw.
vLLM's log-probabilities are the model's raw distribution (before temperature), which is what
the draft should match whatever temperature users send.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import requests
from tqdm import tqdm

from loadtest.traffic.client import auth_headers


@dataclass(frozen=True)
class Example:
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    top: tuple[dict[int, float], ...] | None
    """The target's top log-probabilities at each completion position (None: not returned)."""
    temperature: float


def _token_id(token: str) -> int:
    return int(token.removeprefix("token_id:"))  # how `return_tokens_as_token_ids` spells a token


def complete(base_url: str, model: str, prompt_ids: list[int], max_tokens: int, temperature: float, seed: int | None,
             top_logprobs: int, headers: dict[str, str] | None = None, timeout_s: float = 300) -> Example:
    """One continuation; `seed` None sends none (vLLM 0.32's CPU sampler fails a batch that holds a
    seeded request with top log-probabilities: "CPU Generator does not use offset")."""
    body = {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": temperature,
            "return_tokens_as_token_ids": True, **({"seed": seed} if seed is not None else {}),
            **({"logprobs": top_logprobs} if top_logprobs else {})}
    resp = requests.post(f"{base_url}/v1/completions", json=body, headers=headers, timeout=timeout_s)
    if resp.status_code != 200:
        raise RuntimeError(f"the target server answered {resp.status_code}: {resp.text[:300]}")
    logprobs = resp.json()["choices"][0].get("logprobs") or {}
    completion = [_token_id(t) for t in logprobs.get("tokens") or []]
    if not completion:
        raise RuntimeError("the target server returned no token ids (needs vLLM's return_tokens_as_token_ids)")
    positions = logprobs.get("top_logprobs") if top_logprobs else None
    top = tuple({_token_id(k): v for k, v in pos.items()} for pos in positions) if positions else None
    return Example(tuple(prompt_ids), tuple(completion), top, temperature)


def collect(base_url: str, model: str, tokenizer: Any, prompts: list[str] | tuple[str, ...], max_tokens: int,
            temperatures: list[float], top_logprobs: int, api_key_env: str = "", parallel: int = 8,
            desc: str = "collect") -> list[Example]:
    """One continuation of every prompt at each temperature, `parallel` requests at a time (the
    server batches them), with a progress bar."""
    headers = auth_headers(api_key_env)
    jobs = [(tokenizer(p).input_ids, t, seed) for seed, p in enumerate(prompts) for t in temperatures]
    with ThreadPoolExecutor(parallel) as pool, tqdm(total=len(jobs), desc=desc, unit="req") as bar:
        futures = [pool.submit(complete, base_url, model, ids, max_tokens, t, seed, top_logprobs, headers)
                   for ids, t, seed in jobs]
        examples = []
        for future in futures:
            examples.append(future.result())
            bar.update()
    return examples
