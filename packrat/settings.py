"""The `packrat:` settings a model is served with: one schema, its defaults and its checks.

An archive carries them as the `packrat:` section of its model-config.yaml (written by
packrat/deploy/archive.py); a Ray Serve deployment receives them as its application arguments
(packrat/frontends/ray_serve.py); the engine reads them (packrat/serving/engine.py). All three go
through `Settings`: `to_section()` writes, `Settings.from_section()` reads and checks (unknown keys,
wrong types and bad values are refused with the key's name). Values may arrive as strings (`serve
run app model=resnet50 max_batch=8`) and are converted. Files are named as the reader sees them:
inside an archive, names relative to its model directory; for Ray, absolute paths.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields

MAX_BODY_BYTES = 16 * 2**20  # a request body's default limit: larger ones are answered 413 with the reason
PLANS = ("auto", "fat")
# How the pool recovers requests; None keeps the pool's own default (see packrat/serving/pool).
RECOVERY_KEYS = ("request_timeout_s", "max_queue", "batch_timeout_s", "hang_factor", "hang_floor_s")
CODEC_KEYS = ("max_body_bytes", "max_pixels", "max_samples", "truncate_text")


@dataclass(frozen=True)
class Settings:
    model: str  # a zoo name, a factory `module:function`, a model file, or `hf:DIR`
    profiles: tuple[str, ...] = ()  # one per machine type; the server picks the one for its CPU (none: stock handler)
    max_batch: int = 8  # the largest batch the server gathers
    plan_batch: int | None = None  # the batch the first plan is for (default: max_batch)
    plan: str = "auto"  # "auto": the planned instances; "fat": one instance on every core
    reconfigure: bool = True  # follow the observed batch size with new plans
    cores: int | None = None  # the CPU budget asked for (never more than the machine gives)
    input_shape: tuple[int, ...] | None = None  # one sample's shape, for models that do not say
    graph_mode: str | None = None  # how instances run the model (default: the profile's mode)
    ios: bool = False  # instances run IOS schedules shipped beside the profile
    tokenizer: str | None = None  # a Hugging Face tokenizer.json
    labels: str | None = None  # TorchServe's index_to_name.json
    max_body_bytes: int = MAX_BODY_BYTES  # larger bodies: 413 with the reason
    max_pixels: int | None = None  # decoded image size limit (decompression bombs; default: the codec's)
    max_samples: int | None = None  # samples one KServe request may carry (default: the codec's)
    truncate_text: bool = False  # text longer than the model takes: truncated instead of 413
    gather_ms: float | None = None  # how long the pool waits to fill an instance's batch
    request_timeout_s: float | None = None  # waiting and running longer: 504 (pool default 120 s)
    max_queue: int | None = None  # waiting beyond this: 503 at once (pool default 1000)
    batch_timeout_s: float | None = None  # a batch running longer marks its instance hung
    hang_factor: float | None = None  # ... by default hang_factor × the batch's profiled latency
    hang_floor_s: float | None = None  # ... and at least this
    estimator: dict | None = None  # the batch-size estimator's settings (alpha, window, period_s, hysteresis)
    share_node: bool = True  # plan the cores with the other models served on this machine (serving/node.py)
    slo_ms: float | None = None  # this model's latency objective, for the node's plan

    def __post_init__(self) -> None:
        for field in fields(self):
            object.__setattr__(self, field.name, _converted(field.name, field.type, getattr(self, field.name)))
        if not self.model:
            raise ValueError("packrat setting 'model' is empty: name the model to serve")
        if self.plan not in PLANS:
            raise ValueError(f"packrat setting 'plan' must be one of {list(PLANS)}, got {self.plan!r}")
        for name in ("max_batch", "plan_batch", "cores", "max_body_bytes", "max_pixels", "max_samples", "max_queue"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"packrat setting {name!r} must be >= 1, got {value}")
        for name in ("slo_ms", "gather_ms", "request_timeout_s", "batch_timeout_s", "hang_factor", "hang_floor_s"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"packrat setting {name!r} must be >= 0, got {value}")

    @property
    def first_batch(self) -> int:
        """The batch the first plan is made for."""
        return min(self.plan_batch or self.max_batch, self.max_batch)

    def recovery(self) -> dict:
        """The recovery settings given (RECOVERY_KEYS), without those left to the pool's defaults."""
        return {key: getattr(self, key) for key in RECOVERY_KEYS if getattr(self, key) is not None}

    def codec_limits(self) -> dict:
        """The request limits given (CODEC_KEYS), without those left to the codec's defaults."""
        return {key: getattr(self, key) for key in CODEC_KEYS if getattr(self, key) is not None}

    def replace(self, **changes) -> Settings:
        return dataclasses.replace(self, **changes)

    def to_section(self) -> dict:
        """Plain data for YAML or JSON: every setting that is set (None leaves a default to its reader)."""
        section = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None:
                section[field.name] = list(value) if isinstance(value, tuple) else value
        return section

    @classmethod
    def from_section(cls, section: dict) -> Settings:
        """Settings from a `packrat:` section (or Ray application arguments, less Ray's own keys)."""
        if not isinstance(section, dict) or "model" not in section:
            raise ValueError("the packrat settings need at least 'model' (build the archive with `packrat archive`)")
        known = {field.name for field in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(f"unknown packrat setting(s) {unknown}: expected some of {sorted(known)}")
        return cls(**section)


def _converted(name: str, kind: str, value):
    """`value` as the setting's type (the annotation's text), from YAML, JSON or a command-line string."""
    if value is None:
        return None
    try:
        if kind.startswith("tuple[int"):
            return tuple(int(v) for v in _items(value))
        if kind.startswith("tuple[str"):
            return tuple(str(v) for v in _items(value))
        if kind.startswith("bool"):
            return _boolean(value)
        if kind.startswith("int"):
            return _whole(value)
        if kind.startswith("float"):
            return float(value)
        if kind.startswith("dict"):
            if not isinstance(value, dict):
                raise TypeError(f"a mapping, got {value!r}")
            return dict(value)
        return str(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"packrat setting {name!r} must be {kind.split(' |')[0]}: {exc}") from None


def _items(value) -> list:
    """A list from a list, or from `a,b,c` (how `serve run` passes a list)."""
    if isinstance(value, str):
        return [item for item in value.split(",") if item]
    return list(value)


def _whole(value) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"a whole number, got {value!r}")
    return int(value)


def _boolean(value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"true or false, got {value!r}")
