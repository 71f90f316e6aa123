"""Runtimes: which engine runs an instance's model.

- ``inductor``: torch itself, in the model's graph mode (by default its AOTInductor packages,
  packrat/models/compiled.py).
- ``openvino``: the model converted once to OpenVINO's IR (``openvino.convert_model``), compiled at
  load for the instance's batch sizes (static shapes), with exactly the instance's threads
  (``INFERENCE_NUM_THREADS``), one stream, and OpenVINO's own thread pinning off: the instance
  process is already pinned to its cores, and OpenVINO's threads inherit that.
- ``onnxruntime``: the model exported once to ONNX with a dynamic batch, run by an
  ``InferenceSession`` with ``intra_op_num_threads`` = the instance's threads and one inter-op thread.
- ``torch-compile``: torch.compile of the module in the instance's process (inductor, frozen
  weights, static shapes), compiled at the instance's warm-up for each size of its batch's halving
  ladder, with inductor's own cache on disk. What a user writes: issue 42's peers run found it
  12–16 % faster than the AOTInductor packages of the default graph mode on BERT-base (2 cores);
  issue 48's profile found it 2.3× slower, at eager's speed (BENCHMARKS.md). The profile measures it
  like any runtime and drops it where it is dominated. It compiles in every new instance (seconds
  from a warm cache) rather than once.
- ``onnxruntime-thread``: the same session, hosted as a thread of the serving process rather than a
  process of its own (the instance's *kind*): the session's intra-op threads pinned one to a core of
  the instance (``session.intra_op_thread_affinities``), the calling thread to the first. No hand-off
  between processes; what a fault can do differs (docs/serving.md). torch runtimes stay
  processes: torch's intra-op pool is one per process.
- ``ios``: torch running the model by an IOS schedule (ios_scheduler: independent operators in
  concurrent groups on disjoint threads), searched once per model, threads and batch and kept in a
  cache folder (IOS_CACHE by default). Opt-in (OPT_IN: ``packrat profile --ios``): each point's
  search takes seconds to minutes, and it pays only where an instance has more threads than one
  operator can use, so the profile measures it only there (packrat/profiling/reach.py).

Per instance, OpenVINO and ONNX Runtime may beat inductor's kernels (ResNet-50 on 2 cores: 4–11 %,
BENCHMARKS.md); the profile measures every ⟨t, b⟩ under each runtime asked for and the planner takes
the fastest (profiling/profiles.py), so one plan may mix runtimes.

An artefact (IR or ONNX file) is built once per model and kept beside the compiled packages, named
by the same key (compiled.package_key: the model's sources, inputs, torch and the CPU), so an
archive can ship it. Building it checks the runtime against eager torch on the model's example
inputs: outputs that differ by more than TOLERANCE of the largest output leave a ``.refused`` file
with the reason, and the runtime is refused for that model from then on (RuntimeRefused).

openvino and onnxruntime install with packrat (a torch-only install leaves them out); torch is
imported where it is used, so CLIs read RUNTIMES without paying for it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import logging
import os
import warnings
from pathlib import Path

RUNTIMES = ("inductor", "openvino", "onnxruntime", "onnxruntime-thread", "torch-compile", "ios")
DEFAULT_RUNTIME = "inductor"
TORCH_RUNTIMES = ("inductor", "torch-compile", "ios")  # torch runs the model: its threads are the instance's
OPT_IN = ("ios",)  # measured only when asked for, never by default (installed_runtimes)
IOS_CACHE = Path("profiles/ios-schedules")  # where IOS schedules are kept unless a folder is named
# thread-kind runtime -> the runtime it hosts as a thread of the serving process (its process kind)
THREAD_KINDS = {"onnxruntime-thread": "onnxruntime"}
PACKAGES = {"openvino": "openvino", "onnxruntime": "onnxruntime", "onnxruntime-thread": "onnxruntime",
            "torch-compile": "torch"}
INSTALL_HINT = "pip install openvino onnxruntime onnx onnxscript (packrat-serve installs them unless installed torch-only)"
TOLERANCE = 1e-3  # largest |runtime - eager| relative to eager's largest |output|
CHECK_BATCH = 2  # the batch artefacts are converted and checked at (1 could be specialised away)
SUFFIXES = {"openvino": ".openvino.xml", "onnxruntime": ".onnx"}  # the artefacts kept
CHECKED = {"torch-compile": ".torch-compile.checked"}  # runtimes that keep a verdict but no artefact


class RuntimeRefused(Exception):
    """A runtime cannot run this model: not installed, it fails to convert, or its outputs differ."""


def base_runtime(runtime: str) -> str:
    """The engine a runtime runs the model with, whatever its kind: onnxruntime-thread's is onnxruntime."""
    return THREAD_KINDS.get(runtime, runtime)


def instance_kind(runtime: str) -> str:
    """How an instance of `runtime` is hosted: "thread" (a thread of the serving process) or "process"."""
    return "thread" if runtime in THREAD_KINDS else "process"


def process_kind(runtime: str) -> str:
    """The same runtime hosted as a process (what replaces a thread instance that will not stop)."""
    return base_runtime(runtime)


def installed(runtime: str) -> bool:
    package = PACKAGES.get(runtime)
    return package is None or importlib.util.find_spec(package) is not None


def version(runtime: str) -> str:
    """The installed version of the runtime's package ("" for inductor, or when it is missing)."""
    package = PACKAGES.get(runtime)
    if package is None:
        return ""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


def runtime_of(mode: str) -> str:
    """The runtime of an instance that runs the model in `mode`: a graph mode (compile, script,
    eager) is torch's, inductor; another runtime's name (ios included) is that runtime."""
    return mode if mode in RUNTIMES else DEFAULT_RUNTIME


def torch_threads(mode: str, threads: int) -> int:
    """torch's intra-op threads in an instance of `threads` threads running the model in `mode` (a
    graph mode, or the runtime running it): all of them when torch runs the model; one when
    another runtime does. torch then only decodes and encodes, and a team of OpenMP threads of its
    own would spin on the instance's cores after each of those small parallel regions while the
    runtime's threads want them: SqueezeNet's model stage against its profile point went from
    1.61 to 1.10 under OpenVINO and from 1.57 to 1.29 under ONNX Runtime at b = 1 with one torch
    thread (BENCHMARKS.md, issue 32). Pool instances and the profiler's served points set it alike."""
    return threads if runtime_of(mode) in TORCH_RUNTIMES else 1


def installed_runtimes() -> tuple[str, ...]:
    """The runtimes a profile measures by default: every installed one but the opt-in ones."""
    return tuple(r for r in RUNTIMES if installed(r) and r not in OPT_IN)


def parse(text: str) -> tuple[str, ...]:
    """A comma-separated list of runtimes, checked: ValueError names the unknown or missing ones."""
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [name for name in names if name not in RUNTIMES]
    if unknown or not names:
        raise ValueError(f"unknown runtime(s) {', '.join(unknown) or '(none given)'}: choose from {', '.join(RUNTIMES)}")
    missing = [name for name in names if not installed(name)]
    if missing:
        raise ValueError(f"runtime(s) {', '.join(missing)} not installed: {INSTALL_HINT}")
    return names


def deviation(output, reference) -> dict:
    """How far `output` is from `reference` (arrays or tensors): max_abs_diff, and relative_diff to the
    reference's largest magnitude; both None, with why, when the shapes differ or a value is not finite."""
    import numpy as np

    output, reference = np.asarray(output, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if output.shape != reference.shape:
        return {"max_abs_diff": None, "relative_diff": None,
                "why": f"output shape {list(output.shape)}, eager's {list(reference.shape)}"}
    if not (np.isfinite(output).all() and np.isfinite(reference).all()):
        return {"max_abs_diff": None, "relative_diff": None, "why": "non-finite outputs"}
    worst = float(np.abs(output - reference).max()) if output.size else 0.0
    scale = float(np.abs(reference).max()) if reference.size else 0.0
    return {"max_abs_diff": worst, "relative_diff": worst / scale if scale > 0 else worst}


def difference(output, reference) -> str | None:
    """Why `output` is not `reference` (arrays or tensors) within TOLERANCE, or None if it is."""
    found = deviation(output, reference)
    if found.get("why") or found["relative_diff"] <= TOLERANCE:
        return found.get("why")
    return (f"outputs differ from eager's by {found['max_abs_diff']:.3g} ({found['relative_diff']:.2%} of the "
            f"largest output; at most {TOLERANCE:.1%})")


# ---- artefacts: built once per model, checked against eager -----------------------------------

def artefact_path(spec, runtime: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where `runtime`'s artefact for `spec` lives: beside its compiled packages, named by their key
    and the runtime's version (a conversion, or a refusal, made by one version is not trusted by
    another: an upgrade converts and checks again)."""
    from packrat.models import compiled
    from packrat.models.spec import SEED

    runtime = base_runtime(runtime)  # both kinds of a runtime run the same artefact
    key = compiled.package_key(f"{spec.name}:{SEED}", spec.sources, spec.inputs)
    suffix = SUFFIXES.get(runtime) or CHECKED[runtime]
    return Path(cache_dir or compiled.default_cache_dir()) / f"{spec.name}-{key}-{version(runtime)}{suffix}"


def artefact_files(path: Path) -> list[Path]:
    """Every file an artefact is made of (OpenVINO's IR: the .xml and its .bin)."""
    return [path, path.with_suffix(".bin")] if path.name.endswith(".xml") else [path]


def refusal(path: Path) -> Path:
    return path.with_name(path.name + ".refused")


def ensure_artefact(spec, runtime: str, shipped: str | None = None) -> Path:
    """The artefact for `spec` under `runtime`: the shipped one, else this machine's cache, built
    (and checked against eager) there if missing; None for a runtime that keeps none (torch-compile
    compiles in each instance: checked here, check_compiled). RuntimeRefused when the runtime cannot
    run it."""
    from packrat.models import compiled

    if not installed(runtime):
        raise RuntimeRefused(f"{runtime} is not installed ({INSTALL_HINT})")
    runtime = base_runtime(runtime)
    if runtime == "torch-compile":
        check_compiled(spec)
    if runtime not in SUFFIXES:
        return None
    if shipped is not None and artefact_path(spec, runtime, shipped).exists():
        return artefact_path(spec, runtime, shipped)
    path = artefact_path(spec, runtime)
    path.parent.mkdir(parents=True, exist_ok=True)
    with compiled.locked(path):  # instances starting together build it once
        if refusal(path).exists():
            raise RuntimeRefused(refusal(path).read_text().strip())
        if not path.exists():
            try:
                build_artefact(spec, runtime, path)
            except RuntimeRefused as exc:
                refusal(path).write_text(f"{exc}\n")
                raise
    return path


def build_artefact(spec, runtime: str, path: Path) -> None:
    """Convert `spec`'s model into `path` and check the result against eager at CHECK_BATCH."""
    import torch

    module = spec.build()
    examples = spec.example_inputs(CHECK_BATCH)
    with torch.inference_mode():
        reference = module(*examples)
    partial = path.with_name(f".partial-{os.getpid()}-{path.name}")
    try:
        try:
            _CONVERT[runtime](module, spec, examples, partial)
            runner = _RUNNERS[runtime](partial, spec, CHECK_BATCH, torch.get_num_threads())
            output = runner(*examples)
        except Exception as exc:  # a converter's or runtime's failure: this runtime cannot serve the model
            raise RuntimeRefused(f"{runtime} cannot run {spec.name}: {type(exc).__name__}: "
                                 f"{(str(exc).splitlines() or [''])[0][:300]}") from None
        why = difference(output, _first(reference))
        if why:
            raise RuntimeRefused(f"{runtime} refused for {spec.name}: {why}")
        for part, final in zip(artefact_files(partial), artefact_files(path)):
            os.replace(part, final)  # the .bin before the .xml would be safer, but the lock covers readers
    finally:
        for part in artefact_files(partial):
            part.unlink(missing_ok=True)


def _check_against_eager(spec, module, examples: tuple, runtime: str) -> None:
    """RuntimeRefused unless `module` (the model under `runtime`) answers `examples` as eager does."""
    import torch

    with torch.inference_mode():
        why = difference(_first(module(*examples)), _first(spec.build().eval()(*examples)))
    if why:
        raise RuntimeRefused(f"{runtime} refused for {spec.name}: {why}")


def _first(value):
    while isinstance(value, (tuple, list)):
        value = value[0]
    return value


@contextlib.contextmanager
def _quiet_converter():
    """The converters trace the model (torch.jit's deprecation notice), log what they skip
    (torchvision's operators, which packrat's models never use) and warn about their own internals:
    nothing a user can act on."""
    onnx_log = logging.getLogger("torch.onnx")
    level = onnx_log.level
    onnx_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        onnx_log.setLevel(level)


def _convert_openvino(module, spec, examples, path: Path) -> None:
    import openvino as ov

    with _quiet_converter():
        model = ov.convert_model(module, example_input=examples)
    ov.save_model(model, str(path), compress_to_fp16=False)  # f32 weights: the outputs must match eager's


def _convert_onnx(module, spec, examples, path: Path) -> None:
    import torch

    names = [s.name for s in spec.inputs]
    batch = torch.export.Dim("batch", min=1, max=4096)
    with torch.no_grad(), _quiet_converter():
        program = torch.onnx.export(module, examples, dynamo=True, input_names=names, output_names=["output"],
                                    dynamic_shapes=tuple({0: batch} for _ in names), verbose=False)
        program.save(str(path), external_data=False)


_CONVERT = {"openvino": _convert_openvino, "onnxruntime": _convert_onnx}


# ---- running: one instance's model ----------------------------------------------------------

class OpenVinoRunner:
    """The IR compiled for one static batch size, with `threads` threads and no pinning of its own;
    `plain`: as a careful user compiles it (the LATENCY hint and OpenVINO's own pinning and streams)."""

    def __init__(self, path: Path, spec, batch: int, threads: int, plain: bool = False):
        import openvino as ov

        core = ov.Core()
        model = core.read_model(str(path))
        model.reshape({i: [batch, *s.shape] for i, s in enumerate(spec.inputs)})  # static: the fastest
        config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32"}
        if not plain:
            config.update({"NUM_STREAMS": 1, "ENABLE_CPU_PINNING": False})
        compiled = core.compile_model(model, "CPU", config)
        self.request = compiled.create_infer_request()

    def __call__(self, *inputs):
        import torch

        result = self.request.infer([x.contiguous().numpy() for x in inputs], share_inputs=True)
        return torch.from_numpy(result[0].copy())


class OrtRunner:
    """An InferenceSession: `threads` intra-op threads, one inter-op thread, any batch size.

    With `cores` (a thread instance: the session lives in a thread of the serving process), its
    intra-op threads are pinned one to each core after the first (``intra_op_thread_affinities``:
    1-based CPU ids, an entry per thread but the calling one, which computes too and is pinned by its
    caller to the first core). `cancel()` ends a run under way from another thread (its call then
    raises RunCancelled). `plain`: the session as a careful user makes it, the runtime's defaults
    but for a thread per core. `stop_spinning`: its threads stop spinning when a run ends, for the
    decoders that share its cores (plain or not)."""

    def __init__(self, path: Path, spec, batch: int, threads: int, cores=None, plain: bool = False,
                 stop_spinning: bool = True):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3  # warnings about unused initialisers are not the user's concern
        if not plain:
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            options.inter_op_num_threads = 1
        if stop_spinning:
            # Its threads spin between the operators of a run, and stop when the run ends: spinning on
            # after it took a core from the instance's decoders (4 JPEGs of a SqueezeNet batch: decoded
            # in 9.1 ms on 2 decoders, as if on one, against 4.8 in-process; BENCHMARKS.md, issue 41).
            # Without decoders nothing of the instance's needs their cores after a run: they spin on,
            # as a plain session's do (issue 63; its effect alone was not measured apart). A plain
            # session (the careful handler's) is told the same where its decoders run (issue 70).
            options.add_session_config_entry("session.force_spinning_stop", "1")
        if cores is not None and threads > 1:
            options.add_session_config_entry("session.intra_op_thread_affinities", ort_affinities(cores, threads))
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.run_options = ort.RunOptions()
        wanted = {i.name for i in self.session.get_inputs()}  # an input the graph ignores may be gone
        self.names = [(i, s.name) for i, s in enumerate(spec.inputs) if s.name in wanted]

    def __call__(self, *inputs):
        import torch

        feeds = {name: inputs[i].contiguous().numpy() for i, name in self.names}
        options = self.run_options
        try:
            return torch.from_numpy(self.session.run(None, feeds, options)[0])
        except Exception as exc:
            if options.terminate:
                raise RunCancelled(f"the run was cancelled: {first_line(exc)}") from None
            raise
        finally:
            if options.terminate:  # the next run starts afresh: cancel() ends one run, not the session
                self.run_options = type(options)()

    def cancel(self) -> None:
        self.run_options.terminate = True


class RunCancelled(Exception):
    """A runtime's run ended by cancel() from another thread (the watchdog's)."""


def ort_affinities(cores, threads: int) -> str:
    """ONNX Runtime's intra_op_thread_affinities for `threads` threads on `cores`: each thread but the
    calling one (the first core's) on a core of its own, as 1-based CPU ids."""
    return ";".join(str(core + 1) for core in list(cores)[1:threads])


def first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0][:200]


_RUNNERS = {"openvino": OpenVinoRunner, "onnxruntime": OrtRunner}


def torch_compiled(spec, batch: int):
    """torch.compile of the model with frozen weights and static shapes, behind a Ladder of the
    batch's halving sizes (a smaller sub-batch is padded to the next size, as with the AOT packages),
    so it compiles for those sizes alone, each at its first call."""
    from packrat.models import compiled

    sizes = compiled.ladder(batch)
    module = _compiled(spec.build().eval(), len(sizes))  # one module: a graph per size, one copy of the weights
    return compiled.Ladder({size: module for size in sizes})


def _compiled(module, sizes: int):
    """torch.compile of `module` as instances run it: weights frozen (conv+BN folded, layouts fixed,
    as in the AOT packages), static shapes (a graph per size), and a graph that cannot compile an
    error, never eager code running under torch-compile's name."""
    import torch
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    dynamo_config.suppress_errors = False
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, sizes + 1)
    return torch.compile(module, dynamic=False)


def check_compiled(spec) -> None:
    """torch.compile checked on this machine once per model and torch version (the verdict kept in
    the compile cache): it compiles, in one graph, to eager's outputs. RuntimeRefused says why not:
    its error, its graph breaks (the parts that would run eager), or how the outputs differ."""
    from packrat.models import compiled

    path = artefact_path(spec, "torch-compile")
    path.parent.mkdir(parents=True, exist_ok=True)
    with compiled.locked(path):
        if refusal(path).exists():
            raise RuntimeRefused(refusal(path).read_text().strip())
        if path.exists():
            return
        try:
            _check_compiled(spec)
        except RuntimeRefused as exc:
            refusal(path).write_text(f"{exc}\n")
            raise
        path.write_text("compiled in one graph to eager's outputs\n")


def _check_compiled(spec) -> None:
    import torch
    from torch._dynamo.utils import counters

    module = spec.build().eval()
    examples = spec.example_inputs(CHECK_BATCH)
    with torch.inference_mode():
        reference = module(*examples)
        counters["graph_break"].clear()
        try:
            output = _compiled(module, 1)(*examples)
        except Exception as exc:
            raise RuntimeRefused(f"torch-compile cannot compile {spec.name}: {type(exc).__name__}: "
                                 f"{first_line(exc)}") from None
    breaks = counters["graph_break"]
    if breaks:
        reason = first_line(Exception(next(iter(breaks))))
        raise RuntimeRefused(f"torch-compile runs {spec.name} partly eager: {sum(breaks.values())} graph "
                             f"break(s), the first: {reason}")
    why = difference(_first(output), _first(reference))
    if why:
        raise RuntimeRefused(f"torch-compile refused for {spec.name}: {why}")


def prepare_runtime(spec, runtime: str, batch: int, threads: int, shipped: str | None = None,
                    ios_cache: str | os.PathLike | None = None, cores=None, finish_ios: bool = False,
                    ladder: bool = True, plain: bool = False, stop_spinning: bool = True):
    """(callable, example inputs at `batch`) for an instance of `batch` running `runtime`: OpenVINO
    compiled for each size of the batch's halving ladder (as the AOT packages are), ONNX Runtime's
    one session for all (its threads pinned to `cores` for a thread-kind instance, whose calling
    thread is on cores[0]), torch.compile's graphs for the ladder's sizes (torch_compiled), the IOS
    schedule for `threads` and `batch` from `ios_cache` (IOS_CACHE by default; searched there when
    missing, or with `finish_ios` when its search was cut short), checked against eager. Not
    `ladder` (a profile point), OpenVINO compiles for `batch` alone. `plain`: ONNX Runtime's session
    or OpenVINO's compiled model as a careful user makes it (OrtRunner, OpenVinoRunner);
    `stop_spinning`: ONNX Runtime's threads stop spinning after a run (OrtRunner).
    RuntimeRefused when the runtime cannot run the model."""
    from packrat.models import compiled

    if runtime == "ios":
        from packrat.ios_scheduler.cache import prepare_ios

        module, examples, _ = prepare_ios(spec, batch, threads, ios_cache or IOS_CACHE, finish=finish_ios)
        _check_against_eager(spec, module, examples, "ios")
        return module, examples
    examples = spec.example_inputs(batch)
    if runtime == "torch-compile":
        return torch_compiled(spec, batch), examples
    path = ensure_artefact(spec, runtime, shipped)
    if base_runtime(runtime) == "onnxruntime":
        return OrtRunner(path, spec, batch, threads, cores if instance_kind(runtime) == "thread" else None,
                         plain, stop_spinning), examples
    return compiled.Ladder({size: OpenVinoRunner(path, spec, size, threads, plain)
                            for size in compiled.ladder(batch, ladder)}), examples
