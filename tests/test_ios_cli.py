"""`ios-schedule`, run as users run it (a separate process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from packrat.ios_scheduler.graph import capture
from packrat.ios_scheduler.runtime import ScheduledModule
from packrat.ios_scheduler.schedule import Schedule
from packrat.models.zoo import resolve

pytestmark = pytest.mark.slow  # each test runs ios-schedule in a process of its own


def ios_schedule(*args: str) -> subprocess.CompletedProcess:
    code = "import sys; from packrat.cli.ios_schedule import main; sys.argv[0] = 'ios-schedule'; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)


def test_search_compare_and_write_a_schedule(tmp_path):
    out = tmp_path / "sched.json"
    done = ios_schedule("--model", "tiny", "--batch", "2", "--threads", "2", "--out", str(out), "--compare",
                        "--json", "--repeats", "2")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["openmp_env"] == {"GOMP_SPINCOUNT": "10000"}  # restarted with the runtime's settings
    assert report["operators"] == 4 and report["measurements"] > 0 and report["states"] > 0
    assert all(report[f"compare_{name}_ms"] > 0 for name in ("sequential", "greedy", "ios"))
    schedule = Schedule.from_json(out.read_text())
    assert (schedule.batch, schedule.threads, schedule.model) == (2, 2, "tiny")
    spec = resolve("tiny")
    ScheduledModule(capture(spec.build(), (spec.example_input(2),)).module, schedule).close()  # covers the graph


def test_unknown_model_is_a_one_line_error():
    done = ios_schedule("--model", "no_such_net")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no_such_net" in done.stderr


def test_costs_of_one_batch_size_bound_the_search_at_another(tmp_path):
    costs = tmp_path / "b2.json"
    first = ios_schedule("--model", "tiny", "--batch", "2", "--threads", "2", "--costs", str(costs), "--json",
                         "--repeats", "2")
    assert first.returncode == 0, first.stderr
    table = json.loads(costs.read_text())
    assert (table["model"], table["batch"], table["threads"]) == ("tiny", 2, 2) and table["costs"]
    second = ios_schedule("--model", "tiny", "--batch", "4", "--threads", "2", "--bounds", str(costs), "--json",
                          "--repeats", "2")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["kept"] in ("searched", "sequential")
    wrong = ios_schedule("--model", "squeezenet", "--batch", "1", "--threads", "2", "--bounds", str(costs))
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "cannot bound" in wrong.stderr
