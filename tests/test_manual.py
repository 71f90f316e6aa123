"""The manual (docs/, mkdocs.yml) cannot go stale: its references are written from the code
(docs/hooks.py) and follow a change of it, it builds with `mkdocs build --strict` offline, its
architecture table follows the layers, its troubleshooting quotes messages the code still prints,
and every benchmark table has its command beside it."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from packrat.loadtest import env as loadtest_env
from packrat.profiling.profiles import COLUMNS
from packrat.settings import ENVIRONMENT, EnvVar, EstimatorSettings, Settings, setting

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def load_hooks():
    """docs/hooks.py as a module, without leaving a __pycache__ in docs/."""
    spec = importlib.util.spec_from_file_location("packrat_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = writes
    return module


hooks = load_hooks()


# ---- the references follow the code ----------------------------------------------------------------

def test_the_cli_reference_follows_an_options_help():
    from packrat.cli.main import build_parser

    parser = build_parser()
    profile = dict((name, sub) for name, _, sub in hooks.subcommands(parser))["profile"]
    threads = next(a for a in profile._actions if "--threads" in a.option_strings)
    before = hooks.cli_reference(parser)
    assert "## `packrat profile`" in before and "`--threads THREADS`" in before
    threads.help = "how many threads, told differently (default: %(default)s)"
    after = hooks.cli_reference(parser)
    assert after != before and "how many threads, told differently (default: None)" in after
    profile.add_argument("--brand-new", help="an option added a moment ago")
    assert "`--brand-new BRAND_NEW`\n:   an option added a moment ago" in hooks.cli_reference(parser)


def test_the_cli_reference_has_every_command_and_option():
    from packrat.cli.main import build_parser

    parser = build_parser()
    text = hooks.cli_reference(parser)
    for name, _, sub in hooks.subcommands(parser):
        assert f"`{sub.prog}`" in text and f"(#{hooks.anchor(sub.prog)})" in text
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            for option in action.option_strings:
                assert option in text, (sub.prog, option)
    assert "### `packrat export k8s`" in text  # nested subcommands too


def test_help_written_for_a_terminal_shows_as_written():
    assert hooks.escape("a <b> *c* d_e | `x_y|z`") == r"a \<b\> \*c\* d\_e \| `x_y|z`"


def test_the_settings_reference_follows_the_schema():
    @dataclass(frozen=True)
    class Schema:
        width: int = setting(3, "how wide", minimum=1)
        mode: str = setting("auto", "which way", choices=("auto", "fat"))

    text = hooks.settings_reference(Schema, {"width": "--width"})
    assert "| `width` | int | `3` | ≥ 1 | `--width` | how wide |" in text
    assert "one of `auto`, `fat`" in text

    @dataclass(frozen=True)
    class Renamed:
        width: int = setting(3, "how wide, said another way", minimum=1)

    assert "how wide, said another way" in hooks.settings_reference(Renamed)


def test_every_setting_is_in_the_reference_with_its_option():
    parser = dict((n, p) for n, _, p in hooks.subcommands(hooks.command_parser("packrat")))["archive"]
    options = hooks.settings_options(parser)
    text = hooks.settings_reference(Settings, options)
    keys = [f.name for f in Settings.__dataclass_fields__.values()]
    keys += [f"estimator.{name}" for name in EstimatorSettings.__dataclass_fields__]
    for key in keys:
        assert f"| `{key}` |" in text, key
    assert options["max_batch"].split() == ["--max-batch", "--batch-size"]
    assert options["estimator.alpha"] == "--estimator-alpha"


def test_the_environment_reference_names_every_variable():
    text = hooks.environment_reference(hooks.registries())
    for var in (*ENVIRONMENT, *loadtest_env.VARIABLES):
        assert f"| `{var.name}` |" in text
    made_up = EnvVar("X_MADE_UP", int, None, "a variable declared a moment ago")
    assert "| `X_MADE_UP` | int | none | a variable declared a moment ago |" in hooks.environment_reference(
        [("here.py", (made_up,))])


def test_a_stage_folder_missing_from_the_table_fails_the_build(tmp_path):
    for path in ("packrat/a/__init__.py", "packrat/a/one.py", "packrat/b/two.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text('"""Module doc. More."""\n')
    assert "| `packrat/a/one.py` | Module doc. |" in hooks.module_map(tmp_path, [["packrat/a/", "packrat/b/"]])
    with pytest.raises(ValueError, match="packrat/b/two.py"):
        hooks.module_map(tmp_path, [["packrat/a/"]])


def test_an_unknown_marker_is_an_error():
    with pytest.raises(ValueError, match="unknown generated part"):
        hooks.render("<!-- generated: nothing -->\n")


# ---- the hand-written pages against the code --------------------------------------------------------

def test_the_architecture_table_follows_the_layers():
    from test_layers import STAGES

    rows = hooks.stage_folders((DOCS / "architecture.md").read_text())
    ranks = []
    for paths in rows:
        names = {path.removesuffix("/").removesuffix(".py").replace("/", ".") for path in paths}
        names = {"packrat.handlers" if name == "handlers" else name for name in names}
        assert names <= set(STAGES), names
        assert len({STAGES[name] for name in names}) == 1, names  # one row, one rank
        ranks.append(STAGES[names.pop()])
    assert ranks == sorted(ranks, reverse=True), "the table runs from the top stage down"
    named = {n for paths in rows for p in paths for n in [p.removesuffix("/").removesuffix(".py").replace("/", ".")]}
    assert set(STAGES) - {"packrat.handlers"} <= named


def test_troubleshooting_quotes_messages_the_code_prints():
    sources = "".join(p.read_text() for folder in ("packrat", "handlers", "loadtest")
                      for p in sorted((ROOT / folder).rglob("*.py")))
    sources += "".join(p.read_text() for p in sorted((ROOT / "scripts").glob("*.sh")))
    quoted = re.findall(r"^> `(.+)`$", (DOCS / "troubleshooting.md").read_text(), re.MULTILINE)
    assert len(quoted) >= 15
    assert [q for q in quoted if q not in sources] == []


def test_the_profile_format_page_names_every_column():
    page = (DOCS / "reference" / "profile-format.md").read_text()
    assert [column for column in COLUMNS if f"`{column}`" not in page] == []


# Other tools' options the manual shows (TorchServe, Docker, Ray, kubectl, curl, locust, pytest, MkDocs).
FOREIGN = {"--address", "--cpu-manager-policy", "--cpus", "--cpuset-cpus", "--data-binary", "--dist", "--durations",
           "--for", "--foreground", "--head", "--headless", "--host", "--log-config", "--model-store", "--models",
           "--ncs", "--num-cpus", "--port", "--rm", "--shm-size", "--start", "--stop", "--strict", "--strict-markers", "--ts-config"}


def project_options() -> set[str]:
    """Every option of packrat's commands (their parsers), of the benchmark scripts (read from their
    source: they are run as scripts) and of scripts/*.sh."""
    def walk(parser):
        yield parser
        for _, _, sub in hooks.subcommands(parser):
            yield from walk(sub)

    found = {option for name in ("packrat", "ios-schedule") for parser in walk(hooks.command_parser(name))
             for action in parser._actions for option in action.option_strings}
    found.update(o for p in (ROOT / "benchmarks").glob("*.py")
                 for o in re.findall(r'add_argument\(\s*"(--[\w-]+)"', p.read_text()))
    found.update(o for p in (ROOT / "scripts").glob("*.sh") for o in re.findall(r'"(--[\w-]+)"', p.read_text()))
    # the KServe model server's own command (python -m packrat.frontends.kserve_server)
    found.update(re.findall(r'add_argument\(\s*"(--[\w-]+)"', (ROOT / "packrat/frontends/kserve_server.py").read_text()))
    return found


def test_every_option_the_manual_names_exists():
    """An option renamed in a parser cannot stay in the text: every --option of the README and the
    guides is one of the project's commands' or scripts' (or another tool's the text shows)."""
    known = project_options() | FOREIGN
    pages = [ROOT / "README.md", *(p for p in DOCS.rglob("*.md") if "benchmarks" not in p.relative_to(DOCS).parts)]
    named = {(p.relative_to(ROOT).as_posix(), option) for p in pages
             for option in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", p.read_text())}
    assert len(named) > 100
    assert sorted((page, option) for page, option in named if option not in known) == []


RUNS = r"(?:packrat |benchmarks/|ios-schedule|pytest|scripts/|\.ci/run|python|git )"
COMMAND = re.compile(rf"`[^`]*{RUNS}[^`]*`|```[^\n]*\n[^`]*?{RUNS}[^`]*?```")


def tables_without_a_command(text: str) -> list[str]:
    """The first row of each table that has no command before it in its own section, nor in the
    introduction of a section above it (the text between that section's heading and its first
    subsection). Fenced blocks count as commands when they hold one."""
    found, stack, section, in_table = [], [], "", False
    fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        heading = None if fence else re.match(r"^(#+) ", line)
        if heading:
            level = len(heading.group(1))
            if stack:
                stack[-1] = (stack[-1][0], stack[-1][1] or bool(COMMAND.search(section)))
            stack = [entry for entry in stack if entry[0] < level] + [(level, False)]
            section, in_table = "", False
            continue
        starts = line.startswith("|") and not fence
        if starts and not in_table:
            commanded = bool(COMMAND.search(section)) or any(flag for _, flag in stack[:-1])
            if not commanded:
                found.append(line)
        in_table = starts
        section += line + "\n"
    return found


def test_a_table_without_a_command_is_caught():
    text = "# Page\n\n## A\n\n`packrat plan --batch 4`\n\n| a |\n|---|\n\n## B\n\n| b |\n|---|\n"
    assert tables_without_a_command(text) == ["| b |"]


@pytest.mark.parametrize("page", sorted((DOCS / "benchmarks").glob("*.md")), ids=lambda p: p.name)
def test_every_benchmark_figure_has_its_command_and_machine(page):
    text = page.read_text()
    if page.name != "index.md":
        assert "**Machine:**" in text, "say which machine the figures come from"
        assert tables_without_a_command(text) == []


# ---- the build ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_manual_builds_strict_and_offline(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    pytest.importorskip("material", reason="the docs extra is not installed (pip install -e '.[docs]')")
    site = tmp_path / "site"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    pages = {p.relative_to(site).as_posix(): p.read_text() for p in site.rglob("*.html")}
    assert "reference/cli/index.html" in pages and "benchmarks/served-plans/index.html" in pages
    assert 'id="packrat-profile"' in pages["reference/cli/index.html"]  # generated at build time
    assert "<!-- generated:" not in "".join(pages.values())
    fetched = re.compile(r"<(?:script|link|img)\b[^>]*\b(?:src|href)=\"(?:https?:)?//", re.IGNORECASE)
    assert [name for name, html in pages.items() if fetched.search(html)] == []  # nothing from the network
    styles = "".join(p.read_text() for p in site.rglob("*.css"))
    assert "fonts.googleapis" not in styles + "".join(pages.values())
