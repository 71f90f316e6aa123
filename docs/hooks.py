"""MkDocs hook: the manual's reference pages, written from the code at build time.

A page asks for a generated part with a marker on a line of its own, `<!-- generated: NAME -->`:
- `cli packrat`, `cli ios-schedule`: the command's argparse parser, every subcommand and option;
- `settings`: the `packrat:` settings schema (packrat.settings.Settings and its estimator);
- `environment`: every environment variable of the registries (packrat/settings.py, loadtest/env.py);
- `zoo`: the model zoo (packrat.models.zoo.ZOO);
- `modules`: each stage folder's modules, one line of their docstrings, in the order the page's
  stage table lists the folders (a folder the table lacks fails the build).

Each renderer is a plain function from the parser, schema or registry to markdown, so a test can
change an option's help and see the page change (tests/test_manual.py). Nothing here is copied
by hand: an option renamed in a parser is renamed in the manual on the next build."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # document the tree the docs are in, not another installed copy
    sys.path.insert(0, str(ROOT))

MARKER = re.compile(r"^<!-- generated: ([\w-]+)(?: ([\w-]+))? -->$", re.MULTILINE)
USAGE_WIDTH = 100  # usage lines are wrapped at a fixed width, whatever the terminal that builds the docs
TOOLS = ("handlers",)  # folders beside packrat/ whose modules belong to a stage of the map


# ---- markdown helpers ------------------------------------------------------------------------------

def escape(text: str) -> str:
    """`text` (help written for a terminal) as markdown that shows it as written: code spans kept,
    and outside them the characters markdown would read as markup escaped."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(part if part.startswith("`") else re.sub(r"([\\*_<>|\[\]])", r"\\\1", part) for part in parts)


def code(text: str) -> str:
    """`text` as an inline code span, whatever backticks it holds."""
    fence = "``" if "`" in text else "`"
    return f"{fence}{text}{fence}" if fence == "`" else f"{fence} {text} {fence}"


# ---- the CLI, from its argparse parsers ------------------------------------------------------------
# argparse has no public API to walk a parser; _actions, _action_groups and the formatter's two
# helpers below are what its own --help uses, and have kept their names across Python releases.

def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each subcommand, in the parser's order."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            found += [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return found


def usage(parser: argparse.ArgumentParser) -> str:
    formatter = parser.formatter_class(prog=parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def option(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """One option as a definition: how it is written, then its help with %(default)s filled in."""
    formatter = parser._get_formatter()
    written = formatter._format_action_invocation(action)
    helped = " ".join(formatter._expand_help(action).split()) if action.help else "–"
    return f"{code(written)}\n:   {escape(helped)}\n"


def cli_reference(parser: argparse.ArgumentParser, level: int = 2) -> str:
    """Markdown for `parser` and, below it, each of its subcommands (depth first)."""
    lines = [f"{'#' * level} `{parser.prog}`", ""]
    if parser.description:
        lines += [escape(" ".join(parser.description.split())), ""]
    lines += ["```text", usage(parser), "```", ""]
    commands = subcommands(parser)
    if commands:
        lines += ["| command | what it does |", "| --- | --- |"]
        lines += [f"| [`{name}`](#{anchor(sub.prog)}) | {escape(text)} |" for name, text, sub in commands]
        lines.append("")
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS
                   and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
        if not actions:
            continue
        lines += [f"**{escape(group.title)}**" + (f": {escape(' '.join(group.description.split()))}"
                                                   if group.description else ""), ""]
        lines += [option(parser, action) for action in actions]
    if parser.epilog:
        lines += ["```text", parser.epilog.strip(), "```", ""]
    for _, _, sub in commands:
        lines.append(cli_reference(sub, level + 1))
    return "\n".join(lines)


def anchor(prog: str) -> str:
    """The id MkDocs' toc gives the heading `prog` (its default slugify)."""
    return re.sub(r"[^\w\s-]", "", prog).strip().lower().replace(" ", "-")


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser of one of the project's commands (pyproject's [project.scripts])."""
    if name == "packrat":
        from packrat.cli.main import build_parser
    elif name == "ios-schedule":
        from packrat.cli.ios_schedule import build_parser
    else:
        raise ValueError(f"no command {name!r} to document (packrat, ios-schedule)")
    return build_parser()


# ---- settings and environment variables, from the registry ----------------------------------------

def type_text(annotation: str) -> str:
    """A field's annotation in words: `int | None` → int (optional)."""
    kinds = [kind.strip() for kind in annotation.split("|")]
    optional = "None" in kinds
    shown = ", ".join(kind for kind in kinds if kind != "None")
    return shown + (" (optional)" if optional else "")


BOUNDS = (("minimum", "≥"), ("above", ">"), ("maximum", "≤"), ("below", "<"))


def checks_text(meta) -> str:
    """A field's checks in words: ≥ 1; one of `auto`, `fat`."""
    said = [f"{word} {meta[key]}" for key, word in BOUNDS if key in meta]
    if "choices" in meta:
        said.append("one of " + ", ".join(f"`{choice}`" for choice in meta["choices"]))
    return "; ".join(said)


def default_text(field: dataclasses.Field) -> str:
    if field.default is dataclasses.MISSING:
        return "required"
    if field.default in (None, ()):
        return "none"
    return code(str(field.default).lower() if isinstance(field.default, bool) else str(field.default))


def settings_reference(schema: type, options: dict[str, str] | None = None, prefix: str = "") -> str:
    """A table of `schema`'s fields (a frozen dataclass of settings.setting fields): the key, its type,
    default, checks, the CLI options that set it (`options`: key → options) and its doc. A nested
    schema's fields (the estimator) follow as `name.field` rows."""
    options = options or {}
    rows = ["| key | type | default | checks | option | what it is |", "| --- | --- | --- | --- | --- | --- |"]
    nested = []
    for field in dataclasses.fields(schema):
        key, meta = prefix + field.name, field.metadata
        inner = schema_of(field.type)
        if inner is not None:
            nested += settings_reference(inner, options, key + ".").split("\n")[2:]  # its rows, not its header
        doc = escape(meta.get("help", "")) + (" Per model: `NAME=VALUE`." if meta.get("per_model") else "")
        flags = ", ".join(code(name) for name in options.get(key, "").split()) or "–"
        cells = (f"`{key}`", escape(type_text(field.type)), default_text(field), escape(checks_text(meta)), flags, doc)
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows + nested)


def schema_of(annotation: str) -> type | None:
    """The nested schema a field's annotation names (EstimatorSettings), if any."""
    from packrat import settings

    found = getattr(settings, annotation.split("|")[0].strip(), None)
    return found if dataclasses.is_dataclass(found) else None


def settings_options(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Setting key → the options that set it, read off a parser (`packrat archive`'s): an option's
    dest is its key, a nested one's with an underscore for the dot (estimator_alpha: estimator.alpha)."""
    from packrat.settings import Settings

    keys = {}
    for field in dataclasses.fields(Settings):
        inner = schema_of(field.type)
        keys.update({f"{field.name}_{f.name}": f"{field.name}.{f.name}" for f in dataclasses.fields(inner)}
                    if inner else {field.name: field.name})
    found: dict[str, list[str]] = {}
    for action in parser._actions:
        if action.dest in keys and action.option_strings:
            found.setdefault(keys[action.dest], []).extend(action.option_strings)
    return {key: " ".join(names) for key, names in found.items()}


def environment_reference(registries: list[tuple[str, tuple]]) -> str:
    """A table per registry (where it is declared, its EnvVar-like variables: name, type, default, doc)."""
    parts = []
    for where, variables in registries:
        parts += [f"Declared in `{where}`:", "", "| variable | type | default | what it is |",
                  "| --- | --- | --- | --- |"]
        parts += [f"| `{var.name}` | {var.type.__name__} | {code(var.default) if var.default else 'none'} "
                  f"| {escape(var.doc)} |" for var in variables]
        parts.append("")
    return "\n".join(parts).rstrip()


def registries() -> list[tuple[str, tuple]]:
    from packrat import settings
    from packrat.loadtest import env as loadtest_env

    return [("packrat/settings.py", settings.ENVIRONMENT), ("loadtest/env.py", loadtest_env.VARIABLES)]


# ---- the model zoo ----------------------------------------------------------------------------------

def zoo_reference(zoo: dict) -> str:
    """A table of the zoo's models: name, task, inputs (name, dtype, one sample's shape), description."""
    rows = ["| `--model` | task | inputs | what it is |", "| --- | --- | --- | --- |"]
    for name, spec in zoo.items():
        inputs = ", ".join(f"`{i.name}` {i.dtype} {'×'.join(map(str, i.shape))}" for i in spec.inputs)
        rows.append(f"| `{name}` | {spec.task} | {inputs} | {escape(spec.description)} |")
    return "\n".join(rows)


# ---- the stage map's modules, from the source tree -------------------------------------------------

STAGE_ROW = re.compile(r"^\| ((?:`[\w/.]+`(?:, )?)+) \|", re.MULTILINE)


def stage_folders(markdown: str) -> list[list[str]]:
    """The paths each row of the page's stage table names (`packrat/serving/`, `handlers/`, ...), in order."""
    return [re.findall(r"`([\w/.]+)`", row.group(1)) for row in STAGE_ROW.finditer(markdown)]


def summary(path: Path) -> str:
    """The first sentence of a module's docstring, read without importing it."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    first = re.match(r"(.+?[.!?])(?:\s|$)", paragraph)
    return first.group(1) if first else paragraph


def stage_modules(root: Path, path: str) -> list[Path]:
    target = root / path
    if target.is_file():
        return [target]
    return sorted(p for p in target.rglob("*.py") if "__pycache__" not in p.parts)


def module_map(root: Path, rows: list[list[str]]) -> str:
    """For each stage of the table, its modules and what each is. Every module of packrat/ and the
    tools must fall in some stage: a new folder the table lacks is an error, not a silent gap."""
    covered = set()
    lines = []
    for paths in rows:
        modules = [m for path in paths for m in stage_modules(root, path)]
        covered.update(modules)
        lines += [f"**{', '.join(f'`{p}`' for p in paths)}**", "", "| module | what it is |", "| --- | --- |"]
        lines += [f"| `{m.relative_to(root).as_posix()}` | {escape(summary(m))} |"
                  for m in modules]
        lines.append("")
    everything = {p for folder in ("packrat", *TOOLS) for p in stage_modules(root, folder)}
    outside = {root / "packrat" / "__init__.py", root / "packrat" / "ray_serve.py"}  # entry points, not stages
    missing = sorted(p.relative_to(root).as_posix() for p in everything - covered - outside)
    if missing:
        raise ValueError(f"modules in no stage of the architecture table: {missing}")
    return "\n".join(lines).rstrip()


# ---- the hook ---------------------------------------------------------------------------------------

def generated(name: str, argument: str | None, markdown: str) -> str:
    if name == "cli":
        return cli_reference(command_parser(argument or "packrat"))
    if name == "settings":
        from packrat import settings

        archive = dict((n, p) for n, _, p in subcommands(command_parser("packrat")))["archive"]
        return settings_reference(settings.Settings, settings_options(archive))
    if name == "environment":
        return environment_reference(registries())
    if name == "zoo":
        from packrat.models.zoo import ZOO

        return zoo_reference(ZOO)
    if name == "modules":
        return module_map(ROOT, stage_folders(markdown))
    raise ValueError(f"unknown generated part {name!r}")


def render(markdown: str) -> str:
    """`markdown` with each marker replaced by the part it names."""
    return MARKER.sub(lambda m: generated(m.group(1), m.group(2), markdown), markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:
    from mkdocs.exceptions import PluginError

    try:
        return render(markdown)
    except ValueError as exc:  # a stale page fails the build, with the page's name
        raise PluginError(f"{page.file.src_uri}: {exc}") from exc
