"""The suite's tiers are honest: the markers are registered (and a misspelt one fails), and a test that
starts TorchServe, a Ray cluster or locust — itself, through a fixture or a helper of its file — is
marked `integration`, so `pytest -m "not integration and not slow"` never starts one. Read from the
test files' syntax (ast), nothing run."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = None

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# Calls that start what the integration marker stands for: `torchserve.start(...)` (packrat.deploy's
# server starter) or waiting for a server started otherwise, a local Ray cluster, a locust run. A
# monkeypatched stand-in is not a call of them.
STARTERS = {("torchserve", "start"), ("torchserve", "wait_ready"), (None, "LocalCluster"), (None, "run_locust")}


def _marks(node: ast.AST) -> set[str]:
    """The names X of every `pytest.mark.X` (or `mark.X`) inside `node`."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark":
            names.add(sub.attr)
    return names


def _calls(function: ast.AST) -> set[tuple[str | None, str]]:
    """(owner, name) of every call in `function`: `a.b(...)` as ("a", "b"), `f(...)` as (None, "f")."""
    found = set()
    for sub in ast.walk(function):
        if isinstance(sub, ast.Call):
            if isinstance(sub.func, ast.Name):
                found.add((None, sub.func.id))
            elif isinstance(sub.func, ast.Attribute):
                owner = sub.func.value.id if isinstance(sub.func.value, ast.Name) else None
                found.add((owner, sub.func.attr))
    return found


def starting_tests(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """The file's test functions that start a server, cluster or load, directly or through a function
    or fixture of the same file."""
    functions = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    starting = {name for name, node in functions.items() if _calls(node) & STARTERS}
    grew = True
    while grew:
        grew = False
        for name, node in functions.items():
            if name in starting:
                continue
            called = {callee for owner, callee in _calls(node) if owner is None}
            fixtures = {arg.arg for arg in node.args.args}
            if (called | fixtures) & starting:
                starting.add(name)
                grew = True
    return {name: functions[name] for name in starting if name.startswith("test_")}


def module_marks(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                for t in node.targets):
            return _marks(node.value)
    return set()


def test_markers_are_registered_and_strict():
    text = (ROOT / "pyproject.toml").read_text()
    if tomllib is not None:
        options = tomllib.loads(text)["tool"]["pytest"]["ini_options"]
        registered = {line.split(":")[0].strip() for line in options["markers"]}
        assert {"integration", "slow"} <= registered
        assert "--strict-markers" in options["addopts"].split()
    else:
        assert '"integration:' in text and '"slow:' in text and "--strict-markers" in text


def test_every_test_that_starts_a_server_is_marked_integration():
    unmarked, seen = [], 0
    for path in sorted(TESTS.glob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        marked_module = "integration" in module_marks(tree)
        for name, node in starting_tests(tree).items():
            seen += 1
            if not marked_module and not any("integration" in _marks(d) for d in node.decorator_list):
                unmarked.append(f"{path.name}::{name}")
    assert seen >= 10  # the rule found the suite's TorchServe, Ray and locust tests
    assert unmarked == [], f"start TorchServe, Ray or locust but are not marked integration: {unmarked}"


def test_the_rule_follows_fixtures_and_helpers():
    tree = ast.parse('''
import pytest
from packrat.deploy import torchserve

def start(name):
    return torchserve.start(name)

@pytest.fixture
def server():
    yield start("tiny")

def test_through_a_fixture(server):
    pass

def test_faked(monkeypatch):
    monkeypatch.setattr(torchserve, "start", lambda *a: None)

@pytest.mark.integration
def test_direct():
    torchserve.start(None)
''')
    assert set(starting_tests(tree)) == {"test_through_a_fixture", "test_direct"}
    assert module_marks(ast.parse("import pytest\npytestmark = [pytest.mark.integration, pytest.mark.skipif(1)]")) \
        == {"integration", "skipif"}
