"""`packrat status`: each served model's plan, health and reconfigurations, and the node's plan of cores."""

from __future__ import annotations

import argparse
import json
import time

from packrat.cli.args import run_dir_arg
from packrat.cli.output import (admission_text, cores_text, front_end_text, hop_text, kinds_text,
                                print_budget_and_profile, where_it_serves,
                                runtime_text)
from packrat.cli.types import positive
from packrat.deploy import torchserve
from packrat.errors import ServeError

MODEL_JSON = ('{"plan": <as packrat plan --json>, "mode": "compile"|"script"|"eager"|"ios", "ios": [{"threads", '
              '"batch", "ms", "against", "against_ms"}] (IOS instances), "health": {"instances", "ready", "respawning", '
              '"respawn_failures", "unavailable", "queued", "answered", "refused", "admitted", "refused_late", '
              '"predicted_wait_ms", "served_ratio", "refusals": {"late", "queue_full", "expired_before", "unavailable"}, '
              '"stage_ms": '
              '{"queue", "copy", "send", "wake", "locks", "decode", "model", "encode", "reply", "hand_out", "total"}, '
              '"sub_batches", "requests_per_sub_batch", "fallbacks", "kinds", "abandoned", "fenced", ...}, '
              '"reconfigurations": [{"from_batch", "to_batch", "reason", "seconds", "failed_requests", ...}], "served": '
              '{"instances": [{"threads", "batch", "runtime", "predicted_ms", "planned_ms", "served_ms", "samples"}], '
              '"corrections": [{"threads", "batch", "runtime", "profile_ms", "served_ms", "samples", "at"}], '
              '"inferred": [{"threads", "batch", "runtime", "profile_ms", "inferred_ms", "rule", "source"}], '
              '"held_back": {"plan", "current_ms", "proposed_ms", "cooldown_left_s"} or null, "trials": {"active": '
              '{"previous", "plan", "previous_ms", "expected_ms", "untried", "started_at", "served_ms", "batches"} or '
              'null, "history": [{..., "outcome", "seconds"}]}}, '
              '"settled": [{"batch", "cores", "profile_plan", "plan_text", "why", "changed", "candidates": [{"label", "why", '
              '"expected_ms", "median_ms", "ratio", "faster_in", "of"}], "rounds", "seconds", "decided", "left_out", "line"}], '
              '"cpu_budget": {"cores", "source", "detail"}, "profile": "NAME: why it was chosen", "node": {...}, '
              '"front_end": {"index", "count", "pid", "cores", "url", "cpu_share", "loop_share", "answered_rps", '
              '"rps_per_core", "seconds"}, "front_ends": [<this, as each front end serves it>] (several front ends)}')


def add_status_parser(sub) -> None:
    p = sub.add_parser("status", help="the served plans, the node's plan of cores and the last reconfigurations",
                       description="Ask the running packrat handlers (through TorchServe's management API, or the "
                                   "KServe server's /status) for each model's plan, what its IOS instances gain, how "
                                   "its instances run the model (compile, script, eager or ios), its health, where "
                                   "the pool's recent batches spent their time (queue, copy, send, wake, locks, "
                                   "decode, model, encode, reply, hand-out) and recent reconfigurations; with "
                                   "several models, also the node: the cores each model has, its observed load, "
                                   "what the plan of the cores optimises, and each move with its reason and duration.")
    run_dir_arg(p)
    p.add_argument("--model", default=None, metavar="NAME",
                   help="only this model (default: every model the server serves)")
    p.add_argument("--last", type=positive(int), default=10, help="reconfigurations and moves to list (default: 10)")
    p.add_argument("--json", action="store_true",
                   help=f"print one model's status (with one model, or --model) as {MODEL_JSON}; with several: "
                        '{"models": {NAME: <that>}, "node": {"objective", "worst_score", "missed_slo", "generation", '
                        '"models": {NAME: {"cores", "takes_turns_with", "plan", "expected_latency_ms", '
                        '"alone_latency_ms", "slowdown", "rate_rps", "batch", "slo_ms"}}, "moves": [{"reason", '
                        '"plan", "started_at", "seconds"}]}}')
    p.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    statuses = served_statuses(args.run_dir.resolve(), args.model)
    names = list(statuses)
    if len(names) == 1:
        if args.json:
            print(json.dumps(statuses[names[0]], indent=2))
        else:
            print_served(names[0], statuses[names[0]], args.last)
        return 0
    node = node_view(statuses)
    if args.json:
        print(json.dumps({"models": statuses, "node": node}, indent=2))
        return 0
    for name, status in statuses.items():
        print_served(name, status, args.last)
        print()
    if node is not None:
        print_node(node, args.last)
    return 0


def served_statuses(run_dir, model: str | None) -> dict[str, dict]:
    """Each served model's status (or `model`'s alone): from the KServe server running in the run
    dir if there is one (`packrat serve --engine kserve`), else from TorchServe's handlers."""
    kserve = running_kserve(run_dir)
    if kserve is not None:
        from packrat.deploy.kserve import status

        every = status(kserve)
        served = list(every)
    else:
        server = torchserve.Server.load(run_dir)
        served = list(server.models)
    if model is not None and model not in served:
        raise ServeError(f"{model} is not served here (models: {', '.join(served)})")
    names = [model] if model else served
    if kserve is not None:
        return {name: every[name] for name in names}
    return {name: torchserve.handler_status(server, name) for name in names}


def running_kserve(run_dir):
    """The KServe server `packrat serve --engine kserve` left running in the run dir, or None."""
    from packrat.deploy import kserve

    try:
        server = kserve.KServeServer.load(run_dir)
    except ServeError:
        return None
    return server if kserve.running(server) else None


def print_served(name: str, status: dict, last: int) -> None:
    """The model as each front end serves it (one, or each of several), after its front end's line."""
    for each in status.get("front_ends") or [status]:
        front_end = each.get("front_end")
        print(front_end_text(front_end)) if front_end else None
        print_model(name, each, last) if not (front_end or {}).get("unreachable") else None


def print_model(name: str, status: dict, last: int) -> None:
    plan = status["plan"]
    shapes = ", ".join(f"⟨{i['threads']} threads, batch {i['batch']}, cores {cores_text(tuple(i['cores']))}"
                       f"{runtime_text(i.get('runtime'))}⟩" for i in plan["instances"])
    print(f"model {name} ({status.get('mode', '?')}): serving B={plan['batch']} on T={plan['threads']} "
          f"threads: {shapes}")
    print_budget_and_profile(status)
    health = status.get("health")
    if health:
        state = f"UNAVAILABLE: {health['unavailable']}" if health.get("unavailable") else "serving"  # null dropped
        print(f"instances: {health['ready']}/{health['instances']} ready, {health['respawning']} respawning, "
              f"{health['respawn_failures']} failed respawn attempt(s); {health['queued']} queued, "
              f"{health['answered']} answered, {health['refused']} refused (503); {state}")
        fenced = health.get("fenced") or []
        stuck = (f", {health.get('abandoned')} stuck thread instance(s) abandoned"
                 f"{f' (cores {fenced} fenced off)' if fenced else ''}") * bool(health.get("abandoned"))
        print(f"recovery: {health.get('watchdog_kills', 0)} hung instance(s) killed by the watchdog, {health.get('requeued', 0)}"
              f" request(s) re-run after losing their instance, {health.get('expired', 0)} past their deadline (504){stuck}")
        print(admission_text(health))
        print(kinds_text(health["kinds"])) if health.get("kinds") else None
        [print(f"runtime fallback: {line}") for line in health.get("fallbacks", [])]
        if health.get("stage_ms"):
            print(hop_text(health))
    settled = [s["line"] for s in status.get("settled", [])]  # near-ties timed before serving (serving/settling.py)
    for line in settled + served_lines(status.get("served")):
        print(line)
    records = status["reconfigurations"]
    print(f"{len(records)} reconfiguration(s){' (newest last)' if records else ''}")
    for r in records[-last:]:
        outcome = f"FAILED: {r['error']}" if r.get("error") else r.get("plan", "")
        print(f"  B {r['from_batch']:>3} → {r['to_batch']:<3} {r['seconds']:6.2f} s  failed requests "
              f"{r['failed_requests']}  {r['reason']}  {outcome}")


TRIALS_SHOWN = 5  # the last trials of near-ties status prints


def served_lines(served: dict | None) -> list[str]:
    """Each instance's model time as the profile predicted it, as planned (corrected) and as served;
    then the corrections the served figures made."""
    if not served:
        return []
    lines = []
    for i in served["instances"]:  # TorchServe drops the nulls of a handler's JSON: hence get()
        served_ms, predicted, planned = i.get("served_ms"), i.get("predicted_ms"), i.get("planned_ms")
        got = f"{served_ms:.2f} ms ({i.get('samples', 0)} batches)" if served_ms is not None else "not yet"
        planned = "" if planned == predicted else f", planned with {num(planned)} ms"
        lines.append(f"served ⟨{i['threads']} threads, batch {i['batch']}{runtime_text(i['runtime'])}⟩: predicted "
                     f"{num(predicted)} ms{planned}, served {got}")
    for i in served.get("inferred", []):
        lines.append(f"inferred ⟨{i['threads']} threads, batch {i['batch']}{runtime_text(i['runtime'])}⟩: profile "
                     f"{i['profile_ms']:.2f} ms → {i['inferred_ms']:.2f} ms, not served ({i['rule']}: "
                     f"{i['source']})")
    if (served.get("payload") or {}).get("profile_payload"):  # which figures the plan is made on (payloads.py)
        lines.append(served["payload"]["says"])
    held = served.get("held_back")
    if held:
        lines.append(f"held back by the cool-down ({held['cooldown_left_s']:.0f} s left): {held['plan']}, expected "
                     f"{held['proposed_ms']:.2f} ms against {held['current_ms']:.2f} ms as served")
    trials = served.get("trials") or {}
    for t in trials.get("history", [])[-TRIALS_SHOWN:]:
        lines.append(f"trial {time.strftime('%H:%M:%S', time.localtime(t['started_at']))}: {t['plan']} instead of "
                     f"{t['previous']} for {t['seconds']:.0f} s, {t['outcome']}")
    active = trials.get("active")
    if active:
        served_ms = f", served {active['served_ms']:.2f} ms" if active.get("served_ms") is not None else ""
        lines.append(f"trial under way: {active['plan']} instead of {active['previous']} ({active['previous_ms']:.2f} "
                     f"ms as served), expected {active['expected_ms']:.2f} ms{served_ms}, {active['batches']} batches")
    for c in served["corrections"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c["at"]))
        lines.append(f"correction {when}: ⟨{c['threads']} threads, batch {c['batch']}{runtime_text(c['runtime'])}⟩ "
                     f"profile {c['profile_ms']:.2f} ms → served {c['served_ms']:.2f} ms ({c['samples']} batches)")
    return lines


def num(value) -> str:
    return "?" if value is None else f"{value:.2f}"


def node_view(statuses: dict[str, dict]) -> dict | None:
    """The node (every model on these cores, in this server or another) from the newest view any
    model's status gives: the plan's objective, each model's cores, turns, load and expected
    slowdown, and the moves. None when no model shares the node."""
    nodes = [status["node"] for status in statuses.values() if status.get("node")]
    if not nodes:
        return None
    node = max(nodes, key=lambda n: (n.get("generation") or 0, n.get("step") or 0))
    members = node.get("members", {})
    name = {member_id: member["model"] for member_id, member in members.items()}
    plan = node.get("plan") or {}
    models = {}
    for member_id, share in (plan.get("models") or {}).items():
        member = members.get(member_id, {})
        models[name.get(member_id, member_id)] = {
            "cores": share["cores"], "takes_turns_with": [name.get(m, m) for m in share.get("shared_with", [])],
            "idle": share.get("idle"), "plan": share.get("plan_text"),
            "expected_latency_ms": share.get("expected_latency_ms"), "alone_latency_ms": share.get("alone_latency_ms"),
            "slowdown": share.get("slowdown"), "rate_rps": member.get("rate_rps"), "batch": member.get("batch"),
            "slo_ms": member.get("slo_ms"), "pid": member.get("pid"), "serves_on": member.get("serves_on"),
            "moving": member.get("moving") is not None, "failed": (member.get("failed") or {}).get("reason")}
    planner = node.get("planned_by")
    return {"directory": node.get("directory"), "generation": node.get("generation"), "cores": plan.get("cores"),
            "planned_by": name.get(planner, planner), "epoch": node.get("epoch"), "holding": node.get("holding"),
            "objective": plan.get("objective"), "worst_score": plan.get("worst_score"),
            "missed_slo": [name.get(m, m) for m in plan.get("missed_slo", [])], "models": models,
            "moves": node.get("moves", [])}


def print_node(node: dict, last: int) -> None:
    print(f"node: {node['cores']} cores planned together (plan {node['generation']}, by {node['planned_by']}, "
          f"epoch {node['epoch']}); objective: {node['objective']}")
    if node["holding"]:
        print(f"  holding every model where it serves after a failed move: {node['holding']}")
    if node["missed_slo"]:
        print(f"  cannot meet the latency objective of: {', '.join(node['missed_slo'])}")
    for model, share in sorted(node["models"].items()):
        turns = f" in turns with {', '.join(share['takes_turns_with'])}" if share["takes_turns_with"] else ""
        rate = "saturated" if share["rate_rps"] is None else f"{share['rate_rps']:.1f} req/s"
        slowdown = f", slowdown {share['slowdown']:.2f}" if share.get("slowdown") is not None else ""
        slo = f", SLO {share['slo_ms']:g} ms" if share.get("slo_ms") else ""
        print(f"  {model:<16} cores {cores_text(tuple(share['cores']))}{turns}: {share['plan']}; load {rate}, "
              f"batch {share['batch']}{slowdown}{slo}{where_it_serves(share)}")
    moves = node["moves"]
    print(f"{len(moves)} move(s) of the node's cores{' (newest last)' if moves else ''}")
    for move in moves[-last:]:
        took = f"{move['seconds']:6.2f} s" if move.get("seconds") is not None else "  in progress"
        when = time.strftime("%H:%M:%S", time.localtime(move["started_at"]))
        failed = f"  FAILED: {move['failed']}" if move.get("failed") else ""
        print(f"  {when} {took}  {move['reason']}: {move['plan']}{failed}")
