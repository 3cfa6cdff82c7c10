"""argparse types shared by the commands (`python -m loadtest`, `python -m tuning`, `python -m distill`): each refuses
bad input with a message naming it, before any work starts."""

from __future__ import annotations

import argparse
import re



def positive_int(text: str) -> int:
    """A count of runs: 0 would measure nothing and only fail later, far from the cause."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"give a positive integer, not {value}")
    return value


def int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("give positive integers, e.g. 1,32")
    return values


def name_list(text: str) -> list[str]:
    """Comma- or space-separated names, each once, in the order given."""
    names = list(dict.fromkeys(x for x in re.split(r"[,\s]+", text) if x))
    if not names:
        raise argparse.ArgumentTypeError("give names, e.g. ngram,eagle3 (or all)")
    return names


def rate_list(text: str) -> list[float]:
    """Arrival rates in requests/s, e.g. 0.5,1,2,4: positive and finite."""
    try:
        values = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of rates (requests/s)") from None
    if not values or any(not 0 < v < float("inf") for v in values):
        raise argparse.ArgumentTypeError("give positive rates in requests/s, e.g. 0.5,1,2,4")
    return values


def temperature_list(text: str) -> list[float]:
    """`0,0.7,1` -> [0.0, 0.7, 1.0] (sorted, no repeats); a clear error for anything else."""
    try:
        values = sorted({float(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--temperature takes numbers separated by commas, e.g. 0,0.7,1 "
                                         f"(got {text!r})") from None
    if not values or any(v < 0 or v != v or v == float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"--temperature needs one or more finite temperatures >= 0 (got {text!r})")
    return values


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"give a positive number, not {text}")
    return value


def share(text: str) -> float:
    """15% or 0.15."""
    value = positive_float(text.removesuffix("%"))
    value = value / 100 if text.endswith("%") or value >= 1 else value
    if not value < 1:
        raise argparse.ArgumentTypeError(f"give a share below 100%, e.g. 15% or 0.15, not {text}")
    return value
