"""`packrat status`: the running handler's plan, health and reconfigurations."""

from __future__ import annotations

import argparse
import json

from packrat.cli.args import run_dir_arg

from packrat.cli.types import positive
from packrat.cli.output import cores_text, print_budget_and_profile
from packrat.deploy import torchserve


def add_status_parser(sub) -> None:
    p = sub.add_parser("status", help="the served plan and the last reconfigurations",
                       description="Ask the running packrat handler (through TorchServe's management API) for "
                                   "its current plan, how its instances run the model (compile, script, eager or ios) "
                                   "and its recent reconfigurations.")
    run_dir_arg(p)
    p.add_argument("--last", type=positive(int), default=10, help="reconfigurations to list (default: 10)")
    p.add_argument("--json", action="store_true",
                   help='print {"plan": <as packrat plan --json>, "mode": "compile"|"script"|"eager"|"ios", "health": {"instances", '
                        '"ready", "respawning", "respawn_failures", "unavailable", "queued", "answered", "refused"}, '
                        '"reconfigurations": [{"from_batch", "to_batch", '
                        '"reason", "seconds", "failed_requests", ...}], "cpu_budget": {"cores", "source", '
                        '"detail"}, "profile": "NAME: why it was chosen"}')
    p.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    server = torchserve.Server.load(args.run_dir.resolve())
    status = torchserve.handler_status(server)
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    plan = status["plan"]
    shapes = ", ".join(f"⟨{i['threads']} threads, batch {i['batch']}, cores {cores_text(tuple(i['cores']))}⟩"
                       for i in plan["instances"])
    print(f"model {server.model} ({status.get('mode', '?')}): serving B={plan['batch']} on T={plan['threads']} "
          f"threads: {shapes}")
    print_budget_and_profile(status)
    health = status.get("health")
    if health:
        state = f"UNAVAILABLE: {health['unavailable']}" if health.get("unavailable") else "serving"  # null dropped
        print(f"instances: {health['ready']}/{health['instances']} ready, {health['respawning']} respawning, "
              f"{health['respawn_failures']} failed respawn attempt(s); {health['queued']} queued, "
              f"{health['answered']} answered, {health['refused']} refused (503); {state}")
        print(f"recovery: {health.get('watchdog_kills', 0)} hung instance(s) killed by the watchdog, "
              f"{health.get('requeued', 0)} request(s) re-run after losing their instance, "
              f"{health.get('expired', 0)} past their deadline (504)")
    records = status["reconfigurations"]
    print(f"{len(records)} reconfiguration(s){' (newest last)' if records else ''}")
    for r in records[-args.last:]:
        outcome = f"FAILED: {r['error']}" if r.get("error") else r.get("plan", "")
        print(f"  B {r['from_batch']:>3} → {r['to_batch']:<3} {r['seconds']:6.2f} s  failed requests "
              f"{r['failed_requests']}  {r['reason']}  {outcome}")
    return 0
