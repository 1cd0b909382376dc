"""MkDocs hook (mkdocs.yml `hooks:`): the reference pages made from the code, so they
cannot drift from it. `<!-- generated: config -->` in a page becomes every ralph.yml key
(engine/config_types.py: its type, its default and its `doc`); `<!-- generated: commands
-->` every command of the `ralph` parser (engine/cli/parser.py: its help, usage and
flags). tests/test_docs.py runs these functions and `mkdocs build --strict`."""
from __future__ import annotations

import argparse
import enum
import functools
import re
import types
import typing

import attrs

from ralph.engine.cli.parser import build_parser
from ralph.engine.config_types import Config

CONFIG_MARK = "<!-- generated: config -->"
COMMANDS_MARK = "<!-- generated: commands -->"


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Each mark, and what follows it up to `<!-- end generated -->` (a note for whoever
    reads the page unbuilt, on GitHub), becomes what the code says."""
    for mark, make in ((CONFIG_MARK, config_reference), (COMMANDS_MARK, commands_reference)):
        if mark in markdown:
            markdown = re.sub(re.escape(mark) + r"(.*?<!-- end generated -->)?",
                              lambda _match: make(), markdown, count=1, flags=re.S)
    return markdown


# --- ralph.yml ---

def config_sections(root: type = Config) -> list[tuple[list[str], type]]:
    """Every attrs class of the config with the key paths that reach it, in the order met:
    [(["agent"], AgentConfig), (["agent.prices", "roles.planner.agent.prices"], Prices),
    ...]; `[]` is one item of a list, `EVENT` a key of a mapping."""
    found: dict[type, list[str]] = {}

    def walk(cls: type, path: str) -> None:
        found.setdefault(cls, []).append(path)   # met again: its keys are listed once
        for f in attrs.fields(attrs.resolve_types(cls)):
            for inner, suffix in _classes_in(f.type):
                walk(inner, _join(path, f.name) + suffix)

    walk(root, "")
    return [(paths, cls) for cls, paths in found.items()]


def _classes_in(tp) -> list[tuple[type, str]]:
    """The attrs classes a field's type holds, each with what leads to it from the key."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if attrs.has(tp):
        return [(tp, "")]
    if origin is list:
        return [(cls, "[]" + suffix) for cls, suffix in _classes_in(args[0])]
    if origin is dict:
        return [(cls, ".EVENT" + suffix) for cls, suffix in _classes_in(args[1])]
    if origin in (typing.Union, types.UnionType):
        return [found for arg in args for found in _classes_in(arg)]
    return []


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def type_text(tp) -> str:
    """A field's type as a reader of ralph.yml says it."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_text(a) for a in args)
    if origin is list:
        return f"list of {type_text(args[0])}"
    if origin is dict:
        return f"mapping of {type_text(args[0])} to {type_text(args[1])}"
    if tp is type(None):
        return "null"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in tp)
    if attrs.has(tp):
        return "mapping"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}[tp]


def default_text(f: attrs.Attribute) -> str:
    if f.default is attrs.NOTHING:
        return "required"
    value = f.default.factory() if isinstance(f.default, attrs.Factory) else f.default
    if attrs.has(type(value)):
        return "(below)"
    return f"`{_yaml(value)}`"


def _yaml(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, dict)):
        return "[]" if isinstance(value, list) else "{}"
    return str(value)


def config_reference() -> str:
    """A table per section of ralph.yml: each key, its type, its default, its meaning."""
    out = []
    for paths, cls in config_sections():
        if paths == [""]:
            title, rows_prefix = "top level", ""
        else:
            title, rows_prefix = f"`{paths[0]}`", paths[0] + "."
        out.append(f"### {title}\n")
        if len(paths) > 1:
            out.append("The same keys under " + ", ".join(f"`{p}`" for p in paths[1:]) + ".\n")
        out.append("| key | type | default | meaning |\n|---|---|---|---|")
        for f in attrs.fields(attrs.resolve_types(cls)):
            doc = f.metadata.get("doc", "").replace("|", "\\|")
            out.append(f"| `{rows_prefix}{f.name}` | {type_text(f.type)} | "
                       f"{default_text(f)} | {doc} |")
        out.append("")
    return "\n".join(out)


# --- the command line ---

def commands(parser: argparse.ArgumentParser | None = None,
             words: tuple[str, ...] = ()) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """Every command that runs something: (its words, its help, its parser), in the order
    of `ralph --help`; groups (`session`, `tools`) are walked, not listed."""
    parser = parser or build_parser()
    found = []
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help for a in action._choices_actions}
        for name, sub in action.choices.items():
            if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                found += commands(sub, words + (name,))
            else:
                found.append((" ".join(words + (name,)), helps.get(name) or "", sub))
    return found


def _usage(parser: argparse.ArgumentParser) -> str:
    wide = functools.partial(argparse.RawDescriptionHelpFormatter, width=10_000)
    formatter = wide(prog=parser.prog)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups,
                        prefix="")
    return formatter.format_help().strip()


def _metavar(action: argparse.Action) -> str:
    if action.metavar:
        return action.metavar
    if action.choices:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return action.dest.upper() if action.option_strings else action.dest


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.dest == "workspace":
            continue
        if action.option_strings:
            names = ", ".join(action.option_strings)
            if action.nargs != 0:
                names += " " + _metavar(action)
        else:
            names = _metavar(action)
        text = (action.help or "").replace("|", "\\|")
        if action.required and action.option_strings:
            text += " (required)"
        rows.append(f"| `{names}` | {text} |")
    return rows


def commands_reference() -> str:
    parser = build_parser()
    out = ["Every command takes `--workspace DIR` (default: `$RALPH_WORKSPACE`, then the "
           "current directory) and `--help`.\n"]
    for words, help_text, sub in commands(parser):
        out.append(f"### `ralph {words}`\n")
        out.append(help_text[:1].upper() + help_text[1:] + ".\n")
        out.append(f"```\n{_usage(sub)}\n```\n")
        rows = _option_rows(sub)
        if rows:
            out.append("| argument | meaning |\n|---|---|")
            out.extend(rows)
            out.append("")
    if parser.epilog:   # the exit codes, as `ralph --help` ends
        out.append(f"### After every command\n\n```\n{parser.epilog.strip()}\n```\n")
    return "\n".join(out)
