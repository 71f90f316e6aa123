"""Names in the text that a newcomer follows: every module (`packrat.serving.engine`,
`packrat.models.zoo.resolve`) and file (`packrat/deploy/log4j2.xml`, `serving/pool/child.py`) that
README.md, BENCHMARKS.md, the manual (docs/) and the package's docstrings, comments and messages name
exists, and the Ray Serve application builder has one spelling. (The benchmark pages, docs/benchmarks/,
are left out: they name retired scripts on purpose, each with the commit that holds it.)"""

from __future__ import annotations

import ast
import re
import tomllib
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Where a module lives when its package is installed from another folder (pyproject's package-dir).
PACKAGE_DIRS = tomllib.loads((ROOT / "pyproject.toml").read_text()).get("tool", {}).get("setuptools", {}).get(
    "package-dir", {})
TOOLS = ("handlers", "loadtest", "ios_scheduler")
MANUAL = [p for p in (ROOT / "docs").rglob("*.md") if "benchmarks" not in p.relative_to(ROOT / "docs").parts]
TEXTS = sorted({ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "mkdocs.yml", *MANUAL, ROOT / "config.properties",
                ROOT / "pyproject.toml", ROOT / "deploy" / "Dockerfile", *ROOT.glob("scripts/*.sh"),
                *(p for folder in ("packrat", *TOOLS) for p in (ROOT / folder).rglob("*.py"))})
DOTTED = re.compile(r"(?<![\w/.-])packrat(?:\.[A-Za-z_]\w*)+")
# The project's own folders, not what running it leaves behind (profiles/, out/, model_store/: the
# manual names files in them that need not exist).
LAYOUT = ("packrat", *TOOLS, "tests", "benchmarks", "scripts", "deploy", "docs")
FOLDERS = sorted({*LAYOUT, *(p.name for p in (ROOT / "packrat").iterdir() if p.is_dir() and p.name != "__pycache__")},
                 key=len, reverse=True)
# A path from the project root, or from packrat/ as the architecture page writes them: a file or a folder/.
SLASHED = re.compile(r"(?<![\w/.$~-])((?:%s)(?:/[\w.-]+)+)" % "|".join(map(re.escape, FOLDERS)))
FILE_OR_FOLDER = re.compile(r"\.(py|xml|csv|sh|md|json|toml|yaml|yml|txt|png|cfg|properties)$|/$")


def module_path(parts: list[str]) -> Path | None:
    """The file of module `parts` (a package's __init__.py), through pyproject's package-dir."""
    for name in sorted(PACKAGE_DIRS, key=len, reverse=True):
        if parts[:len(name.split("."))] == name.split("."):
            base = ROOT / PACKAGE_DIRS[name] / Path(*parts[len(name.split(".")):])
            break
    else:
        base = ROOT / Path(*parts)
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


@cache
def top_level_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    if path == ROOT / "packrat" / "__init__.py":  # the public API, loaded on first use
        api = next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "_API")
        names.update(ast.literal_eval(api))
    return names


def dotted_exists(name: str) -> bool:
    """`packrat.a.b` is a module, or `packrat.a.b.c` a name defined in module packrat.a.b."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        path = module_path(parts[:n])
        if path is not None:
            return n == len(parts) or parts[n] in top_level_names(path)
    return False


def slashed_exists(name: str, here: Path | None = None) -> bool:
    """From the root, from packrat/, or (a link in the manual) from the folder of the file that names it."""
    return any((base / name).exists() for base in (ROOT, ROOT / "packrat", *([here] if here else [])))


def placeholder(name: str) -> bool:
    """packrat/cli/NAME.py: a pattern, not a file."""
    return name.rstrip("/").rsplit("/", 1)[-1].split(".")[0].isupper()


def named(text: str, here: Path | None = None) -> list[tuple[int, str]]:
    """(line, name) of every module and path in `text` (a file in folder `here`) that should exist."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        found += [(number, m.group(0)) for m in DOTTED.finditer(line) if not dotted_exists(m.group(0))]
        for m in SLASHED.finditer(line):
            name = m.group(1).rstrip(".")
            if FILE_OR_FOLDER.search(name) and not placeholder(name) and not slashed_exists(name, here):
                found.append((number, name))
    return found


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_module_and_file_it_names_exists(path):
    here = ROOT / "docs" if path.name == "mkdocs.yml" else path.parent  # mkdocs.yml names pages from docs/
    assert not named(path.read_text(errors="replace"), here)


def test_a_stale_name_is_caught():
    text = ("packrat.graph.MODES, packrat.models.modes.MODES, packrat.models.modes.NOPE, packrat.Settings,\n"
            "`packrat/log4j2.xml` `packrat/deploy/log4j2.xml` `serving/pool/child.py` `codec/none.py` "
            "packrat/cli/NAME.py packrat/stock ratios")
    assert named(text) == [(1, "packrat.graph.MODES"), (1, "packrat.models.modes.NOPE"), (2, "packrat/log4j2.xml"),
                           (2, "codec/none.py")]


def test_the_ray_serve_builder_has_one_spelling():
    """`packrat.ray_serve:app`, as the README, `serve run` and KubeRay's RayService write it."""
    spelled = {m.group(0) for path in [*TEXTS, *ROOT.glob("tests/*.py"), *ROOT.glob("benchmarks/*.py")]
               if path != Path(__file__) for m in re.finditer(r"packrat(?:\.\w+)*[.:]app\b", path.read_text())}
    assert spelled == {"packrat.ray_serve:app", "packrat.ray_serve.app"}
    assert "app" not in top_level_names(ROOT / "packrat" / "__init__.py")
