"""What several commands print: plans, and the CPU budget and profile a server chose."""

from __future__ import annotations

from packrat.machine.budget import describe as describe_budget
from packrat.planning.planner import DEFAULT_RUNTIME, Plan


def cores_text(cores: tuple[int, ...]) -> str:
    if cores and list(cores) == list(range(cores[0], cores[-1] + 1)) and len(cores) > 1:
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))


def runtime_text(runtime: str | None) -> str:
    """', openvino' for an instance of another runtime than torch's; nothing for the default."""
    return "" if runtime in (None, DEFAULT_RUNTIME) else f", {runtime}"


def kinds_text(kinds: list[dict]) -> str:
    """The line naming each instance's kind (thread or process), its cores and runtime."""
    return "instance kinds: " + ", ".join(f"#{k['index']} {k['kind']} on cores {cores_text(tuple(k['cores']))}"
                                          f"{runtime_text(k['runtime'])}" for k in kinds)


def gain_lines(gains: list[dict]) -> list[str]:
    """A line for each planned instance shape that runs an IOS schedule, with what it gained over the
    fastest other runtime the profile measured there (profiles.gains)."""
    lines = []
    for g in gains:
        shape = f"⟨{g['threads']} threads, batch {g['batch']}⟩ runs an IOS schedule: {g['ms']:.1f} ms"
        if g.get("against"):
            shape += (f" against {g['against_ms']:.1f} for {g['against']}, the fastest other runtime profiled "
                      f"there ({g['against_ms'] / g['ms']:.2f}×)")
        lines.append(shape)
    return lines


def fat_text(plan: Plan) -> str:
    if plan.fat_latency_ms is None:
        return f"fat ⟨1 × {plan.threads} threads, batch {plan.batch}⟩ not profiled"
    return (f"fat ⟨1 × {plan.threads} threads, batch {plan.batch}⟩ {plan.fat_latency_ms:.1f} ms, "
            f"speedup {plan.speedup:.2f}×")


def print_plan(plan: Plan, latency: str) -> None:
    print(f"Plan for T={plan.threads} threads, B={plan.batch}, {latency} latencies: {plan.describe()}")
    print(f"  {'instance':>8}  {'threads':>7}  {'batch':>5}  {'latency_ms':>10}  {'runtime':>11}  cores")
    for n, inst in enumerate(plan.instances, start=1):
        print(f"  {n:>8}  {inst.threads:>7}  {inst.batch:>5}  {inst.latency_ms:>10.1f}  {inst.runtime:>11}  "
              f"{cores_text(inst.cores)}")
    print(f"expected latency {plan.expected_latency_ms:.1f} ms; {fat_text(plan)}")


def print_plan_table(plans: list[Plan], skipped: list[str]) -> None:
    print(f"{'B':>5}  {'expected_ms':>11}  {'fat_ms':>9}  {'speedup':>7}  plan")
    for p in plans:
        fat = f"{p.fat_latency_ms:.1f}" if p.fat_latency_ms else "-"
        speed = f"{p.speedup:.2f}×" if p.speedup else "-"
        print(f"{p.batch:>5}  {p.expected_latency_ms:>11.1f}  {fat:>9}  {speed:>7}  {p.describe()}")
    for line in skipped:
        print(line)


def print_budget_and_profile(status: dict) -> None:
    """The cores the handler plans for and why, the profile it chose (see packrat/serving/engine.py) and
    what the plan's IOS instances gain by it."""
    budget = status.get("cpu_budget")
    if budget:
        print(f"CPU budget: {describe_budget(budget)}")
    if status.get("profile"):
        print(f"profile: {status['profile']}")
    for line in gain_lines(status.get("ios") or []):  # the plan's IOS instances, and what they gained
        print(line)


def admission_text(health: dict) -> str:
    """Admission by prediction: what was taken in and refused, and what a request now would wait."""
    wait = health.get("predicted_wait_ms")
    now = f"a request now would be answered in {wait:.0f} ms" if wait is not None else "nothing served to predict from yet"
    causes = ", ".join(f"{n} {cause.replace('_', ' ')}" for cause, n in health.get("refusals", {}).items() if n)
    return (f"admission: {health.get('admitted', 0)} admitted, {health.get('refused_late', 0)} refused as too late "
            f"for their deadline (of the {health.get('refused', 0)} refused{'; by cause: ' + causes if causes else ''}"
            f"); {now} (batches served at {health.get('served_ratio', 1.0):.2f}× the plan's latency)")


def hop_text(health: dict) -> str:
    """Where the pool's recent sub-batches spent their time, stage by stage (the stages are
    packrat.serving.pool.stages's, in their order), in one line."""
    stages = health["stage_ms"]
    parts = ", ".join(f"{name.replace('_', ' ')} {ms:.2f}" for name, ms in stages.items() if name != "total")
    return (f"pool hop, ms per sub-batch (mean of the last ones, {health.get('requests_per_sub_batch', 0):.1f} "
            f"requests each): {parts}; total {stages['total']:.2f}")


def where_it_serves(share: dict) -> str:
    """What a model's heartbeat says beside its planned share: moving, a failed move, or other cores."""
    notes = []
    serves_on = share.get("serves_on")
    if serves_on and list(serves_on[0]) != list(share["cores"]):
        notes.append(f"serves on cores {cores_text(tuple(serves_on[0]))}")
    if share.get("moving"):
        notes.append("moving")
    if share.get("failed"):
        notes.append(f"its last move failed: {share['failed']}")
    return f" ({'; '.join(notes)})" if notes else ""


def front_end_text(front_end: dict) -> str:
    """A front end's process, cores and share of a core (its CPU time per second, and its event
    loop's), the requests it answered and how many a core of its CPU time answered, over the last seconds."""
    place = f"front end {front_end['index']} of {front_end['count']}" if front_end.get("count", 1) > 1 else "front end"
    where = f"{place} (pid {front_end.get('pid')}" + (f", cores {cores_text(tuple(front_end['cores']))})"
                                                      if front_end.get("cores") else ")")
    if front_end.get("unreachable"):
        return f"{where}: did not answer"
    if front_end.get("cpu_share") is None:
        return f"{where}: no CPU time measured yet"
    per_core = front_end.get("rps_per_core")
    return (f"{where}: {front_end['cpu_share']:.2f} of a core (its event loop {front_end['loop_share']:.2f}), "
            f"{front_end['answered_rps']:.1f} req/s answered" + (f", {per_core:,.0f} per core of its CPU time"
                                                                 if per_core else "")
            + f" (last {front_end['seconds']:.0f} s)")
