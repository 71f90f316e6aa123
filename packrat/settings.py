"""The registry of packrat's settings: the `packrat:` schema a model is served with, the defaults its
readers fall back on, and every `PACKRAT_*` environment variable packrat reads or sets.

An archive carries the schema as the `packrat:` section of its model-config.yaml (written by
packrat/deploy/archive.py); a Ray Serve deployment receives it as its application arguments
(packrat/frontends/ray_serve.py); the engine reads it (packrat/serving/engine.py); `packrat archive`
and `packrat serve` take one option per field (packrat/cli/args.py derives them from the fields'
metadata: help, metavar, bounds). All go through `Settings`: `to_section()` writes,
`Settings.from_section()` reads and checks (unknown keys, wrong types and bad values are refused with
the key's name, the estimator's included). Values may arrive as strings (`serve run app
model=resnet50 max_batch=8`) and are converted. Files are named as the reader sees them: inside an
archive, names relative to its model directory; for Ray, absolute paths.

Environment variables are declared once, in ENVIRONMENT, and other modules use these constants
(tests/test_settings.py checks it). The manual's settings and environment reference is written from this
registry when it is built (docs/hooks.py). The load tests' variables are loadtest's own
(loadtest/env.py), since loadtest imports nothing of packrat.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path


# ---- environment variables -----------------------------------------------------------------------

@dataclass(frozen=True)
class EnvVar:
    """An environment variable packrat reads or sets. get() reads it as `type`; unset or empty, the
    default (text read the same way, `~` the home directory and `{uid}` this user's id), or None."""

    name: str
    type: Callable[[str], object]
    default: str | None
    doc: str

    def get(self, environ: Mapping[str, str] | None = None):
        text = (os.environ if environ is None else environ).get(self.name)
        if not text:
            if self.default is None:
                return None
            text = os.path.expanduser(self.default.replace("{uid}", str(os.getuid())))
        try:
            return self.type(text)
        except ValueError:
            raise ValueError(f"{self.name} must be {self.type.__name__}, got {text!r}") from None

    def __str__(self) -> str:
        return self.name


CORES_ENV = EnvVar("PACKRAT_CORES", int, None,
                   "the cores to plan for when neither `--cores` nor the archive's `cores` says; never more than "
                   "the machine gives (`packrat export k8s` sets it to the pod's CPUs)")
COMPILE_CACHE_ENV = EnvVar("PACKRAT_COMPILE_CACHE", Path, "~/.cache/packrat/compiled",
                           "where compiled model packages are kept, named by a hash of the model's code, its "
                           "inputs, torch and the CPU")
NODE_DIR_ENV = EnvVar("PACKRAT_NODE_DIR", Path, "/tmp/packrat-node-{uid}",
                      "where the engines serving on one set of cores agree on one plan of them (a folder per "
                      "core set)")
SERVED_DIR_ENV = EnvVar("PACKRAT_SERVED_DIR", Path, "~/.cache/packrat/served",
                        "where an engine keeps the latencies its instances served where they differed from the "
                        "profile's (one file per model and profile), so a restart plans with them")
def switch(text: str) -> bool:
    """An on/off variable's value: off for 0, false, no or off."""
    return text.strip().lower() not in ("0", "false", "no", "off")


FORK_INSTANCES_ENV = EnvVar("PACKRAT_FORK_INSTANCES", switch, "1",
                            "1 (the default): pool instance processes are forked from a process that has "
                            "imported torch once; 0: each starts as a fresh interpreter (about 1.9 s of CPU more)")
CONTROL_DIR_ENV = EnvVar("PACKRAT_CONTROL_DIR", Path, None,
                         "set by `packrat serve` for its handlers: the folder of control files they poll "
                         "(`packrat reconfigure` requests)")
TS_MANAGEMENT_ENV = EnvVar("PACKRAT_TS_MANAGEMENT", str, None,
                           "set by `packrat serve` for its handlers: TorchServe's management address, where the "
                           "handler looks at how many requests wait in TorchServe's queue (admission)")
TS_KEY_FILE_ENV = EnvVar("PACKRAT_TS_KEY_FILE", Path, None,
                         "set by `packrat serve` for its handlers: TorchServe's key file, for the management token")
TORCH_SPEC_ENV = EnvVar("PACKRAT_TORCH_SPEC", str, "torch==2.13.0",
                        "read by scripts/setup.sh: the torch requirement it installs")
TORCH_INDEX_ENV = EnvVar("PACKRAT_TORCH_INDEX", str, "https://download.pytorch.org/whl/cpu",
                         "read by scripts/setup.sh: the package index torch comes from (CPU wheels)")
ENVIRONMENT = (CORES_ENV, COMPILE_CACHE_ENV, NODE_DIR_ENV, SERVED_DIR_ENV, CONTROL_DIR_ENV, TS_MANAGEMENT_ENV,
               TS_KEY_FILE_ENV, TORCH_SPEC_ENV, TORCH_INDEX_ENV)


# ---- defaults: what a reader uses for a setting left out -----------------------------------------

MAX_BODY_BYTES = 16 * 2**20  # a request body's limit: larger ones are answered 413 with the reason
MAX_PIXELS = 50_000_000  # a decoded image's limit (decompression bombs), checked from its header first
MAX_SAMPLES = 64  # the samples one KServe request may carry
GATHER_MS = 30.0  # how long idle instances wait for their planned share to arrive (measured: BENCHMARKS.md)
REQUEST_TIMEOUT_S = 120.0  # waiting and running longer: 504 (as TorchServe's default_response_timeout)
MAX_QUEUE = 1000  # requests waiting beyond this are answered 503 at once (TorchServe's job_queue_size)
HANG_FACTOR = 10.0  # a batch may take this many times its expected latency ...
HANG_FLOOR_S = 5.0  # ... and at least this long, before its instance counts as hung
TURN_MS = 100.0  # the longest turn on time-shared cores (BENCHMARKS.md, issue 33)
# A runtime other than inductor takes a profile point only when faster than inductor's figure by more
# than either point's spread (std over its iterations) and by at least this fraction: two profiles of
# one model otherwise picked different runtimes on noise (issue 32).
RUNTIME_MARGIN = 0.02
# Settling near-ties before serving (serving/settling.py) takes at most this long in all: a few pools
# started and a few seconds of rounds per batch.
SETTLE_S = 60.0
PLANS = ("auto", "fat")
INSTANCE_KINDS = ("auto", "process")  # how instances are hosted: the plan's choice, or every one a process
# How the pool recovers requests; None keeps the pool's own default (above).
RECOVERY_KEYS = ("request_timeout_s", "max_queue", "admission", "batch_timeout_s", "hang_factor", "hang_floor_s")
ADMISSIONS = ("predicted", "queue")  # packrat/serving/pool/admission.py
CODEC_KEYS = ("max_body_bytes", "max_pixels", "max_samples", "truncate_text")


def setting(default=dataclasses.MISSING, help: str = "", **more):
    """A schema field with its doc: `help` (and `metavar`) for the CLI; the checks `minimum`,
    `above`, `maximum`, `below`, `choices`; `per_model` (the CLI takes NAME=VALUE with several
    models); `option=False` for a field the CLI does not derive (it sets it otherwise)."""
    return field(default=default, metadata={"help": help, **more})


# ---- the schema ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EstimatorSettings:
    """The batch-size estimator's settings (packrat/serving/estimator.py): the `estimator:` mapping of
    the packrat section."""

    alpha: float = setting(0.1, "weight of the newest batch in the load's moving average", above=0, maximum=1,
                           metavar="F")
    window: int = setting(10, "estimates the target batch is the most common of", minimum=1, metavar="N")
    period_s: float = setting(1.0, "how often the estimate is taken, in seconds", above=0, metavar="S")
    hysteresis: float = setting(0.15, "how far below the current target the average must fall to go down",
                                minimum=0, below=1, metavar="F")

    def __post_init__(self) -> None:
        _check_fields(self, "estimator.")

    def to_section(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_section(cls, section) -> EstimatorSettings:
        if isinstance(section, cls):
            return section
        if not isinstance(section, Mapping):
            raise ValueError(f"packrat setting 'estimator' must be a mapping of some of "
                             f"{[f.name for f in fields(cls)]}, got {section!r}")
        return cls(**_known(cls, section, "estimator."))


@dataclass(frozen=True)
class Settings:
    model: str = setting(help="a zoo name, a factory `module:function`, a model file, or `hf:DIR`", option=False)
    profiles: tuple[str, ...] = setting((), "one per machine type; the server picks the one for its CPU (none: the "
                                            "stock handler)", option=False)
    max_batch: int = setting(8, "TorchServe's batch size B, the largest batch gathered; the first plan is made "
                                "for it", minimum=1, metavar="B")
    plan_batch: int | None = setting(None, "the batch the first plan is for, if smaller (default: --max-batch)",
                                     minimum=1, metavar="B")
    plan: str = setting("auto", "auto: the planner's instances; fat: one instance with every core", choices=PLANS)
    instance_kind: str = setting("auto", "auto: an instance of a runtime that can run as a thread of the server's "
                                         "process (ONNX Runtime) is one where the profile measured that kind "
                                         "faster; process: every instance a process of its own (a native crash "
                                         "then costs one instance, not the server)", choices=INSTANCE_KINDS)
    reconfigure: bool = setting(True, "follow the observed batch sizes with new plans (--no-reconfigure: keep "
                                      "the plan for --max-batch)")
    settle_s: float = setting(SETTLE_S, "before serving, the plans the profile cannot tell apart at a batch it may "
                                        "serve are timed side by side through pools of their own, and the faster "
                                        "served: at most this many seconds in all (0: serve the profile's plans)",
                              minimum=0, metavar="S")
    cores: int | None = setting(None, f"plan for at most N cores (default: every core this process may use: its "
                                      f"CPU affinity, cut to its cgroup's CPU quota, or ${CORES_ENV}). More than "
                                      f"the machine gives is cut to what it gives", minimum=1, metavar="N")
    input_shape: tuple[int, ...] | None = setting(None, "one input sample's shape, e.g. 3,224,224, for models "
                                                        "that do not say", metavar="SHAPE")
    graph_mode: str | None = setting(None, "how the instances run the model (default: the profile's mode)")
    runtime: str | None = setting(None, "the runtime the stock handler runs the model with: inductor (the "
                                        "default), openvino or onnxruntime (packrat instances take each "
                                        "point's from the profile)", option=False,
                                  choices=("inductor", "openvino", "onnxruntime"))
    ios: bool = setting(False, "instances of the ios runtime take their IOS schedules from beside the profile (the "
                               "archive sets it when the profile has ios points)", option=False)
    tokenizer: str | None = setting(None, "a directory holding a Hugging Face tokenizer.json (or the file): token "
                                          "models then also take text/plain requests", per_model=True,
                                    metavar="DIR")
    labels: str | None = setting(None, 'class names for classifier answers: TorchServe\'s index_to_name.json '
                                       '({"0": "tench", ...})', per_model=True, metavar="FILE")
    max_body_bytes: int = setting(MAX_BODY_BYTES, "largest request body accepted; larger ones are answered 413",
                                  minimum=1, metavar="BYTES")
    max_pixels: int | None = setting(None, f"largest decoded image, in pixels, against decompression bombs "
                                           f"(default: {MAX_PIXELS})", minimum=1, metavar="N")
    max_samples: int | None = setting(None, f"samples one KServe request may carry (default: {MAX_SAMPLES})",
                                      minimum=1, metavar="N")
    truncate_text: bool = setting(False, "cut text longer than the model takes to its length (default: answer "
                                         "it 413)")
    gather_ms: float | None = setting(None, f"how long an idle instance waits for the rest of its planned share "
                                            f"(default: 0 under TorchServe, which hands over whole batches; the "
                                            f"archive's batch delay under the KServe server; else {GATHER_MS:g})",
                                      minimum=0, metavar="MS")
    request_timeout_s: float | None = setting(None, f"how long a request may wait and run before it is answered "
                                                    f"504; in line with TorchServe's default_response_timeout "
                                                    f"(default: {REQUEST_TIMEOUT_S:g})", above=0, metavar="S")
    max_queue: int | None = setting(None, f"requests waiting beyond this are answered 503 at once (default: "
                                          f"{MAX_QUEUE})", minimum=1, metavar="N")
    admission: str | None = setting(None, "predicted: a request is refused 503 at once unless the pool predicts "
                                          "its answer within its deadline (--request-timeout-s), from the queue "
                                          "ahead and what the instances serve; queue: --max-queue alone "
                                          "(default: predicted)", choices=ADMISSIONS)
    batch_timeout_s: float | None = setting(None, "a batch running longer than this marks its instance hung: it "
                                                  "is killed, its requests re-run elsewhere, and it is respawned "
                                                  "(default: --hang-factor × the profile's latency for the batch, "
                                                  "at least --hang-floor-s)", above=0, metavar="S")
    hang_factor: float | None = setting(None, f"without --batch-timeout-s: the times its expected latency a batch "
                                              f"may run (default: {HANG_FACTOR:g})", minimum=0, metavar="F")
    hang_floor_s: float | None = setting(None, f"... and at least this long (default: {HANG_FLOOR_S:g})",
                                         minimum=0, metavar="S")
    estimator: EstimatorSettings | None = setting(None, "the batch-size estimator's settings")
    share_node: bool = setting(True, "plan the cores with the other packrat models served on the same cores "
                                     "(serving/node/; --no-share-node: this model plans alone)")
    turn_ms: float = setting(TURN_MS, "on cores time-shared with other models, the longest turn one batch takes "
                                      "before the others get theirs (longer where another model's single "
                                      "request is): a longer batch runs in several turns",
                             above=0, metavar="MS")
    slo_ms: float | None = setting(None, "the model's latency objective in ms: the machine's cores are then "
                                         "planned to serve the most load within every model's objective, and "
                                         "`packrat status` names a model that cannot meet it (default: none; "
                                         "the cores go where the worst slowdown is least)",
                                   above=0, per_model=True, metavar="MS")

    def __post_init__(self) -> None:
        _check_fields(self)
        if not self.model:
            raise ValueError("packrat setting 'model' is empty: name the model to serve")

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
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, EstimatorSettings):
                value = value.to_section()
            if value is not None:
                section[f.name] = list(value) if isinstance(value, tuple) else value
        return section

    @classmethod
    def from_section(cls, section: dict) -> Settings:
        """Settings from a `packrat:` section (or Ray application arguments, less Ray's own keys)."""
        if not isinstance(section, dict) or "model" not in section:
            raise ValueError("the packrat settings need at least 'model' (build the archive with `packrat archive`)")
        return cls(**_known(cls, section))


def setting_value(schema: type, name: str, value, prefix: str = ""):
    """`value` (text from a command line, or YAML's) as the schema's field `name` takes it: converted to
    its type and checked against its bounds; a ValueError naming the setting otherwise."""
    (found,) = [f for f in fields(schema) if f.name == name]
    return _checked(found, value, prefix)


def _known(schema: type, section: Mapping, prefix: str = "") -> dict:
    """`section` when it names only `schema`'s fields; unknown keys are refused by name."""
    known = {f.name for f in fields(schema)}
    unknown = sorted(set(section) - known)
    if unknown:
        raise ValueError(f"unknown packrat setting(s) {[prefix + key for key in unknown]}: expected some of "
                         f"{sorted(known)}")
    return dict(section)


def _check_fields(settings, prefix: str = "") -> None:
    """Each field of a frozen schema instance converted and checked (_checked), in place."""
    for f in fields(settings):
        object.__setattr__(settings, f.name, _checked(f, getattr(settings, f.name), prefix))


def _checked(f: dataclasses.Field, value, prefix: str = ""):
    name = prefix + f.name
    value = _converted(name, f.type, value)
    if value is None:
        return None
    meta = f.metadata
    if "choices" in meta and value not in meta["choices"]:
        raise ValueError(f"packrat setting {name!r} must be one of {list(meta['choices'])}, got {value!r}")
    for key, holds, says in (("minimum", lambda v, m: v >= m, ">="), ("above", lambda v, m: v > m, ">"),
                             ("maximum", lambda v, m: v <= m, "<="), ("below", lambda v, m: v < m, "<")):
        if key in meta and not holds(value, meta[key]):
            raise ValueError(f"packrat setting {name!r} must be {says} {meta[key]}, got {value}")
    return value


def _converted(name: str, kind: str, value):
    """`value` as the setting's type (the annotation's text), from YAML, JSON or a command-line string."""
    if value is None:
        return None
    if kind.startswith("EstimatorSettings"):
        return EstimatorSettings.from_section(value)
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
