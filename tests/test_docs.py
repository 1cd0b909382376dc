"""The README is a front page and the reference is the docs site (issue 33): the
configuration and commands pages are made from the code, every config key has its doc,
and the site builds with `mkdocs build --strict` (so the README's test command, which CI
runs, checks the docs too)."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import attrs
import pytest

from support import REPO

README = (REPO / "README.md").read_text()


def _docs_hooks():
    spec = importlib.util.spec_from_file_location("ralph_docs_hooks", REPO / "docs/hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _docs_hooks()


def _keys():
    """Every ralph.yml key: (its path, its attrs field)."""
    for paths, cls in hooks.config_sections():
        for f in attrs.fields(attrs.resolve_types(cls)):
            yield (f"{paths[0]}.{f.name}" if paths[0] else f.name), f


def test_every_config_key_has_its_doc():
    keys = list(_keys())
    assert len(keys) > 60   # the walk reaches the nested sections (agent.approve[], hooks)
    undocumented = [path for path, f in keys if not f.metadata.get("doc", "").strip()]
    assert not undocumented, (
        f"ralph.yml keys without a doc: {undocumented}; give each its meaning where it is "
        f"declared (engine/config_types.py: key(..., doc=...)): docs/configuration.md is "
        f"made from it")


def test_the_configuration_page_is_every_key_with_its_type_default_and_doc():
    page = hooks.config_reference()
    for path, f in _keys():
        row = next((line for line in page.splitlines() if line.startswith(f"| `{path}` |")),
                   None)
        assert row is not None, path
        assert f.metadata["doc"].replace("|", "\\|") in row, path
    assert "| `agent.backend` | `demo` \\| `command` \\| `claude`" in page
    assert "| `event_loop.max_event_bytes` | integer | `1048576` |" in page
    assert "| `RObot.timeout_seconds` | number | `600` |" in page
    assert "| `agent.approve[].rule` | string | required |" in page
    assert "| `hooks.EVENT[].on_error` | `warn` \\| `block` \\| `pause` | `warn` |" in page
    assert "The same keys under `roles.executor`" in page
    marked = (REPO / "docs/configuration.md").read_text()
    assert hooks.CONFIG_MARK in marked


def test_the_commands_page_is_every_command_and_flag_of_the_parser():
    page = hooks.commands_reference()
    found = hooks.commands()
    names = [words for words, _help, _parser in found]
    for expected in ("init", "validate", "session start", "session resume", "session answer",
                     "signal", "web", "bot run", "tools interact ask", "tools approve", "mcp",
                     "emit", "diagram"):
        assert expected in names
    for words, help_text, parser in found:
        assert f"### `ralph {words}`" in page
        assert help_text and help_text[1:] in page, words
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help", "--workspace"):
                    assert f"`{flag}" in page or f", {flag}" in page, (words, flag)
    assert "130" in page and "SIGINT" in page   # the exit codes, from `ralph --help`
    assert hooks.COMMANDS_MARK in (REPO / "docs/commands.md").read_text()


def test_the_readme_is_a_front_page_that_starts_with_the_two_commands():
    lines = README.splitlines()
    assert len(lines) <= 300, len(lines)
    blocks = re.findall(r"```sh\n(.*?)```", README, re.S)
    demo, tests = blocks[0].strip(), blocks[1].strip()
    # a light install runs the demo: running needs no test tools
    assert demo.startswith("python3 -m venv .venv && .venv/bin/pip install -e . && ")
    assert "session start" in demo and "[test]" not in demo
    assert "bubblewrap" in README[:README.index(demo)]
    # works from a fresh clone, whether the demo's line ran or not
    assert tests == ("python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && "
                     ".venv/bin/python -m pytest -q")
    assert README.index("## Quickstart with a real agent") < README.index("## Steering")
    for page in ("index.md", "demo.md"):   # the site's copies of the first command
        assert demo in (REPO / "docs" / page).read_text(), page
    for verb in ("ralph init", "ralph web", "git merge ralph/", "ralph signal pause",
                 "ralph signal steer", "ralph signal abort", "ralph session answer",
                 "ralph session resume"):
        assert verb in README, verb


def test_ci_runs_exactly_the_readmes_test_command():
    ci = (REPO / ".ci/run").read_text()
    pattern = re.search(r"grep -x '([^']+)' README\.md", ci).group(1)
    matching = [line for line in README.splitlines() if re.fullmatch(pattern, line)]
    assert matching == [re.findall(r"```sh\n(.*?)```", README, re.S)[1].strip()]
    assert 'eval "$TEST_COMMAND"' in ci
    assert ci.index("rm -rf .venv") < ci.index('eval "$TEST_COMMAND"')


def test_every_page_is_in_the_nav_and_every_image_is_shown():
    config = (REPO / "mkdocs.yml").read_text()
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md"))
    for page in pages:
        assert re.search(rf":\s*{re.escape(page)}\s*$", config, re.M), page
    text = "".join((REPO / "docs" / p).read_text() for p in pages)
    for image in (REPO / "docs").glob("*.png"):
        assert f"]({image.name})" in text, image.name
    readme_links = re.findall(r"\]\((docs/[^)#]+)", README)
    assert {"docs/configuration.md", "docs/commands.md", "docs/demo.md"} <= set(readme_links)


def test_the_site_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        if os.environ.get("CI"):
            pytest.fail("mkdocs is missing: pip install -e '.[test]' brings it")
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                            "--site-dir", str(tmp_path / "site")], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stdout + built.stderr
    site = tmp_path / "site"
    configuration = (site / "configuration/index.html").read_text()
    commands = (site / "commands/index.html").read_text()
    assert "agent.max_limit_wait_seconds" in configuration
    assert "ralph session start" in commands and "--accept-config" in commands
    for page in (configuration, commands):   # the mark and the note for unbuilt readers
        assert "generated:" not in page and "unbuilt" not in page
    # SECURITY.md, RELIABILITY.md and bench/README.md are included where they live
    assert "The threat model" in (site / "security/index.html").read_text()
    assert "kill -9" in (site / "reliability/index.html").read_text()
    assert "bench/run --quick" in (site / "benchmarks/index.html").read_text()
    assert "PAUSED --&gt; COMPLETE: abort" in (site / "machine/index.html").read_text()
