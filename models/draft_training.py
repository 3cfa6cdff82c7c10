"""The SmolLM2 target's draft, trained by the kit: the target answers the training prompts with
its top log-probabilities, and narrow Llama drafts with its tokenizer learn to match them.

Three phases, each resumable from what it wrote to the run folder (`make models REBUILD=1`):

1. **collect**: a vLLM server of the target answers `draft_prompts.training_prompts` (chat through
   its own chat template, code as plain continuation) at the recipe's temperatures, returning its
   top-20 log-probabilities at every answer position (`distill.collect`); answers are appended
   to `answers.jsonl` as they come.
2. **train**: each candidate architecture (`DraftRecipe.candidates`) trains on the same answers
   with distill's loss (KL over the target's top tokens plus one bucket for the rest). Its
   embeddings, tied with its head, are the target's projected on their first principal
   directions and stay frozen: the answers are too few to learn 49,152 rows, the projection
   keeps what tells tokens apart. Checkpoints every `checkpoint_every_s` seconds.
3. **evaluate**: on held-out answers, greedy agreement with the target and the expected
   acceptance of a sampled draft (sum of min(p, q) over the target's top tokens); the best
   candidate (acceptance at T=1, ties to the cheaper) is saved in bf16 as the shipped draft.

    python -m models.draft_training rebuild --out models/smollm2_draft    # all three, resumable
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from models.draft_prompts import read_jsonl, training_prompts, write_jsonl

log = logging.getLogger("specdeploy")


@dataclass(frozen=True)
class Candidate:
    """One draft architecture: a Llama with the target's vocabulary and tied embeddings."""

    name: str
    layers: int
    width: int
    ffn: int

    @property
    def heads(self) -> int:
        return self.width // 64  # head size 64: vLLM's CPU attention supports it, as the target's


@dataclass(frozen=True)
class DraftRecipe:
    """Every knob of the draft's training."""

    seed: int = 20261128
    chat_prompts: int = 24000  # chat requests: general, code questions, arithmetic (draft_prompts)
    code_prompts: int = 8000  # code starts cut from the standard library
    temperatures: tuple[float, ...] = (0.7, 1.0)  # each prompt is answered once, at one of these in turn
    top_logprobs: int = 20  # the target's top log-probabilities kept per answer position (vLLM's maximum)
    max_new_tokens: int = 192  # longest answer; many answers end earlier at <|im_end|>
    collect_seconds: int = 2100  # the collection's length: answers in this long (docs/results.md, R53)
    heldout_every: int = 20  # every 20th answer is held out for the evaluation
    candidates: tuple[Candidate, ...] = (Candidate("w256-l2", 2, 256, 768), Candidate("w128-l2", 2, 128, 384))
    # ordered cheapest last: a tie goes to the later (cheaper) one
    epochs: int = 2
    batch: int = 16  # answers per step
    max_len: int = 512  # longest prompt + answer trained on (cut from the left)
    lr: float = 3e-3
    warmup: int = 10
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    checkpoint_every_s: int = 120


RECIPE = DraftRecipe()


def load_target(folder: Path) -> tuple[Any, Any]:
    """The target's tokenizer and model (float32: it gives the draft its embeddings and shapes)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    return tok, AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def encode_prompt(tok: Any, prompt: dict) -> list[int]:
    if "messages" in prompt:
        return tok.apply_chat_template(prompt["messages"], add_generation_prompt=True, tokenize=True,
                                       return_dict=False)
    return tok(prompt["prompt"]).input_ids


# ---- phase 1: the target's answers ----

def collect(recipe: DraftRecipe, tok: Any, prompts: list[dict], base_url: str, model: str, answers: Path,
            max_seconds: float | None = None, parallel: int = 64) -> list[dict]:
    """The served target's answers to `prompts` with its top log-probabilities, appended to
    `answers` (JSONL) as they come; prompts already answered there are skipped (resumable)."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    from tqdm import tqdm

    from distill.collect import complete

    done = {json.loads(line)["id"] for line in answers.read_text().splitlines()} if answers.is_file() else set()
    todo = [(i, p) for i, p in enumerate(prompts) if p["id"] not in done]
    start = time.monotonic()
    with ThreadPoolExecutor(parallel) as pool, answers.open("a") as out, \
            tqdm(total=len(prompts), initial=len(done), desc="target answers", unit="answer") as bar:
        pending: dict[Any, dict] = {}
        queue = iter(todo)

        def submit() -> bool:
            if max_seconds is not None and time.monotonic() - start > max_seconds:
                return False
            nxt = next(queue, None)
            if nxt is None:
                return False
            i, p = nxt
            temperature = recipe.temperatures[i % len(recipe.temperatures)]
            future = pool.submit(complete, base_url, model, encode_prompt(tok, p), recipe.max_new_tokens,
                                 temperature, None, recipe.top_logprobs)
            pending[future] = {"id": p["id"], "category": p["category"], "temperature": temperature}
            return True

        for _ in range(parallel):
            submit()
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                meta = pending.pop(future)
                e = future.result()
                row = {**meta, "prompt_ids": list(e.prompt_ids), "answer_ids": list(e.completion_ids),
                       "top": [{str(k): round(v, 4) for k, v in pos.items()} for pos in e.top or ()]}
                out.write(json.dumps(row) + "\n")
                out.flush()
                bar.update()
                submit()
    return load_answers(answers)


def load_answers(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def as_examples(rows: list[dict]) -> list[Any]:
    """Answers as distill's training examples (its loss: KL over the target's top tokens + the rest)."""
    from distill.collect import Example

    return [Example(tuple(r["prompt_ids"]), tuple(r["answer_ids"]),
                    tuple({int(k): v for k, v in pos.items()} for pos in r["top"]) if r["top"] else None,
                    r["temperature"]) for r in rows]


# ---- phase 2: the drafts ----

def make_draft(candidate: Candidate, target: Any) -> Any:
    """A Llama draft with the target's vocabulary, special tokens and rope; embeddings (tied with
    the head) start as the target's projected on their first `width` principal directions."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tc = target.config
    config = LlamaConfig(vocab_size=tc.vocab_size, hidden_size=candidate.width, intermediate_size=candidate.ffn,
                         num_hidden_layers=candidate.layers, num_attention_heads=candidate.heads,
                         num_key_value_heads=candidate.heads, head_dim=64, hidden_act="silu",
                         max_position_embeddings=2048, rms_norm_eps=tc.rms_norm_eps,
                         rope_parameters=getattr(tc, "rope_parameters", None) or {"rope_type": "default",
                                                                                   "rope_theta": 100000.0},
                         tie_word_embeddings=True, bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id,
                         pad_token_id=getattr(tc, "pad_token_id", None))
    draft = LlamaForCausalLM(config)
    with torch.no_grad():
        emb = target.get_input_embeddings().weight.float().cpu()
        centered = emb - emb.mean(0)
        _, _, v = torch.linalg.svd(centered[torch.randperm(emb.shape[0])[:16384]], full_matrices=False)
        projected = emb @ v[:candidate.width].T
        projected *= emb.norm(dim=1).mean() / projected.norm(dim=1).mean()
        draft.get_input_embeddings().weight.copy_(projected)
        # Final hidden states have RMS 1 times this norm's weight: with rows of this length the
        # logits' spread starts near 2 (not tens, which begins training at a huge KL).
        draft.model.norm.weight.fill_(2.0 / float(projected.norm(dim=1).mean()))
    draft.tie_weights()
    return draft


def train_candidate(recipe: DraftRecipe, candidate: Candidate, target: Any, examples: list[Any], pad_id: int,
                    run: Path) -> tuple[Any, dict[str, Any]]:
    """One candidate trained on `examples` (resumes from run/<name>.pt); the draft and its figures."""
    import torch

    from distill.train import position_tensors, top_kl
    from models.training import Checkpoints, Loop, progress

    torch.manual_seed(recipe.seed)
    draft = make_draft(candidate, target)
    draft.get_input_embeddings().weight.requires_grad_(False)  # frozen: see the module's docstring
    steps = math.ceil(recipe.epochs * len(examples) / recipe.batch)
    decay = max(1, steps - recipe.warmup)
    loop = Loop(draft, lr=recipe.lr, weight_decay=recipe.weight_decay, betas=(0.9, 0.95),
                schedule=lambda s: (s + 1) / recipe.warmup if s < recipe.warmup else
                recipe.min_lr_ratio + (1 - recipe.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * (s - recipe.warmup) / decay)))
    # Loop's AdamW holds every parameter; a frozen one gets no gradient, so it never moves.
    checkpoints = Checkpoints(run)
    start, losses = 0, []
    if state := checkpoints.load(candidate.name):
        draft.load_state_dict(state["model"])
        loop.load_state_dict(state["loop"])
        start, losses = state["step"], state["losses"]
        log.info("resuming %s at step %d of %d", candidate.name, start, steps)
    rng = random.Random(recipe.seed)
    order = [i for _ in range(recipe.epochs) for i in rng.sample(range(len(examples)), len(examples))]
    batches = ([examples[j] for j in order[b * recipe.batch:(b + 1) * recipe.batch]] for b in range(start, steps))
    started = last_save = time.monotonic()
    bar = progress(total=steps, initial=start, desc=f"train draft {candidate.name}", unit="step")

    def after(step: int, loss: float) -> None:
        nonlocal last_save
        losses.append(round(loss, 4))
        bar.update()
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
        if time.monotonic() - last_save > recipe.checkpoint_every_s or step == steps - 1:
            checkpoints.save(candidate.name, {"model": draft.state_dict(), "loop": loop.state_dict(),
                                              "step": step + 1, "losses": losses})
            last_save = time.monotonic()

    def loss(t: Any) -> Any:
        # The head (49,152 rows) only where the target's answer is known: most of a step's arithmetic.
        hidden = draft.model(input_ids=t.input_ids, attention_mask=t.attention_mask).last_hidden_state
        return top_kl(draft.lm_head(hidden[t.rows, t.cols]), t)

    loop.run((position_tensors(b, pad_id, recipe.max_len, "cpu") for b in batches), loss, range(start, steps),
             on_step=after)
    bar.close()
    return draft, {"steps": steps, "seconds": round(time.monotonic() - started, 1), "losses": losses[::10],
                   "parameters": sum(p.numel() for p in draft.parameters()),
                   "trained_parameters": sum(p.numel() for p in draft.parameters() if p.requires_grad)}


# ---- phase 3: evaluation and the saved draft ----

def acceptance(model: Any, examples: list[Any], pad_id: int) -> dict[str, float]:
    """Teacher-forced on held-out answers: greedy agreement with the target, and the expected
    acceptance of a draft sampled at T=1, sum over the target's top tokens of min(p, q) (a lower
    bound: the mass beyond the top 20 is left out)."""
    import torch

    from distill.train import position_tensors

    agree = total = 0
    accept = 0.0
    with torch.inference_mode():
        for i in range(0, len(examples), 16):
            t = position_tensors(list(examples[i:i + 16]), pad_id, 1024, "cpu")
            logits = model(input_ids=t.input_ids, attention_mask=t.attention_mask).logits
            q = logits[t.rows, t.cols].float().softmax(-1)
            agree += (q.argmax(-1) == t.ids[:, 0]).sum().item()
            accept += torch.minimum(q.gather(1, t.ids), t.probs).sum().item()
            total += len(q)
    return {"greedy_agreement": round(agree / total, 4), "acceptance_t1": round(accept / total, 4), "positions": total}


def save_draft(draft: Any, tok: Any, out: Path) -> None:
    """The draft as a Hugging Face folder in bf16."""
    import torch
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    copy = type(draft)(draft.config)
    copy.load_state_dict(draft.state_dict())
    copy.tie_weights()
    copy = copy.to(torch.bfloat16)
    copy.config.dtype = "bfloat16"
    copy.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id).save_pretrained(str(out))


def fit(recipe: DraftRecipe, target_dir: Path, answers: Path, run: Path, out: Path) -> dict[str, Any]:
    """Train every candidate on the collected answers, evaluate them on the held-out ones, and save
    the best in `out` (config, bf16 weights, generation config, training.json)."""
    import torch

    from models.smollm2 import BuildError

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    tok, target = load_target(target_dir)
    rows = load_answers(answers) if answers.is_file() else []
    if len(rows) < 2 * recipe.heldout_every:
        raise BuildError(f"{answers} holds {len(rows)} answers: too few to train a draft (collect first)")
    held = as_examples(rows[::recipe.heldout_every])
    examples = as_examples([r for i, r in enumerate(rows) if i % recipe.heldout_every])
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    results, drafts = {}, {}
    for candidate in recipe.candidates:
        draft, figures = train_candidate(recipe, candidate, target, examples, pad, run)
        figures["heldout"] = acceptance(draft, held, pad)
        results[candidate.name], drafts[candidate.name] = figures, draft
        log.info("%s: held-out greedy agreement %.1f%%, expected acceptance at T=1 %.1f%%", candidate.name,
                 100 * figures["heldout"]["greedy_agreement"], 100 * figures["heldout"]["acceptance_t1"])
    best = max(reversed(list(results)), key=lambda n: round(results[n]["heldout"]["acceptance_t1"], 2))
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_draft(drafts[best], tok, tmp)
    record = {"recipe": asdict(recipe), "chosen": best, "candidates": results, "answers": len(rows),
              "answer_tokens": sum(len(r["answer_ids"]) for r in rows), "heldout_answers": len(held),
              "categories": {c: sum(1 for r in rows if r["category"] == c) for c in sorted({r["category"] for r in rows})},
              "target": json.loads((target_dir / "build.json").read_text()) if (target_dir / "build.json").is_file()
              else str(target_dir), "torch": torch.__version__,
              "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (tmp / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return record


def serve_target(target_dir: Path, port: int) -> subprocess.Popen:
    """A vLLM server of the target for the collection (returning up to 20 log-probabilities)."""
    from models.smollm2 import SERVED_NAME

    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "3")}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target_dir),
           "--served-model-name", SERVED_NAME, "--max-model-len", "1024", "--max-num-seqs", "64",
           "--port", str(port), "--max-logprobs", str(RECIPE.top_logprobs)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def rebuild(recipe: DraftRecipe, run: Path, out: Path) -> dict[str, Any]:
    """`make models REBUILD=1`: collect (a server of the target, `collect_seconds` long; skipped when
    the run folder has them), then fit. Interrupted, the same command resumes."""
    import requests

    from models.smollm2 import SERVED_NAME, BuildError, ensure_target

    target_dir = ensure_target()
    run.mkdir(parents=True, exist_ok=True)
    prompts, answers = run / "prompts.jsonl", run / "answers.jsonl"
    if not prompts.is_file():
        write_jsonl(training_prompts(recipe.seed, recipe.chat_prompts, recipe.code_prompts), prompts)
    marker = run / "collected"
    if not marker.is_file():
        port = 8000 + random.Random().randint(1000, 8999)
        server = serve_target(target_dir, port)
        try:
            deadline = time.monotonic() + 900
            while True:
                try:
                    if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                        break
                except requests.RequestException:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise BuildError(f"the target's server did not start (exit {server.poll()}); run "
                                     f"python -m vllm.entrypoints.openai.api_server --model {target_dir} to see why")
                time.sleep(3)
            done = len(load_answers(answers)) if answers.is_file() else 0
            elapsed = float(marker.with_suffix(".seconds").read_text()) if marker.with_suffix(".seconds").is_file() else 0
            started = time.monotonic()
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(target_dir))
            collect(recipe, tok, list(read_jsonl(prompts)), f"http://127.0.0.1:{port}", SERVED_NAME, answers,
                    max(0.0, recipe.collect_seconds - elapsed))
            marker.with_suffix(".seconds").write_text(str(elapsed + time.monotonic() - started))
            log.info("collected %d answers (%d before this run)", len(load_answers(answers)), done)
        finally:
            server.terminate()
            server.wait(60)
        marker.write_text("")
    return fit(recipe, target_dir, answers, run, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.draft_training", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="the served target's answers to the training prompts")
    c.add_argument("--url", required=True)
    c.add_argument("--model", required=True)
    c.add_argument("--target", type=Path, required=True, help="the target's folder (its tokenizer)")
    c.add_argument("--prompts", type=Path, required=True)
    c.add_argument("--answers", type=Path, required=True)
    c.add_argument("--max-seconds", type=float, default=None)
    c.add_argument("--parallel", type=int, default=64)
    f = sub.add_parser("fit", help="train the candidates on collected answers and save the best")
    f.add_argument("--target", type=Path, required=True)
    f.add_argument("--answers", type=Path, required=True)
    f.add_argument("--run", type=Path, required=True, help="checkpoints go here")
    f.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("rebuild", help="collect and fit, resumable (make models REBUILD=1)")
    r.add_argument("--run", type=Path, default=None, help="run folder (default: under the cache)")
    r.add_argument("--out", type=Path, default=None, help="default: the shipped draft's folder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from models.smollm2 import DRAFT_WEIGHTS

    if args.cmd == "fit":
        record = fit(RECIPE, args.target, args.answers, args.run, args.out)
        print(json.dumps({k: record[k] for k in ("chosen", "answers", "answer_tokens")}))
        return 0
    if args.cmd == "rebuild":
        from models.cache import cache_root

        record = rebuild(RECIPE, args.run or cache_root() / "smollm2" / "draft-run", args.out or DRAFT_WEIGHTS)
        print(json.dumps({k: record[k] for k in ("chosen", "answers", "answer_tokens")}))
        return 0
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.target))
    if args.cmd == "collect":
        if not args.prompts.is_file():
            write_jsonl(training_prompts(RECIPE.seed, RECIPE.chat_prompts, RECIPE.code_prompts), args.prompts)
        rows = collect(RECIPE, tok, list(read_jsonl(args.prompts)), args.url, args.model, args.answers,
                       args.max_seconds, args.parallel)
        print(f"{len(rows)} answers, {sum(len(r['answer_ids']) for r in rows)} tokens in {args.answers}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
