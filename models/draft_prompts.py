"""The prompts the SmolLM2 draft is trained on: chat requests made from lists in this file, and
Python code to continue, cut from the standard library. No data set is downloaded.

The target answers every prompt itself (`models.draft_training`), so the draft learns what this
target says, in its chat format, on the kinds of traffic the kit sends: chat, code questions,
arithmetic and code completion. The load tests' own prompts (`loadtest.traffic.workloads`) are
not among them: `training_prompts` drops any that equals one, so acceptance is measured on
prompts the draft never saw.
"""

from __future__ import annotations

import hashlib
import json
import random
import sysconfig
from pathlib import Path
from typing import Iterator

TOPICS = (
    "the water cycle", "black holes", "photosynthesis", "the French Revolution", "machine learning", "coffee",
    "climate change", "the Roman Empire", "volcanoes", "the stock market", "vaccines", "the internet",
    "electric cars", "honey bees", "the Moon landing", "chess", "jazz music", "the human heart", "rainbows",
    "earthquakes", "democracy", "the printing press", "solar panels", "dinosaurs", "the ocean tides", "sleep",
    "meditation", "the Great Wall of China", "recycling", "bread baking", "gravity", "the immune system",
    "ancient Egypt", "renewable energy", "friendship", "time management", "public speaking", "gardening",
    "the Olympic Games", "cryptography", "the theory of evolution", "glaciers", "the piano", "marathon running",
    "inflation", "DNA", "lightning", "the Renaissance", "bicycles", "rainforests", "the periodic table",
    "nuclear power", "social media", "the Silk Road", "penguins", "origami", "the speed of light", "deserts",
    "the Industrial Revolution", "video games", "cloud computing", "tea ceremonies", "coral reefs", "magnets",
    "the solar system", "mountain climbing", "libraries", "the human brain", "bridges", "hurricanes",
    "the stock exchange", "learning a language", "volunteering", "wind turbines", "the Amazon river",
    "mushrooms", "the Cold War", "robots", "compost", "the guitar", "sea turtles", "pizza", "the Sahara",
    "electricity", "the telescope", "paper money", "the first computers", "yoga", "cats", "dogs", "owls",
    "the Eiffel Tower", "trains", "airplanes", "submarines", "snowflakes", "the autumn season", "kindness",
    "budgeting", "starting a small business", "job interviews", "healthy breakfasts", "3D printing",
    "the Pythagorean theorem", "prime numbers", "probability", "the metric system", "maps", "lighthouses",
    "castles", "pirates", "the Vikings", "the Aztecs", "the Nile", "the Arctic", "whales", "elephants",
    "ants", "butterflies", "the camera", "the telephone", "radio", "television", "batteries", "rockets",
)
"""Subjects of the chat prompts: everyday, science, history, work."""

CHAT_TASKS = (
    "Explain {t} to a ten-year-old.", "Write a short poem about {t}.", "Give me three tips related to {t}.",
    "What are the main pros and cons of {t}?", "Summarize what you know about {t} in two sentences.",
    "Write a very short story that involves {t}.", "How does {t} work?", "Write a haiku about {t}.",
    "List five interesting facts about {t}.", "Write a friendly email inviting a colleague to a talk on {t}.",
    "What is the history of {t}, briefly?", "Why do people care about {t}?", "Describe {t} in one paragraph.",
    "What would a beginner get wrong about {t}?", "Write a tweet about {t}.",
    "Give a simple analogy that explains {t}.", "What questions should I ask an expert on {t}?",
    "Write a short product description for a book about {t}.", "Tell me a fun fact about {t}.",
    "Compare {t} and {u} in a few sentences.", "Write a limerick about {t}.",
    "Outline a five-minute presentation on {t}.", "What is a common myth about {t}?",
)
"""Chat tasks: `{t}` and `{u}` are topics."""

CODE_ACTIONS = (
    "reverses a string", "checks whether a number is prime", "counts the words in a text",
    "merges two sorted lists", "removes duplicates from a list while keeping the order",
    "computes the factorial of n", "finds the largest element of a list", "converts Celsius to Fahrenheit",
    "checks whether a string is a palindrome", "flattens a nested list", "reads a CSV file into a list of dicts",
    "returns the n-th Fibonacci number", "sorts a list of tuples by their second element",
    "counts how often each character appears in a string", "computes the average of a list of numbers",
    "finds the common elements of two lists", "validates an email address with a regular expression",
    "splits a list into chunks of size n", "computes the greatest common divisor of two numbers",
    "transposes a matrix given as a list of lists", "implements binary search",
    "groups words by their first letter", "returns the second largest number in a list",
    "capitalizes the first letter of every word", "checks whether two strings are anagrams",
    "implements a stack with push and pop", "parses a date string like 2024-01-31",
    "sums the digits of an integer", "generates all permutations of a list", "rotates a list by k positions",
    "writes a dictionary to a JSON file", "downloads nothing and just prints the current time",
    "implements bubble sort", "finds the longest word in a sentence", "converts a binary string to an integer",
)
"""Code tasks, asked in plain English."""

CODE_TASKS = (
    "Write a Python function that {a}.", "How do I write a function that {a} in Python?",
    "Show me Python code that {a}, with a short explanation.", "Write a well-documented Python function that {a}.",
    "Write a JavaScript function that {a}.", "Explain step by step how to write a program that {a}.",
)

MATH_TASKS = (
    "What is {a} times {b}?", "What is {a} plus {b}? Show your work.", "If I have {a} apples and give away {c}, "
    "how many are left?", "A train travels {a} km in {c} hours. What is its average speed?",
    "What is {c} percent of {b}?", "Solve for x: {c}x + {a} = {b}.", "Is {b} divisible by {c}? Explain.",
    "A shop sells pens at {c} dollars each. How much do {a} pens cost?",
)
"""Arithmetic word problems: `{a}`, `{b}`, `{c}` are numbers."""

PYTHON_SOURCES = ("json", "email", "http", "logging", "unittest", "asyncio", "collections", "xml", "urllib",
                  "concurrent", "importlib", "multiprocessing", "sqlite3", "tomllib", "zoneinfo", "wsgiref")
"""Standard-library packages whose modules the code-completion prompts are cut from."""


def prompt_id(prompt: dict) -> str:
    """A stable id for a prompt (its text's hash)."""
    return hashlib.sha1(json.dumps(prompt, sort_keys=True).encode()).hexdigest()[:12]


def chat_prompts(rng: random.Random, count: int) -> list[dict]:
    """`count` chat requests: general tasks, code questions and arithmetic, about 5:3:2."""
    out = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.5:
            t, u = rng.sample(TOPICS, 2)
            text = rng.choice(CHAT_TASKS).format(t=t, u=u)
            category = "chat"
        elif kind < 0.8:
            text = rng.choice(CODE_TASKS).format(a=rng.choice(CODE_ACTIONS))
            category = "code-chat"
        else:
            a, b, c = rng.randint(2, 999), rng.randint(10, 9999), rng.randint(2, 60)
            text = rng.choice(MATH_TASKS).format(a=a, b=b, c=c)
            category = "math"
        out.append({"category": category, "messages": [{"role": "user", "content": text}]})
    return out


def _python_files(stdlib: Path) -> list[Path]:
    files: list[Path] = []
    for package in PYTHON_SOURCES:
        folder = stdlib / package
        files += sorted(p for p in folder.rglob("*.py") if "test" not in p.parts) if folder.is_dir() else []
    return files


def code_prompts(rng: random.Random, count: int, stdlib: Path | None = None) -> list[dict]:
    """`count` code-completion prompts: a function or class start (its `def`/`class` line and up to
    a few lines of body) with up to 20 lines before it, from the standard library's modules."""
    stdlib = stdlib or Path(sysconfig.get_paths()["stdlib"])
    starts: list[tuple[list[str], int]] = []
    for path in _python_files(stdlib):
        try:
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        except (UnicodeDecodeError, OSError):
            continue
        starts += [(lines, i) for i, line in enumerate(lines) if line.lstrip().startswith(("def ", "class "))]
    if not starts:
        raise RuntimeError(f"no Python modules found under {stdlib} ({', '.join(PYTHON_SOURCES)})")
    out = []
    for lines, i in rng.sample(starts, min(count, len(starts))):
        before = rng.randint(0, 20)
        after = rng.randint(1, 4)
        text = "".join(lines[max(0, i - before):i + after])
        if text.strip():
            out.append({"category": "code", "prompt": text})
    return out


def training_prompts(seed: int, chat: int, code: int, stdlib: Path | None = None,
                     exclude: set[str] = frozenset()) -> list[dict]:
    """The draft's training prompts, shuffled: `chat` chat requests and `code` code starts, less any
    whose text is in `exclude` (the load tests' prompts), each with its id."""
    rng = random.Random(seed)
    prompts = chat_prompts(rng, chat) + code_prompts(rng, code, stdlib)
    rng.shuffle(prompts)
    kept = []
    for p in prompts:
        text = p.get("prompt") or p["messages"][-1]["content"]
        if text not in exclude:
            kept.append({"id": prompt_id(p), **p})
    return kept


def write_jsonl(prompts: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return path


def read_jsonl(path: Path) -> Iterator[dict]:
    for line in path.read_text().splitlines():
        if line.strip():
            yield json.loads(line)
