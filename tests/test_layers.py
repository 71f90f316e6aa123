"""The layout's one rule, checked on the code: a module imports only from its own stage or the
stages below it (lazy imports inside functions included), and the tools beside the package
(ios_scheduler, loadtest) import nothing of it; the commands' stage holds commands only."""

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Bottom to top (docs/architecture.md's stage table lists them top down; tests/test_manual.py checks it);
# a stage may import from its own rank or lower.
STAGES = {
    "packrat.errors": 0, "packrat.settings": 0,
    "packrat.machine": 1,
    "packrat.planning": 2, "packrat.models": 2,
    "packrat.codec": 3,
    "packrat.profiling": 4,
    "packrat.serving": 5,
    "packrat.frontends": 6, "packrat.handlers": 6,
    "packrat.deploy": 7,
    "packrat.bench": 8,
    "packrat.cli": 9,
}
ENTRY_POINTS = {"packrat/__init__.py", "packrat/ray_serve.py"}  # the public API and the Ray Serve builder's name
# The folders beside packrat/ and the names they install under (pyproject's package-dir): handlers -> packrat.handlers
FOLDERS = {folder: name for name, folder in
           tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].items()}


def module_name(relative: str) -> str:
    """The module a file (relative to the root) is imported as."""
    top, *rest = relative.removesuffix(".py").removesuffix("/__init__").split("/")
    return ".".join((FOLDERS.get(top, top), *rest))


def stage(module: str) -> str | None:
    for name in sorted(STAGES, key=len, reverse=True):
        if module == name or module.startswith(name + "."):
            return name
    return None


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def upward_imports(path: Path) -> list[str]:
    """The modules `path` imports from stages above its own."""
    relative = path.relative_to(ROOT).as_posix()
    own = stage(module_name(relative))
    assert own is not None, f"{relative} is in no stage: add its folder to STAGES and docs/architecture.md's table"
    return sorted(module for module in imports(path)
                  if stage(module) is not None and STAGES[stage(module)] > STAGES[own])


def test_no_module_imports_from_a_stage_above_its_own():
    checked = [p for p in sources("packrat", "handlers") if p.relative_to(ROOT).as_posix() not in ENTRY_POINTS]
    assert len(checked) > 50  # the whole package was read
    upward = {str(p.relative_to(ROOT)): upward_imports(p) for p in checked}
    assert not {path: modules for path, modules in upward.items() if modules}


def test_an_import_from_above_is_caught(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    module = tmp_path / "packrat" / "codec" / "bad.py"
    module.parent.mkdir(parents=True)
    module.write_text("def f():\n    from packrat.serving.engine import Engine\n")
    assert upward_imports(module) == ["packrat.serving.engine", "packrat.serving.engine.Engine"]


CLI_HELPERS = {"__init__.py", "__main__.py", "main.py", "args.py", "types.py", "output.py"}  # argparse and printing


def test_the_cli_holds_commands_only():
    """packrat/cli/ is the argparse helpers and one module per command (its parser beside its code), none
    over 250 lines: what a command measures lives in the bench stage, where benchmarks and tests find it."""
    found = {}
    for path in sources("packrat/cli"):
        text = path.read_text()
        command = re.search(r"^def (add_\w+_parser|main)\(", text, re.MULTILINE)
        if len(text.splitlines()) > 250 or not (command or path.name in CLI_HELPERS):
            found[path.name] = len(text.splitlines())
    assert not found


@pytest.mark.parametrize("folder", ["ios_scheduler", "loadtest"])
def test_the_tools_beside_the_package_import_nothing_of_it(folder):
    """Their own modules they import relatively, or by their installed name (the locustfile, which
    locust runs by path); nothing else of packrat."""
    own = FOLDERS[folder]
    used = {str(p.relative_to(ROOT)): sorted(m for m in imports(p) if m.split(".")[0] == "packrat"
                                             and m != own and not m.startswith(own + "."))
            for p in sources(folder)}
    assert not {path: modules for path, modules in used.items() if modules}


def test_the_tools_are_imported_by_their_installed_names():
    """`import loadtest` works only in the source tree (and loads a second copy beside packrat.loadtest's)."""
    used = {str(p.relative_to(ROOT)): sorted(m for m in imports(p) if m.split(".")[0] in FOLDERS)
            for p in sources("packrat", *FOLDERS, "tests", "benchmarks")}
    assert not {path: modules for path, modules in used.items() if modules}
