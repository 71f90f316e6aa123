"""Building model archives (.mar) for TorchServe: the handler, profiles, packrat settings, shipped files."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from packrat import handlers
from packrat.errors import ServeError
from packrat.models.modes import DEFAULT_MODE
from packrat.models.runtimes import DEFAULT_RUNTIME, IOS_CACHE
from packrat.settings import Settings

HANDLERS = Path(handlers.__file__).parent
DEFAULT_IOS_CACHE = IOS_CACHE  # where `packrat profile --ios` keeps schedules
HF_ARCHIVE_DIR = "hf-model"  # where an archive keeps a Hugging Face model's directory


def model_config_yaml(settings: Settings, *, handler: str = "packrat", max_batch_delay_ms: int = 50,
                      job_queue: int | None = None) -> str:
    """TorchServe's per-model config: its batching and workers, and packrat's settings under `packrat:`.

    The packrat handler gets one worker (the pool uses every core) in TorchServe's ordinary mode, and
    so do the careful handler and the stock handler running another runtime than inductor (one
    session with a thread a core):
    TorchServe gathers batches of up to max_batch within max_batch_delay_ms and the pool splits
    each among its instances. (TorchServe's asynchronous mode strands requests under load:
    BENCHMARKS.md, issue 16.) `job_queue`: TorchServe's queue for the model (jobQueueSize: requests
    beyond it are answered 503 before the worker sees them); None: TorchServe's default."""
    torchserve = {"batchSize": settings.max_batch, "maxBatchDelay": max_batch_delay_ms, "responseTimeout": 300,
                  "startupTimeout": 600}
    if handler in ("packrat", "careful") or settings.runtime not in (None, DEFAULT_RUNTIME):
        # the pool, or a handler's one session of a runtime, has a thread on every core
        torchserve.update(minWorkers=1, maxWorkers=1)
    if job_queue is not None:
        torchserve["jobQueueSize"] = job_queue
    return yaml.safe_dump({**torchserve, "packrat": settings.to_section()}, sort_keys=False)


def archive_name(model: str) -> str:
    """The archive's (and the served model's) default name: the model's, as TorchServe accepts it."""
    from packrat.models.zoo import HF_PREFIX

    return Path(model.removeprefix(HF_PREFIX).rstrip("/")).stem.replace(":", "_").replace(".", "_")


def request_files(settings: Settings) -> dict[str, Path]:
    """The tokenizer and labels files the archive must carry, by setting ("tokenizer", "labels")."""
    found = {}
    if settings.tokenizer is not None:
        path = Path(settings.tokenizer)
        path = path / "tokenizer.json" if path.is_dir() else path
        if not path.is_file():
            raise ServeError(f"no tokenizer at {path}: pass a directory holding a Hugging Face tokenizer.json")
        found["tokenizer"] = path
    if settings.labels is not None:
        if not Path(settings.labels).is_file():
            raise ServeError(f"no labels file at {settings.labels}: pass TorchServe's index_to_name.json")
        found["labels"] = Path(settings.labels)
    return found


def build(settings: Settings, out_dir: Path, *, name: str | None = None, handler: str = "packrat",
          max_batch_delay_ms: int = 50, ios_cache: Path = DEFAULT_IOS_CACHE) -> Path:
    """Build NAME.mar with torch-model-archiver: the handler, `settings` with the files they name
    (profiles, tokenizer, labels; the model file of a TorchScript or torch.export model, the
    directory of a Hugging Face one) shipped inside and renamed there. Zoo models are rebuilt from
    code in the worker. A model served compiled (the profile's mode, or the stock handler's default)
    gets its compiled packages built here, once per machine type, and shipped (see compiled_files);
    the artefacts of the profile's other runtimes (OpenVINO, ONNX Runtime) are shipped too.
    A profile with points of the ios runtime (`packrat profile --ios`) may plan IOS instances: the
    archive carries the model's cached schedules from `ios_cache` (the pool searches any missing).

    Several profiles (one per machine type) ship as profile-0.csv, ...: each server plans with
    the one chosen for its CPU and budget (profiles.choose), and what is built here (compiled
    packages, IOS schedules) follows the one chosen for this machine, with `settings.cores`."""
    from packrat.machine.budget import cpu_budget
    from packrat.models.zoo import resolve

    spec = resolve(settings.model, settings.input_shape)  # fail here on an unknown model, not in a worker
    name = name or archive_name(settings.model)
    requests = request_files(settings)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as staging:
        staging = Path(staging)
        extra = [HANDLERS / "common.py", *requests.values()]
        model_ref, model_files = shipped_model(settings.model, staging)
        extra += model_files
        budget = cpu_budget(settings.cores, "--cores")
        profile_names, chosen = [], None
        if handler == "packrat":
            profile_names, chosen = shipped_profiles(settings.profiles, staging, budget.cores)
            extra += [staging / shipped for shipped in profile_names]
        # The mode the instances (or the stock handler) will run: the settings' if they name one, as in
        # serving.engine.served_mode, so that nothing is shipped for a mode that is not run.
        mode = settings.graph_mode or (chosen.metadata["mode"] if chosen else DEFAULT_MODE)
        ios = chosen is not None and "ios" in chosen.measured_runtimes
        if ios:  # the archiver flattens folders: schedules sit beside the profile, named by model
            extra += cached_schedules(spec.name, Path(ios_cache))
        if mode == "compile":
            extra += compiled_files(spec, settings.max_batch,
                                    planned_instances(chosen, settings.max_batch, handler, budget.cores,
                                                      settings.share_node))
        if chosen is not None:
            extra += runtime_files(spec, chosen.measured_runtimes)
        packed = settings.replace(model=model_ref, profiles=tuple(profile_names), ios=ios,
                                  **{key: path.name for key, path in requests.items()})
        config = staging / "model-config.yaml"
        job_queue = admitted_queue(settings, chosen, budget.cores, name) if handler == "packrat" else None
        config.write_text(model_config_yaml(packed, handler=handler, max_batch_delay_ms=max_batch_delay_ms,
                                            job_queue=job_queue))
        _run_tool(["torch-model-archiver", "--model-name", name, "--version", "1.0",
                   "--handler", str(HANDLERS / f"{handler}_handler.py"), "--config-file", str(config),
                   "--extra-files", ",".join(map(str, extra)), "--export-path", str(out_dir), "--force"])
    return out_dir / f"{name}.mar"


def shipped_model(model: str, staging: Path) -> tuple[str, list[Path]]:
    """How the archive names the model, and the files that carry it (none for a zoo model or factory)."""
    from packrat.models.zoo import HF_PREFIX

    if Path(model).is_file():
        return Path(model).name, [Path(model)]
    if model.startswith(HF_PREFIX):  # the archiver copies a folder's contents: wrap the directory in one
        bundle = staging / "bundle"
        shutil.copytree(model[len(HF_PREFIX):], bundle / HF_ARCHIVE_DIR)
        return HF_PREFIX + HF_ARCHIVE_DIR, [bundle]
    return model, []


def shipped_profiles(paths: tuple[str, ...], staging: Path, cores: int):
    """The profiles copied into `staging` under the names the archive gives them, and the one this
    machine (with `cores` budgeted) would choose."""
    from packrat.profiling.profiles import chosen as profile_for_machine

    if not paths:
        raise ServeError("the packrat handler needs a profile: run `packrat profile` first or pass --profile")
    chosen = profile_for_machine([Path(p) for p in paths], cores)[0]  # also rejects a bad profile, with its reason
    names = ["profile.csv"] if len(paths) == 1 else [f"profile-{i}.csv" for i in range(len(paths))]
    for path, name in zip(paths, names):
        shutil.copy(path, staging / name)
    return names, chosen


UPSTREAM_HEADROOM = 4.0  # served batch time over the profile's that TorchServe's queue is sized for


def admitted_queue(settings: Settings, profile, cores: int, name: str | None = None) -> int | None:
    """TorchServe's queue for the packrat handler: what the deadline admits at UPSTREAM_HEADROOM
    times the batch time the plan predicts on a machine like this one (admission.upstream_queue),
    within --max-queue; or, where a handler serving `name` remembered the pace it was served at
    (the served dir, within a day), what the deadline admits at that pace a third slower, if fewer.
    The profile times the model: served batches took 1.1× its figure with raw tensors and 12× with
    JSON bodies (SqueezeNet, 2 cores), and TorchServe refuses at once only beyond its queue; the
    handler refuses the rest after their wait there. With --admission queue, --max-queue itself.
    None (TorchServe's default, 100) when neither says, or the profile cannot plan the batch."""
    from packrat.errors import NoPlanError
    from packrat.planning.planner import plan
    from packrat.frontends.torchserve_control import remembered_queue_pace
    from packrat.serving.pool.admission import SWING, upstream_queue
    from packrat.settings import MAX_QUEUE, REQUEST_TIMEOUT_S, SERVED_DIR_ENV

    if settings.admission == "queue":
        return settings.max_queue
    max_queue = settings.max_queue or MAX_QUEUE
    try:
        latency_ms = plan(profile.items(), cores, settings.max_batch).expected_latency_ms
    except (NoPlanError, ValueError):
        return None
    if latency_ms is None:
        return None
    timeout_s = settings.request_timeout_s or REQUEST_TIMEOUT_S
    sized = upstream_queue(timeout_s, UPSTREAM_HEADROOM * latency_ms / 1e3, settings.max_batch, max_queue)
    served_s = name and remembered_queue_pace(SERVED_DIR_ENV.get(), name, settings.max_batch)
    return min(sized, upstream_queue(timeout_s, SWING * served_s, settings.max_batch, max_queue)) if served_s else sized


def planned_instances(profile, batch_size: int, handler: str, cores: int, node: bool = False
                      ) -> set[tuple[int, int]] | None:
    """The ⟨threads, batch⟩ of the instances the server will start first on a machine like this
    one, with `cores` cores budgeted: the plan of `profile` (a loaded Profile) for its batch size and
    the fat instance (the stock handler: the fat one alone); with `node` (the model shares the
    machine's cores with others), the plans for every share the node may give it, 1 to `cores`
    cores, so that no move waits for a compiler. None when the profile cannot plan it (then every
    size up to the batch is shipped)."""
    from packrat.errors import NoPlanError
    from packrat.planning.planner import plan

    if handler != "packrat":
        return {(cores, batch_size)}
    shapes = {(cores, batch_size)}
    for share in range(1 if node else cores, cores + 1):
        try:
            shapes |= {(i.threads, i.batch) for i in plan(profile.items(), share, batch_size).instances}
        except (NoPlanError, ValueError):
            if share == cores:
                return None
    return shapes


def runtime_files(spec, runtimes: list[str]) -> list[Path]:
    """The artefacts (OpenVINO IR, ONNX) of the profile's other runtimes in this machine's cache, which
    profiling them built: shipped, so a server does not convert the model again."""
    from packrat.models.runtimes import SUFFIXES, artefact_files, artefact_path, base_runtime

    found = []
    for runtime in dict.fromkeys(map(base_runtime, runtimes)):  # both kinds of a runtime share one artefact
        if runtime in SUFFIXES:  # inductor's packages are shipped apart; torch-compile keeps none
            files = artefact_files(artefact_path(spec, runtime))
            if all(f.exists() for f in files):
                found += files
            else:
                print(f"archive: no {runtime} artefact of {spec.name} in this machine's cache: each server converts "
                      f"the model on its first start")
    return found


def compiled_files(spec, batch_size: int, instances: set[tuple[int, int]] | None = None) -> list[Path]:
    """The model's compiled packages in this machine's cache (those its profile built) for the
    archive to ship: those of `instances` (⟨threads, batch⟩, each with its batch ladder), or if
    None every one up to `batch_size`. The instances load them instead of compiling; one whose
    package is missing (a plan the archive did not foresee, another CPU type or torch version)
    builds it on first start, once per machine. A package holds the model's weights, so shipping
    only what the first plan needs keeps a many-core archive small."""
    from packrat.models.compiled import ladder
    from packrat.models.zoo import compiled_packages

    found = compiled_packages(spec, batch_size)
    if instances is not None:
        wanted = {(threads, size) for threads, batch in instances for size in ladder(batch)}
        found = [path for path in found if package_shape(path) in wanted]
    if not found:
        print(f"archive: no compiled packages of {spec.name} in this machine's cache (profile it first): "
              f"the first instances will compile them", file=sys.stderr, flush=True)
    return found


def package_shape(path: Path) -> tuple[int, int]:
    """⟨threads, batch⟩ of a compiled package, from its name (NAME-KEY-tT-bB.aoti.pt2)."""
    threads, batch = path.name.split(".")[0].rsplit("-", 2)[1:]
    return int(threads[1:]), int(batch[1:])


def cached_schedules(model: str, cache: Path) -> list[Path]:
    """The model's IOS schedules in `cache`, one per threads and batch, whose every part was searched."""
    from packrat.ios_scheduler.cache import complete_schedules, schedule_path

    found = sorted(cache.glob(schedule_path(cache, model, 0, 0).name.replace("-t0-b0", "-t*-b*")))
    return complete_schedules(found)  # a search cut short is not shipped as final: the pool searches it


def _run_tool(cmd: list[str]) -> None:
    exe = Path(sys.executable).parent / cmd[0]
    cmd = [str(exe) if exe.exists() else cmd[0], *cmd[1:]]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ServeError(f"{Path(cmd[0]).name} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
