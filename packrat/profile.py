"""Profile files: L(t, b), the latency of one instance with t threads at batch b.

A profile is a CSV whose required columns are ``threads,batch,latency_ms`` (mean
latency in ms); any other column (p50_ms, p99_ms, std_ms, iterations, ...) is kept
but optional. Lines starting with ``#`` before the header carry metadata as
``# key: value`` (model, mode, torch version, CPU, cores, date).

``load`` also reads the CSV layout published by the Packrat authors (columns
``benchmark,topology,...,intraop_threads,batch_size,latency(avg)``), keeping the
TorchScript (``*_manual_script``), ``sequential`` rows, so their 16-core tables
can be planned from directly.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

REQUIRED = ("threads", "batch", "latency_ms")
COLUMNS = ("threads", "batch", "latency_ms", "p50_ms", "p99_ms", "std_ms", "iterations")
_PUBLISHED = {"threads": "intraop_threads", "batch": "batch_size", "latency_ms": "latency(avg)"}


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file and the problem."""


@dataclass
class Profile:
    latency: dict[tuple[int, int], float]  # (threads, batch) -> mean latency in ms
    metadata: dict[str, str] = field(default_factory=dict)
    rows: list[dict[str, str]] = field(default_factory=list)

    @property
    def threads(self) -> list[int]:
        return sorted({t for t, _ in self.latency})

    @property
    def batches(self) -> list[int]:
        return sorted({b for _, b in self.latency})

    def items(self) -> list[tuple[int, int, float]]:
        """The profiled points as (threads, batch, latency_ms), sorted."""
        return [(t, b, self.latency[t, b]) for t, b in sorted(self.latency)]


def _parse_number(text: str, kind: type, what: str) -> float:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise ValueError(f"{what} is not {'an integer' if kind is int else 'a number'}: {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise ValueError(f"{what} is not finite: {text!r}")
    return value


def _read_lines(path: Path) -> tuple[dict[str, str], list[tuple[int, str]]]:
    """Metadata from leading '# key: value' lines, and the rest with 1-based line numbers."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    metadata: dict[str, str] = {}
    body: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not body and line.startswith("#"):
            key, sep, value = line[1:].partition(":")
            if sep:
                metadata[key.strip()] = value.strip()
        elif line.strip():
            body.append((number, line))
    return metadata, body


def load(path: str | Path) -> Profile:
    """Read and validate a profile; raise ProfileError naming the file, row and problem."""
    path = Path(path)
    metadata, body = _read_lines(path)
    if not body:
        raise ProfileError(f"{path}: empty profile (no header)")
    numbers = [n for n, _ in body]
    reader = csv.DictReader([line for _, line in body])
    header = [h.strip() for h in (reader.fieldnames or [])]
    reader.fieldnames = header
    columns = {name: name for name in REQUIRED}
    published = all(c in header for c in _PUBLISHED.values()) and "benchmark" in header
    if published and not all(c in header for c in REQUIRED):
        columns = _PUBLISHED
    missing = [name for name in REQUIRED if columns[name] not in header]
    if missing:
        raise ProfileError(f"{path}: missing column {missing[0]!r} (header is: {','.join(header)})")

    profile = Profile(latency={}, metadata=metadata)
    for number, row in zip(numbers[1:], reader):
        if columns is _PUBLISHED and not _is_published_script_row(row):
            continue
        where = f"{path}: row {number}"
        try:
            threads = _parse_number(row[columns["threads"]], int, "threads")
            batch = _parse_number(row[columns["batch"]], int, "batch")
            latency = _parse_number(row[columns["latency_ms"]], float, "latency_ms")
        except ValueError as exc:
            raise ProfileError(f"{where}: {exc}") from None
        if threads < 1 or batch < 1:
            raise ProfileError(f"{where}: threads and batch must be >= 1, got threads={threads} batch={batch}")
        if latency <= 0:
            raise ProfileError(f"{where}: latency_ms must be > 0, got {latency}")
        if (threads, batch) in profile.latency:
            raise ProfileError(f"{where}: duplicate point threads={threads} batch={batch}")
        profile.latency[threads, batch] = latency
        profile.rows.append({k: v for k, v in row.items() if k is not None})
    if not profile.latency:
        raise ProfileError(f"{path}: no data rows")
    if columns is _PUBLISHED:
        profile.metadata.setdefault("model", _published_model(profile.rows[0]))
        profile.metadata.setdefault("source", "published Packrat measurements (TorchScript, sequential pinning)")
    return profile


def _is_published_script_row(row: dict[str, str]) -> bool:
    return row.get("benchmark", "").endswith("_manual_script") and row.get("topology", "sequential") == "sequential"


def _published_model(row: dict[str, str]) -> str:
    return row["benchmark"].removesuffix("_manual_script")


class ProfileWriter:
    """Appends points to a profile file, one flushed line each, so an interrupted
    run leaves a valid file that a later run resumes."""

    def __init__(self, path: str | Path, metadata: dict[str, str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        if not new:
            _check_header(self.path)
        self._file = self.path.open("a", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=COLUMNS, extrasaction="ignore")
        if new:
            for key, value in metadata.items():
                self._file.write(f"# {key}: {value}\n")
            self._csv.writeheader()
            self._file.flush()

    def write(self, point: dict[str, float | int]) -> None:
        self._csv.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in point.items()})
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "ProfileWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_header(path: Path) -> None:
    """Appending is only safe to a file with exactly our columns."""
    _, body = _read_lines(path)
    header = body[0][1].strip().split(",") if body else []
    if header != list(COLUMNS):
        raise ProfileError(f"{path}: cannot append: header is {','.join(header)!r}, expected {','.join(COLUMNS)!r}")
