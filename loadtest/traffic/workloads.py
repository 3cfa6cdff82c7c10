"""What the load test sends: prompt sets, and the request body for one prompt.

Built-in sets (`--workload NAME`):
  code   code completion: the start of a Python function/class, the model continues it
  chat   questions as chat messages: about Python, everyday matters, writing and arithmetic
         (needs a model with a chat template)
  edit   repetitive text: a snippet, then an instruction to copy/edit/summarise it and the
         start of the copy, so much of the output repeats the prompt (drafters love this)
  mixed  all of the above, interleaved
  categories  chat prompts in six categories (code, chat, math, summarisation, rewriting, qa: a
         question over a passage), four each: acceptance and speedup are reported per category

A user's file (`--workload path`):
  *.jsonl  one object a line: {"prompt": "..."} or {"messages": [{"role": "user", ...}]},
           optionally "max_tokens" (used only without a fixed length) and "category"; or
           Spec-Bench's question.jsonl: {"question_id": ..., "category": ..., "turns": ["..."]},
           the first turn sent as a chat message, as vLLM's own `SpecBench` loader takes it
  *.json   a ShareGPT dump: [{"conversations": [{"from": "human", "value": ...}, ...]}, ...];
           the first human turn becomes the request (as chat messages)

`NAME:cat,cat` (`--workload categories:code,math`) keeps those categories of a workload. Prompts
with categories are sent round-robin over the categories (a run's first N prompts cover them evenly).

For fair comparisons the output length is fixed by default: `max_tokens` plus vLLM's
`ignore_eos`, so every variant generates exactly the same number of tokens per request.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Api = Literal["auto", "completions", "chat"]
COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Item:
    """One prompt: either plain text (completions API) or chat messages (chat API)."""

    id: str
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    max_tokens: int | None = None
    """Output length from the file (ShareGPT reply length); ignored with a fixed length."""
    category: str | None = None
    """The prompt's category (Spec-Bench's `category`): figures are also given per category."""


@dataclass(frozen=True)
class Workload:
    name: str
    items: tuple[Item, ...]

    def item_for(self, ticket: int, worker: int = 0) -> Item:
        """The prompt of a closed-loop run's `ticket`-th request (of Locust worker `worker`):
        users spread over the prompts in order; workers start at different offsets."""
        return self.items[(worker * 7919 + ticket) % len(self.items)]

    @property
    def categories(self) -> list[str]:
        """The prompts' categories in order of first appearance (empty: the prompts have none)."""
        return list(dict.fromkeys(i.category for i in self.items if i.category))

    def sequence(self, requests: int, workers: int = 0) -> list[Item]:
        """Every prompt a run of `requests` sends, in ticket order per worker: what vLLM's
        benchmark is given, so both clients send the same prompts the same number of times
        (acceptance, hence speed, differs from prompt to prompt)."""
        if workers <= 0:
            return [self.item_for(t) for t in range(requests)]
        return [self.item_for(t, w) for w in range(workers) for t in range(share(requests, workers, w))]


def share(requests: int, workers: int, index: int) -> int:
    """Worker `index`'s part of a run's `requests`, when `workers` Locust workers share them."""
    return requests // workers + (index < requests % workers)


_CODE = [
    "def __init__(self, *args, **kwargs):\n",
    "import os\nimport sys\n\n\ndef main():\n",
    "class Error(Exception):\n    \"\"\"",
    "    for i in range(len(",
    "def _read_config(path):\n    \"\"\"Read a config file and return a dict.\"\"\"\n    with open(path",
    "import re\n\n_PATTERN = re.compile(r",
    "    def __repr__(self):\n        return ",
    "def parse_args(argv=None):\n    parser = argparse.ArgumentParser(",
    "class Queue:\n    def __init__(self, maxsize=0):\n        self.maxsize = maxsize\n",
    "    try:\n        result = self._call(",
    "def copyfile(src, dst, *, follow_symlinks=True):\n    \"\"\"Copy data from src to dst",
    "if __name__ == '__main__':\n",
]

_CHAT = [
    "What is the difference between a list and a tuple in Python?",
    "Explain what a context manager is, with a short example.",
    "How do I read a file line by line in Python?",
    "Write a function that returns the n-th Fibonacci number.",
    "Why is my recursive function hitting the recursion limit?",
    "What does the `yield` keyword do?",
    "How can I sort a dictionary by its values?",
    "Explain the difference between `is` and `==`.",
    # Everyday requests, writing and arithmetic: a chat model's traffic is not only code.
    "What should I pack for a weekend hiking trip?",
    "Write a short thank-you note to a teacher.",
    "Why is the sky blue?",
    "Suggest a name for a bakery that sells only bread.",
    "How many minutes are there in a week? Show the calculation.",
    "Give me a simple recipe for pancakes.",
    "What is the difference between weather and climate?",
    "Write four lines of a song about the sea.",
    "How can I become better at remembering names?",
    "A book costs 12 dollars and a pen costs 3. How much do 2 books and 5 pens cost?",
    "Explain what a noun is, with three examples.",
    "What are the planets of the solar system, in order from the Sun?",
    "Rewrite this sentence to be more polite: Send me the report now.",
    "What is a good way to start learning to draw?",
    "Describe a cat to someone who has never seen one.",
    "Why do leaves change colour in autumn?",
]

_SNIPPETS = [
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
    "    def __repr__(self):\n        return f'Point({self.x}, {self.y})'\n",
    "for name in names:\n    if name.startswith('_'):\n        continue\n    value = getattr(module, name)\n"
    "    if callable(value):\n        result[name] = value\n",
    "def read_lines(path):\n    with open(path) as f:\n        for line in f:\n            line = line.strip()\n"
    "            if line and not line.startswith('#'):\n                yield line\n",
]
_EDITS = [
    ("# The same code, with a docstring added to each function:\n", None),
    ("# Copy of the code above, reformatted:\n", None),
    ("# Summary: the code above, line by line, as comments:\n", "# "),
]


def _builtin(name: str) -> tuple[Item, ...]:
    if name == "code":
        return tuple(Item(f"code-{i}", prompt=p) for i, p in enumerate(_CODE))
    if name == "chat":
        return tuple(Item(f"chat-{i}", messages=({"role": "user", "content": q},)) for i, q in enumerate(_CHAT))
    if name == "edit":
        items = []
        for i, snippet in enumerate(_SNIPPETS):
            for j, (instruction, lead) in enumerate(_EDITS):
                # The copy has already started: the model's most likely continuation repeats the snippet.
                start = (lead or "") + snippet.splitlines()[0] + "\n"
                items.append(Item(f"edit-{i}-{j}", prompt=f"{snippet}\n\n{instruction}{start}"))
        return tuple(items)
    if name == "mixed":
        sets = [_builtin(n) for n in ("code", "chat", "edit")]
        longest = max(len(s) for s in sets)
        return tuple(s[i] for i in range(longest) for s in sets if i < len(s))
    raise KeyError(name)


CATEGORIES_FILE = Path(__file__).parent / "data" / "categories.jsonl"
BUILTIN = ("code", "chat", "edit", "mixed", "categories")


def load_workload(spec: str) -> Workload:
    """A built-in set by name, or a JSONL / ShareGPT file by path; `spec:cat,cat` keeps those
    categories of it. Categorised prompts come round-robin over their categories."""
    name, chosen = split_spec(spec)
    if chosen == []:
        raise ValueError(f"workload '{spec}': no category after ':' (e.g. {name}:code,math)")
    workload = _read_workload(name)
    if chosen is not None:
        known = workload.categories
        unknown = [c for c in chosen if c not in known]
        if unknown:
            raise ValueError(f"workload '{name}' has no category {', '.join(repr(c) for c in unknown)}; its categories: "
                             f"{', '.join(known) or 'none (its prompts carry no category)'}")
        workload = Workload(spec, tuple(i for i in workload.items if i.category in chosen))
    return Workload(workload.name, _round_robin(workload.items))


def split_spec(spec: str) -> tuple[str, list[str] | None]:
    """(the built-in set or file, the categories it keeps or None) of a `--workload` value: `NAME`
    or `NAME:cat,cat` (a file whose own name holds a ':' is taken whole)."""
    if spec in BUILTIN or Path(spec).expanduser().is_file() or ":" not in spec:
        return spec, None
    name, listed = spec.rsplit(":", 1)
    return name, [c for c in listed.replace(" ", "").split(",") if c]


def _round_robin(items: tuple[Item, ...]) -> tuple[Item, ...]:
    """Categorised prompts one category after the other, in turn (each category's own order kept)."""
    if not any(i.category for i in items):
        return items
    groups: dict[str | None, list[Item]] = {}
    for item in items:
        groups.setdefault(item.category, []).append(item)
    longest = max(len(g) for g in groups.values())
    return tuple(g[i] for i in range(longest) for g in groups.values() if i < len(g))


def _read_workload(spec: str) -> Workload:
    if spec in BUILTIN and spec != "categories":
        return Workload(spec, _builtin(spec))
    path = CATEGORIES_FILE if spec == "categories" else Path(spec).expanduser()
    if not path.is_file():
        raise ValueError(f"workload '{spec}' is neither a built-in set ({', '.join(BUILTIN)}) nor a file")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"workload file {path} is not UTF-8 text (byte {exc.start})") from None
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"workload file {path}: not valid JSON ({exc})") from None
        items = _sharegpt(data, path)
    else:
        items = _jsonl(text, path)
    if not items:
        raise ValueError(f"workload file {path} holds no usable prompts")
    return Workload(path.stem, tuple(items))


def _jsonl(text: str, path: Path) -> list[Item]:
    items = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{path}:{n}: not JSON ({exc})") from None
        category = obj.get("category") if isinstance(obj, dict) else None
        if category is not None and not (isinstance(category, str) and re.fullmatch(r"[\w.-]+", category)):
            raise ValueError(f"{path}:{n}: 'category' must be a word (letters, digits, '_', '.', '-'), "
                             f"not {category!r}")
        if isinstance(obj, dict) and "turns" in obj:  # Spec-Bench's question.jsonl
            turns = obj["turns"]
            if not (isinstance(turns, list) and turns and all(isinstance(t, str) and t.strip() for t in turns)):
                raise ValueError(f"{path}:{n}: 'turns' must be a list of non-empty strings (Spec-Bench's "
                                 f"question.jsonl)")
            qid = obj.get("question_id", n)
            items.append(Item(f"{path.stem}-{qid}", messages=({"role": "user", "content": turns[0]},),
                              category=category))
            continue
        if not isinstance(obj, dict) or ("prompt" in obj) == ("messages" in obj):
            raise ValueError(f"{path}:{n}: each line needs exactly one of 'prompt', 'messages' or 'turns' "
                             f"(Spec-Bench)")
        prompt, messages, limit = obj.get("prompt"), obj.get("messages"), obj.get("max_tokens")
        if "prompt" in obj and not isinstance(prompt, str):
            raise ValueError(f"{path}:{n}: 'prompt' must be a string")
        if "messages" in obj and not (isinstance(messages, list) and messages and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages)):
            raise ValueError(f"{path}:{n}: 'messages' must be a list of {{'role': str, 'content': str}}")
        if limit is not None and not (isinstance(limit, int) and not isinstance(limit, bool) and limit > 0):
            raise ValueError(f"{path}:{n}: 'max_tokens' must be a positive integer")
        items.append(Item(str(obj.get("id", f"{path.stem}-{n}")), prompt=prompt,
                          messages=tuple(messages) if messages is not None else None, max_tokens=limit,
                          category=category))
    return items


def _sharegpt(data: Any, path: Path) -> list[Item]:
    roles = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
    if not isinstance(data, list):
        raise ValueError(f"workload file {path}: a ShareGPT file holds a list of conversations")
    items = []
    for n, conv in enumerate(data):
        turns = (conv.get("conversations") or conv.get("conversation") or []) if isinstance(conv, dict) else None
        if not isinstance(turns, list) or not all(
                isinstance(t, dict) and isinstance(t.get("from", ""), str) and isinstance(t.get("value", ""), str)
                for t in turns):
            raise ValueError(f"workload file {path}: entry {n} is not a ShareGPT conversation "
                             f"({{'conversations': [{{'from': 'human', 'value': '...'}}, ...]}})")
        said = [(roles.get(t.get("from", "")), t.get("value", "")) for t in turns]
        first = next((i for i, (role, _) in enumerate(said) if role == "user"), None)
        if first is None or not said[first][1].strip():
            continue
        reply = next((text for role, text in said[first + 1:] if role == "assistant"), None)
        # ShareGPT keeps no token counts: ~4 characters a token is the usual estimate for the reply length.
        reply_tokens = max(1, len(reply) // 4) if reply is not None else None
        items.append(Item(str(conv.get("id", f"{path.stem}-{n}")),
                          messages=({"role": "user", "content": said[first][1]},), max_tokens=reply_tokens))
    return items


def uses_chat(item: Item, api: Api) -> bool:
    if api == "auto":
        return item.messages is not None
    return api == "chat"


def request_for(item: Item, model: str, max_tokens: int, temperature: float, fixed_length: bool,
                api: Api = "auto") -> tuple[str, dict[str, Any]]:
    """(path, JSON body) of one streaming request for `item`."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens if fixed_length or not item.max_tokens else item.max_tokens,
        "temperature": temperature,
        "stream": True,
        # Usage in every chunk gives the tokens each chunk carries (several with speculation);
        # the final usage chunk gives the request's output tokens as the server counted them.
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        # The tokens themselves, for the content check (loadtest.measurement.content): a loop predicted is no speedup.
        "return_token_ids": True,
        **({"ignore_eos": True} if fixed_length else {}),  # vLLM extension: always generate exactly max_tokens
    }
    if uses_chat(item, api):
        messages = list(item.messages) if item.messages else [{"role": "user", "content": item.prompt or ""}]
        return CHAT_PATH, {**body, "messages": messages}
    prompt = item.prompt if item.prompt is not None else as_text(item.messages or ())
    return COMPLETIONS_PATH, {**body, "prompt": prompt}


def as_text(messages: tuple[dict[str, str], ...]) -> str:
    """Chat messages as plain text, for base models without a chat template (`--api completions`)."""
    lines = [f"{m.get('role', 'user').capitalize()}: {m.get('content', '')}" for m in messages]
    return "\n".join(lines) + "\nAssistant:"
