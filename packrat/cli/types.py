"""argparse types for numbers and lists: light (no torch), shared by the commands and the benchmarks."""

from __future__ import annotations

import argparse


def int_list(text: str) -> list[int]:
    """argparse type for '1-4,8,16': sorted distinct positive integers (argparse names the flag)."""
    values: set[int] = set()
    try:
        for part in text.split(","):
            low, _, high = part.strip().partition("-")
            values.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list like 1-4 or 1,2,8") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must name integers >= 1")
    return sorted(values)


def positive(kind: type, zero: bool = False):
    """argparse type: a number > 0 (>= 0 with zero=True) of the given kind."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not (value >= 0 if zero else value > 0):
            raise argparse.ArgumentTypeError(f"must be {'>=' if zero else '>'} 0, got {text}")
        return value

    return parse


def shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape like 3,224,224") from None
