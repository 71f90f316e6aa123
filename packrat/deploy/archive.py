"""Building model archives (.mar) for TorchServe: the handler, profiles, packrat settings, shipped files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import handlers

from packrat.errors import ServeError
from packrat.models.modes import DEFAULT_MODE

HANDLERS = Path(handlers.__file__).parent
DEFAULT_IOS_CACHE = Path("profiles/ios-schedules")  # where `packrat profile --ios` keeps schedules
HF_ARCHIVE_DIR = "hf-model"  # where an archive keeps a Hugging Face model's directory


@dataclass(frozen=True)
class RequestSettings:
    """How the handler reads requests (the `packrat:` section's codec keys)."""

    tokenizer: Path | None = None  # a Hugging Face tokenizer.json, or a directory holding one
    labels: Path | None = None  # TorchServe's index_to_name.json
    max_body_bytes: int = 16 * 2**20  # larger bodies: 413 with the reason
    truncate_text: bool = False  # text longer than the model takes: truncated instead of 413

    def files(self) -> list[Path]:
        """The files the archive must carry (their names in it are tokenizer.json and index_to_name.json)."""
        found = []
        if self.tokenizer is not None:
            path = Path(self.tokenizer)
            path = path / "tokenizer.json" if path.is_dir() else path
            if not path.is_file():
                raise ServeError(f"no tokenizer at {path}: pass a directory holding a Hugging Face tokenizer.json")
            found.append(path)
        if self.labels is not None:
            if not Path(self.labels).is_file():
                raise ServeError(f"no labels file at {self.labels}: pass TorchServe's index_to_name.json")
            found.append(Path(self.labels))
        return found

    def yaml(self, shipped: list[Path]) -> str:
        names = {"tokenizer": self.tokenizer, "labels": self.labels}
        lines = [f"  {key}: {json.dumps(path.name)}\n" for key, path in zip(
            [k for k, v in names.items() if v is not None], shipped)]
        return "".join(lines) + (f"  max_body_bytes: {self.max_body_bytes}\n"
                                 f"  truncate_text: {str(self.truncate_text).lower()}\n")


# How the pool recovers requests (the `packrat:` section's keys); each is written only when given,
# so that the pool's own default applies otherwise.
RECOVERY_KEYS = (
    "request_timeout_s",  # a request waiting and running longer is answered 504 (pool default: 120 s)
    "max_queue",  # requests waiting beyond this are answered 503 at once (pool default: 1000)
    "batch_timeout_s",  # a batch running longer marks its instance hung (default: derived from the profile)
    "hang_factor",  # that derivation: hang_factor × the profiled latency of the batch ...
    "hang_floor_s",  # ... and at least this
)


def recovery_yaml(recovery: dict | None) -> str:
    """The `packrat:` lines for the recovery settings given (not None), in RECOVERY_KEYS order."""
    recovery = recovery or {}
    unknown = set(recovery) - set(RECOVERY_KEYS)
    if unknown:
        raise ValueError(f"unknown recovery setting(s) {sorted(unknown)}: expected some of {list(RECOVERY_KEYS)}")
    return "".join(f"  {key}: {json.dumps(recovery[key])}\n" for key in RECOVERY_KEYS
                   if recovery.get(key) is not None)


def profiles_yaml(names: str | list[str]) -> str:
    """`profile: NAME` for one profile (or none: the stock handler), `profiles: [NAME, ...]` for several."""
    names = [names] if isinstance(names, str) else list(names)
    if len(names) > 1:
        return f"  profiles: {json.dumps(names)}\n"
    return f"  profile: {json.dumps(names[0] if names else '')}\n"


def model_config_yaml(model: str, profile_name: str | list[str], batch_size: int, max_batch_delay_ms: int,
                      plan: str, handler: str, input_shape: tuple[int, ...] | None, reconfigure: bool = True,
                      plan_batch: int | None = None, estimator: dict | None = None, ios: bool = False,
                      requests: str = "", async_worker: bool = False, gather_ms: float | None = None,
                      recovery: dict | None = None, cores: int | None = None) -> str:
    """TorchServe's per-model config; packrat's own settings live under `packrat:`, the recovery
    settings (RECOVERY_KEYS) only those given. Several profile names (one per machine type) are
    written as `profiles:`, one as `profile:`; `cores`, the CPU budget asked for, only when given.

    The packrat handler gets one worker (the pool uses every core) in TorchServe's ordinary mode:
    TorchServe gathers batches of up to batch_size within max_batch_delay_ms and the pool splits
    each among its instances. With async_worker (for comparison only: TorchServe 0.12's
    asynchronous mode strands requests under load, see handlers/packrat_handler.py) batches go to
    the pool one request at a time, as they arrive, and the pool batches for its instances."""
    workers, torchserve_batch = "", batch_size
    if handler == "packrat":
        workers = "minWorkers: 1\nmaxWorkers: 1\n"
        if async_worker:
            # TorchServe 0.12's asynchronous batch aggregator fails on batches of more than one
            # request (ConcurrentModificationException, then a worker restart loop), so TorchServe
            # hands over single requests; the pool batches them (up to max_batch).
            workers += "asyncCommunication: true\n"
            torchserve_batch = 1
            max_batch_delay_ms = 1  # TorchServe reads 0 as "unset" and waits its default 100 ms
    shape = f"[{', '.join(map(str, input_shape))}]" if input_shape else "null"
    return (f"batchSize: {torchserve_batch}\nmaxBatchDelay: {max_batch_delay_ms}\nresponseTimeout: 300\n"
            f"startupTimeout: 600\n{workers}"
            f"packrat:\n  model: {json.dumps(model)}\n{profiles_yaml(profile_name)}"
            + (f"  cores: {cores}\n" if cores is not None else "") +
            f"  plan: {plan}\n  input_shape: {shape}\n  reconfigure: {str(reconfigure).lower()}\n"
            f"  plan_batch: {plan_batch or batch_size}\n  max_batch: {batch_size}\n  ios: {str(ios).lower()}\n"
            + requests + recovery_yaml(recovery)
            + (f"  gather_ms: {gather_ms}\n" if gather_ms is not None else "")
            + (f"  estimator: {json.dumps(estimator)}\n" if estimator else ""))


def build(model: str, profile: Path | list[Path] | None, out_dir: Path, *, name: str | None = None,
            batch_size: int = 8, max_batch_delay_ms: int = 50, plan: str = "auto", handler: str = "packrat",
            input_shape: tuple[int, ...] | None = None, reconfigure: bool = True,
            plan_batch: int | None = None, estimator: dict | None = None,
            ios_cache: Path = DEFAULT_IOS_CACHE, tokenizer: Path | None = None, labels: Path | None = None,
            max_body_bytes: int = RequestSettings.max_body_bytes, truncate_text: bool = False,
            async_worker: bool = False, gather_ms: float | None = None, request_timeout_s: float | None = None,
            max_queue: int | None = None, batch_timeout_s: float | None = None, hang_factor: float | None = None,
            hang_floor_s: float | None = None, cores: int | None = None) -> Path:
    """Build NAME.mar with torch-model-archiver: handler, profile(s), settings, the tokenizer and
    labels the requests are read and answered with (and the model file for a TorchScript or
    torch.export model, the directory of a Hugging Face one). Zoo models are rebuilt from code in
    the worker. A model served compiled (the profile's mode, or the stock handler's default) gets
    its compiled package built here, once per machine type, and shipped (see compiled_files). A profile taken with IOS-compiled instances is
    served by them: the archive carries the model's cached schedules from `ios_cache` (the pool
    searches any that are missing). The recovery settings (request_timeout_s ... hang_floor_s, see
    RECOVERY_KEYS) are written only when given: the pool's defaults apply to the others.

    `profile` may be several profiles, one per machine type (shipped as profile-0.csv, ...): each
    server plans with the one chosen for its CPU and budget (profile.choose), and what is built here
    (compiled packages, IOS schedules) follows the one chosen for this machine. `cores` caps the
    servers' CPU budget (packrat/budget.py) and is written only when given."""
    from packrat.machine.budget import cpu_budget
    from packrat.models.zoo import HF_PREFIX, resolve
    from packrat.profiling.profiles import chosen as profile_for_machine

    spec = resolve(model, input_shape)  # fail here on an unknown model, not in a worker
    name = name or Path(model.removeprefix(HF_PREFIX).rstrip("/")).stem.replace(":", "_").replace(".", "_")
    requests = RequestSettings(tokenizer, labels, max_body_bytes, truncate_text)
    recovery = {"request_timeout_s": request_timeout_s, "max_queue": max_queue, "batch_timeout_s": batch_timeout_s,
                "hang_factor": hang_factor, "hang_floor_s": hang_floor_s}
    shipped = requests.files()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as staging:
        staging = Path(staging)
        extra = [HANDLERS / "common.py", *shipped]
        model_ref = model
        if Path(model).is_file():
            model_ref = Path(model).name
            extra.append(Path(model))
        elif model.startswith(HF_PREFIX):  # the archiver copies a folder's contents: wrap the directory in one
            bundle = staging / "bundle"
            shutil.copytree(model[len(HF_PREFIX):], bundle / HF_ARCHIVE_DIR)
            model_ref = HF_PREFIX + HF_ARCHIVE_DIR
            extra.append(bundle)
        budget = cpu_budget(cores, "--cores")
        profile_names, chosen, mode = [], None, DEFAULT_MODE
        if handler == "packrat":
            paths = [profile] if isinstance(profile, (str, Path)) else list(profile or [])
            if not paths:
                raise ServeError("the packrat handler needs a profile: run `packrat profile` first or pass --profile")
            chosen = profile_for_machine(paths, budget.cores)[0]  # also rejects a bad profile, with its own message
            mode = chosen.metadata["mode"]
            profile_names = ["profile.csv"] if len(paths) == 1 else [f"profile-{i}.csv" for i in range(len(paths))]
            for path, shipped_name in zip(paths, profile_names):
                shutil.copy(path, staging / shipped_name)
                extra.append(staging / shipped_name)
        ios = mode == "ios"
        if ios:  # the archiver flattens folders: schedules sit beside the profile, named by model
            extra += cached_schedules(spec.name, Path(ios_cache))
        if mode == "compile":
            extra += compiled_files(spec, batch_size, planned_instances(chosen, batch_size, handler, budget.cores))
        config = staging / "model-config.yaml"
        config.write_text(model_config_yaml(model_ref, profile_names, batch_size, max_batch_delay_ms, plan,
                                            handler, input_shape, reconfigure, plan_batch, estimator, ios,
                                            requests.yaml(shipped), async_worker, gather_ms, recovery, cores))
        cmd = ["torch-model-archiver", "--model-name", name, "--version", "1.0",
               "--handler", str(HANDLERS / f"{handler}_handler.py"), "--config-file", str(config),
               "--extra-files", ",".join(map(str, extra)), "--export-path", str(out_dir), "--force"]
        _run_tool(cmd)
    return out_dir / f"{name}.mar"


def planned_instances(profile, batch_size: int, handler: str, cores: int) -> set[tuple[int, int]] | None:
    """The ⟨threads, batch⟩ of the instances the server will start first on a machine like this
    one, with `cores` cores budgeted: the plan of `profile` (a loaded Profile) for its batch size and
    the fat instance (the stock handler: the fat one alone); None when the profile cannot plan it
    (then every size up to the batch is shipped)."""
    from packrat.errors import NoPlanError
    from packrat.planning.planner import plan

    if handler != "packrat":
        return {(cores, batch_size)}
    try:
        chosen = plan(profile.items(), cores, batch_size)
    except (NoPlanError, ValueError):
        return None
    return {(i.threads, i.batch) for i in chosen.instances} | {(cores, batch_size)}


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
    """The model's IOS schedules in `cache`, one per threads and batch."""
    from ios_scheduler.cache import schedule_path

    return sorted(cache.glob(schedule_path(cache, model, 0, 0).name.replace("-t0-b0", "-t*-b*")))


def _run_tool(cmd: list[str]) -> None:
    exe = Path(sys.executable).parent / cmd[0]
    cmd = [str(exe) if exe.exists() else cmd[0], *cmd[1:]]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ServeError(f"{Path(cmd[0]).name} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
