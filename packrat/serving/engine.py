"""One model served on one machine: its CPU budget, the profile taken on a machine like it, the
plan, the instance pool and the controller that re-plans as the load changes.

Front ends only adapt their requests to it: the TorchServe handler (handlers/packrat_handler.py)
and the Ray Serve deployment (packrat/frontends/ray_serve.py) both build an Engine from the same
Settings (packrat/settings.py: an archive's `packrat:` section), with files relative to `model_dir`.

Cores fenced off. A thread instance stuck in a run it cannot leave is abandoned by the pool, its
cores fenced off until it returns (pool/supervisor.py). Every plan the engine makes leaves the
fenced cores out (plan_for), and a change of them re-plans at once on the cores left (the
controller's replan): nothing is pinned onto a stuck thread's cores. On a shared node the engine
reports them with its load (_describe), and the node's plan gives them to no model until they come
back (serving/node/owner.py). Where no cores are left (a fat
instance stuck), the pool answers every request 503 with that reason, front ends report not ready,
and the engine calls the `restart(reason)` its front end gave it: only the end of the process ends
a stuck thread (the TorchServe worker exits and TorchServe starts another; the KServe server
re-executes itself; Ray Serve replaces a replica whose check_health fails).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Callable

from packrat.codec.config import CodecConfig
from packrat.errors import MoveFailed, PoolError
from packrat.machine.budget import CpuBudget, cpu_budget
from packrat.machine.topology import Topology
from packrat.models import modes
from packrat.models.spec import ModelSpec
from packrat.models.zoo import HF_PREFIX, resolve
from packrat.planning.node import topology_of
from packrat.planning.planner import serving_plan
from packrat.profiling.profiles import Profile, chosen, gains
from packrat.profiling.search import filled_items
from packrat.serving.controller import Controller
from packrat.serving.correcting import PlanCorrector, corrections_file
from packrat.serving.estimator import BatchSizeEstimator, EstimatorSettings
from packrat.serving.node import NodeMember, node_dir
from packrat.serving.pool.api import Answer, ModelConfig, configs_for
from packrat.serving.pool.instance_pool import InstancePool
from packrat.serving.pool.supervisor import Watchdog
from packrat.serving.settling import Pools, SettledPlans, batches_to_settle, settle_batches
from packrat.serving.tuner import PlanTuner
from packrat.settings import Settings

log = logging.getLogger(__name__)


class Engine:
    """The pool serving the model of `settings`, planned for this machine's CPU budget and batch
    `max_batch`; `asynchronous` front ends hand requests over one by one (the pool gathers them),
    the others whole batches. submit() returns a future of the request's Answer. `restart(reason)`:
    how the front end restarts the serving process when no cores are left (None: it serves 503s
    until the stuck thread returns)."""

    def __init__(self, settings: Settings, model_dir: str | Path, model_name: str, *, max_batch: int,
                 asynchronous: bool, restart: Callable[[str], None] | None = None):
        self._restart, self._restart_asked = restart, threading.Event()
        self.budget: CpuBudget = cpu_budget(settings.cores, "the archive's `cores` setting")
        log.info("packrat CPU budget: %s", self.budget.describe())
        profile, profile_path, choice = chosen_profile(settings, model_dir, self.budget)
        self.profile_choice = f"{choice}; {profile.describe()}"
        (log.info if profile.loaded else log.warning)("packrat profile: %s", self.profile_choice)
        profile = runnable_here(profile)
        if settings.instance_kind == "process":
            profile = processes_only(profile)
        serving_torch_threads(profile)
        # The profile as served here: its figures corrected by what the instances serve (served.py);
        # kept for a restart only by a model that has its cores to itself
        self.corrector = PlanCorrector(profile, corrections_file(model_name, profile_path),
                                       keep=not settings.share_node)
        profile = self.corrector.profile
        model, spec = model_config(settings, str(model_dir), profile.metadata.get("mode"))
        self.spec, self.codec = spec, codec_config(settings, spec, model_name, str(model_dir))
        self.max_batch = max_batch
        self._plan_mode = settings.plan
        self._turn_ms = settings.turn_ms
        self._fallbacks = profile.fallbacks()  # each point's runtimes, for an instance whose runtime fails here
        start_batch = min(settings.plan_batch or max_batch, max_batch)
        self.pool = self.controller = None
        self.settled = SettledPlans()  # near-ties timed before serving: the plan served at their batch
        self.topology, self.node, turns = self.budget.topology, None, False
        self._node_items_for: tuple = (None, None, [])  # (profile, batch, items): _node_items()
        if settings.share_node:
            self.node, turns = self._join_node(model_name, start_batch, settings.slo_ms)
            self.node.applying = False  # heartbeats while the pool starts; its moves once it serves
            self.node.start()
        try:
            self._start_serving(settings, model, profile, start_batch, max_batch, asynchronous, turns)
        except BaseException:
            if self.node is not None:
                self.node.leave()  # a model that could not start holds no share of the cores
            raise

    def _start_serving(self, settings: Settings, model: ModelConfig, profile: Profile, start_batch: int,
                       max_batch: int, asynchronous: bool, turns: bool) -> None:
        """Near-ties settled, then the plan, the pool and the controller; then the node may move this model."""
        recovery = pool_settings(settings)
        if not asynchronous:  # the whole batch is here: nothing more comes until it is answered
            recovery.setdefault("gather_ms", 0.0)

        def new_pool(configs) -> InstancePool:
            return InstancePool(model, configs, codec=self.codec, on_fence=self._fences_changed, **recovery)

        pools = Pools(new_pool, max_batch)
        try:
            if settings.settle_s > 0 and not turns:  # cores time-shared with other models time nothing apart
                self.settle(pools, batches_to_settle(start_batch, max_batch, settings.reconfigure), settings.settle_s)
            plan = self.plan_for(start_batch)
            log.info("packrat plan for T=%d, B=%d: %s", plan.threads, plan.batch, plan.describe())
            # the winner's pool, already started, serves; else a new one
            self.pool = pools.take(plan, max_batch, self._fallbacks) or new_pool(configs_for(plan, max_batch,
                                                                                             self._fallbacks))
        finally:
            pools.close()
        if turns:
            self.pool.take_turns(self.node.lock_dir, self._turn_ms)
        mismatch = mode_mismatch(profile.metadata.get("mode"), self.pool.mode)
        if mismatch:
            log.warning(mismatch)
        estimator = BatchSizeEstimator(start_batch, max_batch, settings.estimator or EstimatorSettings())
        self.controller = Controller(self.pool, plan, self.plan_for, lambda p: configs_for(p, max_batch, self._fallbacks),
                                     estimator)
        self.reconfigure = settings.reconfigure  # follow the load, unless told not to
        # corrections, switches on them and trials of near-ties: the plan tuned to what is served
        self.tuner = PlanTuner(self.controller, self.pool, self.corrector, self.plan_for)
        if self.pool.fenced_cores():  # a thread stuck before the controller was there to re-plan
            self._fences_changed(self.pool.fenced_cores())
        if self.node is not None:
            self.node.applying = True

    # ---- the node: cores planned with the other models on this machine --------------------------

    def _join_node(self, model_name: str, batch: int, slo_ms: float | None) -> tuple[NodeMember, bool]:
        """Join the models served on this budget's cores; take the share the node gives (all the
        budget's cores, in turns, if no plan comes in time)."""
        self._batch_now = batch
        topology = self.budget.topology
        node = NodeMember(node_dir(topology.cores), model_name, topology, self._move, self._describe, slo_ms=slo_ms)
        share = node.join()
        if share is None:
            log.warning("no node plan came in time: taking turns on every core of the budget")
            return node, True
        self.topology = topology_of(topology, share[0])
        log.info("packrat node share: cores %s%s", list(share[0]), " (in turns with other models)" if share[1] else "")
        return node, share[1]

    def _describe(self) -> dict:
        """What this model tells the node: its profile, the batch it plans for, the requests in hand,
        and the cores its stuck thread instances hold (fenced), which the node gives no model."""
        batch = self.controller.estimator.current if self.controller is not None else self._batch_now
        return {"items": self._node_items(batch), "batch": batch,
                "in_hand": self.pool.outstanding if self.pool is not None else 0,
                "fenced": sorted(self.pool.fenced_cores()) if self.pool is not None else []}

    def _node_items(self, batch: int) -> list[list]:
        """The profile's points as the node plans with them: measured, and the fit's figures where
        the search measured nothing (a share of fewer cores needs them); kept until the profile or
        the batch changes, since every heartbeat reports them."""
        profile = self.corrector.profile
        cached, cached_batch, _ = self._node_items_for
        if cached is not profile or cached_batch != batch:  # the same object: not a field-by-field compare
            threads = list(range(1, max(profile.threads) + 1))
            items = filled_items(profile.items(), profile.points(), threads, sorted({*profile.batches, batch}))
            self._node_items_for = (profile, batch, [list(item) for item in items])
        return self._node_items_for[2]

    def _move(self, cores: tuple[int, ...], turns: bool) -> None:
        """Serve on `cores` from now on, in turns with other models or not: turns are taken before
        the cores change and given up after, so no core ever runs two models' threads at once. The
        model's cores change only once its pool serves there: when the switch fails this raises, and
        the pool serves where it was (taking turns if asked to)."""
        if turns:  # a turn as long as the longest request of a model on these cores, at least
            self.pool.take_turns(self.node.lock_dir, max(self._turn_ms, self.node.longest_request_ms or 0.0))
        if tuple(cores) != tuple(self.topology.cores):
            target = topology_of(self.budget.topology, cores)
            record = self.controller.replan(f"the node moved this model to cores {list(cores)}",
                                            plan_for=lambda batch: self.plan_for(batch, target),
                                            committed=lambda: setattr(self, "topology", target))
            if record.error:
                raise MoveFailed(record.error)
        if not turns:
            self.pool.take_turns(None)
            return
        deadline = time.monotonic() + 60
        while self.pool.runs_unlocked() and time.monotonic() < deadline:  # a batch from before the turns
            time.sleep(0.005)

    def plan_for(self, batch: int, topology: Topology | None = None, profile: Profile | None = None):
        """The plan for `batch` on this model's cores, or `topology`'s (the fat one where the archive
        says so), on the profile as corrected by what was served, or on `profile`; never on cores
        fenced off (held by a stuck thread instance)."""
        fenced = self.pool.fenced_cores() if self.pool is not None else frozenset()
        topology = cores_left(topology or self.topology, fenced)
        if not topology.cores:
            raise PoolError(f"no cores left to plan on: cores {sorted(fenced)} are fenced off")
        corrected = profile is None  # settled plans stand on the profile as served, not on one given
        profile = profile or self.corrector.profile
        plan, fallback = serving_plan(profile.items(), topology.num_cores, batch, topology, self._plan_mode,
                                      profile.runtimes)
        if fallback and fallback != getattr(self, "_fallback_said", None):  # once, not at every look
            log.warning(fallback)
        self._fallback_said = fallback
        if not corrected:
            return plan
        return self.settled.plan(plan, topology.cores, profile.points(),
                                 {key: c.at for key, c in self.corrector.corrections.items()})

    def settle(self, pools: Pools, batches: list[int], time_s: float) -> None:
        """Settle the near-ties at `batches` before serving (settling.settle_batches), in `pools`,
        within `time_s` seconds; each settlement logged and remembered: plan_for serves its winner."""
        for settlement in settle_batches(self.corrector.profile, self.spec, pools, self.topology, batches, time_s,
                                         self._plan_mode == "fat", lambda line: log.info("packrat %s", line)):
            self.settled.add(settlement)

    def _fences_changed(self, fenced: frozenset) -> None:
        """The cores abandoned thread instances hold changed (from the pool's thread): re-plan in
        the background on the cores left (all of them again once the threads returned); with none
        left, restart."""
        if not cores_left(self.topology, fenced).cores:
            self._no_cores_left(f"no cores left to serve on: cores {sorted(fenced)} are held by stuck thread "
                                f"instance(s)")
            return
        if self.controller is None:  # still starting: its first plan is made after this
            return
        reason = (f"cores {sorted(fenced)} fenced off: a thread instance is stuck on them" if fenced
                  else "the fenced cores came back: their stuck thread returned")
        threading.Thread(target=self.controller.replan, args=(reason,), daemon=True, name="packrat-fence").start()

    def _no_cores_left(self, reason: str) -> None:
        """Requests are answered 503 (the pool's `unavailable`) and front ends report not ready; the
        front end's restart, once, is the only way to end the stuck threads."""
        if self._restart_asked.is_set():
            return
        self._restart_asked.set()
        if self._restart is None:
            log.error("packrat: %s; nothing restarts this engine: requests are refused until a thread returns", reason)
            return
        log.error("packrat: %s; restarting", reason)
        threading.Thread(target=self._restart, args=(reason,), daemon=True, name="packrat-restart").start()

    def arrive(self, count: int = 1) -> None:
        """`count` requests arrived together: one observation of the load for the controller, and
        now and then a look at what the instances served against what the plan predicted."""
        if self.node is not None:  # a batch of the largest size: the front end had more waiting (load.py)
            self.node.meter.arrive(count, full=self.max_batch > 1 and count >= self.max_batch)
        try:
            if self.corrector.due():
                self.check_served()
            if self.reconfigure:
                self.controller.arrive(count)
        except Exception as exc:  # a failed switch decision must never cost a request
            log.warning("packrat load estimate not updated: %s", exc)

    def check_served(self) -> None:
        """Correct the profile where the instances served otherwise than it predicted; switch to a
        better plan on the corrected figures, or try a near-tie (tuner.py)."""
        self.tuner.look(self.reconfigure)

    def submit(self, request) -> Future:
        """A future of the request's Answer, from the live pool. Never raises: our own failure
        (say, the pool is closing) answers this request alone."""
        try:
            return (self.controller.submit if self.reconfigure else self.pool.submit)(request)
        except Exception as exc:
            return _failed(exc)

    def submit_all(self, requests: list) -> list[Future]:
        """Futures of the Answers of requests that arrived together, queued as one batch. Never
        raises: our own failure answers them alone, as submit()'s."""
        try:
            return (self.controller.submit_all if self.reconfigure else self.pool.submit_all)(requests)
        except Exception as exc:
            return [_failed(exc) for _ in requests]

    def refusal(self, received_at: float | None = None, timeout_s: float | None = None) -> Answer | None:
        """How the live pool would refuse a request arriving now (503 with when to retry, counted),
        or None: a front end asks before it reads or decodes the body, so a refusal costs no core.
        `received_at`: when the front end received it (time.monotonic()); `timeout_s`: the client's
        own deadline after that, where known this early."""
        try:
            return self.pool.refusal(received_at, timeout_s)
        except Exception as exc:  # never a reason to lose the request: submit() decides then
            log.warning("packrat admission not decided early: %s", exc)
            return None

    def status(self) -> dict:
        """The controller's status (plan, mode, health, reconfigurations) with where the CPU
        budget and the profile came from."""
        plan = self.controller.plan
        status = {**self.controller.status(), "cpu_budget": self.budget.to_json(), "profile": self.profile_choice,
                  "ios": gains(self.corrector.profile, plan.instances),
                  "served": {**self.corrector.status(plan, self.pool.served_figures()),
                             **self.tuner.status()},
                  "settled": self.settled.status()}
        if self.node is not None:
            status["node"] = self.node.status()
        return status

    def close(self) -> None:
        if self.node is not None:
            self.node.leave()  # the node re-plans without it: others may grow onto its cores
        self.pool.close()


def cores_left(topology: Topology, fenced) -> Topology:
    """`topology` without the cores `fenced`."""
    return topology_of(topology, [core for core in topology.cores if core not in fenced])


def serving_torch_threads(profile: Profile) -> None:
    """torch's intra-op threads in the serving process, set once, here, before any instance starts:
    one, where the profile holds thread-kind points. That count is the process's (each thread reads
    it on its first parallel region), and torch runs no model here (process instances run theirs in
    their own processes): its work here is the thread instances' decoding and encoding on their
    cores, where a team of torch's threads would spin beside the runtime's (models.runtimes.torch_threads)."""
    from packrat.codec.batch import set_intra_op_threads
    from packrat.models.runtimes import instance_kind

    if any(instance_kind(runtime) == "thread" for runtime in profile.measured_runtimes):
        set_intra_op_threads(1)


def chosen_profile(settings: Settings, model_dir: str | Path, budget: CpuBudget) -> tuple[Profile, Path, str]:
    """The profile to plan with on this machine, its file, and a line saying which and why."""
    if not settings.profiles:
        raise ValueError("the packrat settings name no profile: build the archive with `packrat archive --profile`")
    paths = [Path(model_dir) / name for name in settings.profiles]
    profile, index, why = chosen(paths, budget.cores)
    return profile, paths[index], f"{settings.profiles[index]}: {why}"


def processes_only(profile: Profile) -> Profile:
    """The profile without its thread-kind points (--instance-kind process): every instance is then a
    process of its own, as before thread instances existed."""
    from packrat.models.runtimes import instance_kind

    kept = [r for r in profile.measured_runtimes if instance_kind(r) == "process"]
    if not kept:
        raise ValueError("--instance-kind process: the profile holds thread-kind points only "
                         f"({', '.join(profile.measured_runtimes)}); profile the model with a runtime hosted as a "
                         "process too")
    return profile.only(kept)


def runnable_here(profile: Profile) -> Profile:
    """The profile's points of the runtimes installed here: a plan must not name one this machine
    lacks (a profile measured with OpenVINO, served where only torch is installed)."""
    from packrat.models.runtimes import INSTALL_HINT, installed

    missing = [r for r in profile.measured_runtimes if not installed(r)]
    if not missing:
        return profile
    kept = [r for r in profile.measured_runtimes if r not in missing]
    if not kept:
        raise ValueError(f"the profile's runtimes ({', '.join(missing)}) are not installed here: {INSTALL_HINT}")
    log.warning("packrat: the profile's %s points are left out: not installed here (%s)", ", ".join(missing),
                INSTALL_HINT)
    return profile.only(kept)


def model_config(settings: Settings, model_dir: str, profiled_mode: str | None = None) -> tuple[ModelConfig, ModelSpec]:
    """What the pool loads, and the model's description (input shape, dtype, task). Instances run
    the model as its profile measured it (`profiled_mode`): an eager profile gets eager instances."""
    model = settings.model
    if (Path(model_dir) / model).is_file():  # a TorchScript or torch.export file shipped inside the archive
        model = str(Path(model_dir) / model)
    elif model.startswith(HF_PREFIX) and (Path(model_dir) / model[len(HF_PREFIX):]).is_dir():
        model = HF_PREFIX + str(Path(model_dir) / model[len(HF_PREFIX):])  # a save_pretrained directory shipped
    spec = resolve(model, settings.input_shape)
    # Instances of the ios runtime: schedules shipped in the archive; missing ones are searched and kept there
    ios_cache = model_dir if settings.ios else None
    # Compiled packages shipped in the archive sit in model_dir; missing ones come from (or are
    # built into) this machine's cache.
    return ModelConfig(model, tuple(spec.input_shape), graph_mode=served_mode(settings, profiled_mode),
                       ios_cache=ios_cache, compile_cache=model_dir), spec


def served_mode(settings: Settings, profiled_mode: str | None) -> str:
    """The graph mode the instances run: the settings' `graph_mode` if they set one, else the mode
    the profile was measured in (its plan rests on those latencies), else the default."""
    if settings.graph_mode is not None:
        return modes.mode_name(settings.graph_mode)
    return modes.served(profiled_mode)


def mode_mismatch(profiled_mode: str | None, running_mode: str) -> str | None:
    """Why the plan may not hold, when the instances run the model otherwise than its profile
    measured it (say, tracing failed in the worker and they fell back to eager); None if they match.
    A pool whose instances all run another runtime (OpenVINO, ONNX Runtime) runs no graph mode:
    nothing to compare."""
    from packrat.models.runtimes import DEFAULT_RUNTIME, runtime_of

    if not profiled_mode or profiled_mode == running_mode or runtime_of(running_mode) != DEFAULT_RUNTIME:
        return None
    return (f"the profile was measured in {profiled_mode} mode but the instances run in {running_mode} mode: "
            f"the plan rests on latencies they may not have; profile the model as it is served")


def codec_config(settings: Settings, spec: ModelSpec, model_name: str, model_dir: str) -> CodecConfig:
    """How requests are decoded and answered: the settings' tokenizer, labels and limits."""
    def shipped(name: str | None) -> str | None:
        return str(Path(model_dir) / name) if name else None

    return CodecConfig.for_model(spec, model_name=model_name, tokenizer=shipped(settings.tokenizer),
                                 labels=shipped(settings.labels), **settings.codec_limits())


def pool_settings(settings: Settings) -> dict:
    """InstancePool keyword arguments from the recovery settings; those not given keep the pool's
    defaults (request timeout 120 s, queue 1000, hung after 10 × the expected latency, ≥ 5 s)."""
    given = settings.recovery()
    pool = {key: given[key] for key in ("request_timeout_s", "max_queue", "admission") if key in given}
    if settings.gather_ms is not None:
        pool["gather_ms"] = settings.gather_ms
    watchdog = {key: given[name] for key, name in (("factor", "hang_factor"), ("floor_s", "hang_floor_s"),
                                                   ("batch_timeout_s", "batch_timeout_s")) if name in given}
    if watchdog:
        pool["watchdog"] = Watchdog(**watchdog)
    return pool


def _failed(exc: Exception) -> Future:
    """A future answered with our own failure to queue a request: 503 where the pool refused it
    (closed), else 500."""
    future = Future()
    future.set_result(Answer.error(503 if isinstance(exc, PoolError) else 500, f"{type(exc).__name__}: {exc}"))
    return future
