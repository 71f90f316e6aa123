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


def name_list(choices=(), what: str = "name"):
    """argparse type for 'a,b': the names in order, duplicates dropped; with `choices`, each one of them."""

    def parse(text: str) -> list[str]:
        names = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
        unknown = [name for name in names if choices and name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {unknown[0]!r}: choose from {', '.join(choices)}")
        if not names:
            raise argparse.ArgumentTypeError(f"{text!r} names nothing")
        return names

    parse.__name__ = f"{what} list"  # argparse names the type in its errors
    return parse


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


def named(convert):
    """argparse type for a per-model value, 'NAME=VALUE' or a bare 'VALUE' (for every model):
    (NAME or None, convert(VALUE)). A NAME holds no '/', so a bare path with '=' in a folder's
    name stays a path."""

    def parse(text: str):
        name, sep, value = text.partition("=")
        if sep and name and "/" not in name:
            return name, convert(value)
        return None, convert(text)

    parse.__name__ = getattr(convert, "__name__", "value")  # argparse names the type in its errors
    return parse


def for_model(entries, model: str, models, flag: str, *, bare_for_one: bool = False) -> list:
    """The values of a repeatable per-model option (`named` entries) that apply to `model`: those
    named for it, else the bare ones. bare_for_one: bare values only when one model is served (say,
    a profile, which belongs to one model). Raises ValueError for a NAME that is not served."""
    entries = entries or []
    unknown = sorted({name for name, _ in entries if name is not None and name not in models})
    if unknown:
        raise ValueError(f"{flag} names {', '.join(unknown)}, which is not served (models: {', '.join(models)})")
    bare = [value for name, value in entries if name is None]
    if bare and bare_for_one and len(models) > 1:
        raise ValueError(f"with several models, give {flag} as NAME=VALUE (models: {', '.join(models)})")
    return [value for name, value in entries if name == model] or bare


def users_list(text: str) -> list:
    """argparse type for --users: patterns relative to the batch size B, e.g. B,2B or 4,2B."""
    from packrat.bench.users import parse_users

    try:
        return parse_users(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
