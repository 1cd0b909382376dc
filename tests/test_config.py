"""ralph.yml: strict loading, every error with its path, `init` and `validate`."""
from __future__ import annotations

import re

import pytest

from support import base_env, only_session, ralph, session_dirs, work_dir, write_config
from ralph.engine import config as cfg
from ralph.session_store import BadInput


def test_init_template_is_every_default(workspace):
    r = ralph(workspace, "init")
    assert r.returncode == 0, r.stderr
    text = (workspace / "ralph.yml").read_text()
    assert cfg.parse(text, "ralph.yml") == cfg.Config()
    # a comment for every key
    keys = [line for line in text.splitlines() if line.strip() and not line.strip().startswith("#")
            and line.rstrip().endswith(tuple("0123456789l]}eto")) and ":" in line]
    assert keys and text.count("#") >= len(keys) - 6
    r = ralph(workspace, "init")
    assert r.returncode == 2 and "--force" in r.stderr
    assert ralph(workspace, "init", "--force").returncode == 0


@pytest.mark.parametrize("config, path", [
    ({"event_loop": {"max_iterations": "many"}}, "$.event_loop.max_iterations"),
    ({"event_loop": {"max_iterations": 0}}, "$.event_loop.max_iterations"),
    ({"RObot": {"timeout_seconds": "soon"}}, "$.RObot.timeout_seconds"),
    ({"RObot": {"on_timeout": "panic"}}, "$.RObot.on_timeout"),
    ({"agent": {"backend": "skynet"}}, "$.agent.backend"),
    ({"agent": {"backend": "command"}}, "$.agent.command"),
    ({"agnet": {}}, "$"),
    ({"roles": {"executor": {"agent": {"timeout": 3}}}}, "$.roles.executor.agent"),
    ({"knowledge": {"approval": True}}, "$.knowledge.approval"),
    ({"fallback": {"risk_threshold": 3}}, "$.fallback.risk_threshold"),
])
def test_bad_config_names_file_and_path(workspace, config, path):
    write_config(workspace, config)
    for args in (["validate"], ["session", "start", "x"]):
        r = ralph(workspace, *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
        assert "ralph.yml" in r.stderr and f"{path}:" in r.stderr, r.stderr
    # nothing created on bad input
    assert not (workspace / ".ralph-sessions").exists() and not session_dirs(workspace)


def test_validate_prints_every_error(workspace):
    write_config(workspace, {"event_loop": {"max_iterations": "x", "cooldown_delay_seconds": []},
                             "RObot": {"on_timeout": "panic"}})
    r = ralph(workspace, "validate")
    assert r.returncode == 2
    paths = {re.search(r"\$[\w.]*", line)[0] for line in r.stderr.splitlines()}
    assert paths == {"$.event_loop.max_iterations", "$.event_loop.cooldown_delay_seconds",
                     "$.RObot.on_timeout"}


def test_not_yaml_is_one_line(workspace):
    (workspace / "ralph.yml").write_text("agent: [unclosed\n")
    r = ralph(workspace, "validate")
    assert r.returncode == 2 and "not valid YAML" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_duplicate_key_is_one_line_with_its_path(workspace):
    """PyYAML keeps the last of two equal keys: `backend: claude` would have won unseen
    over the `backend: command` above it."""
    (workspace / "ralph.yml").write_text(
        "agent:\n  backend: command\n  command: [x]\n  backend: claude\n")
    for args in (["validate"], ["session", "start", "x"]):
        r = ralph(workspace, *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)
        assert r.stderr.splitlines() == [
            "ralph: error: ralph.yml: $.agent: duplicate key backend (line 4)"], r.stderr
    assert not (workspace / ".ralph-sessions").exists()


def test_role_override_merges_over_agent():
    config = cfg.parse("agent: {timeout_seconds: 10}\n"
                       "roles: {executor: {agent: {backend: command, command: [echo]}}}\n", "x")
    executor = config.agent_for("executor")
    assert executor.backend is cfg.Backend.COMMAND and executor.timeout_seconds == 10
    assert config.agent_for("planner").backend is cfg.Backend.DEMO


def test_telegram_without_chats_is_an_error():
    from ralph.engine.cli.common import channel_errors
    with pytest.raises(BadInput, match=r"\$\.RObot\.telegram\.allowed_chat_ids"):
        cfg.parse("RObot: {enabled: true, telegram: {bot_token: 'x'}}\n", "ralph.yml",
                  channels=channel_errors)


def test_session_snapshot_keeps_no_token(workspace):
    write_config(workspace, {"RObot": {"telegram": {"bot_token": "SECRET-MARKER-123"}}})
    r = ralph(workspace, "session", "start", "obj", "--id", "s1",
              env=None)
    assert r.returncode == 0, r.stderr
    sd = only_session(workspace)
    assert "bot_token" in (sd / "config.yaml").read_text()   # the snapshot, less the token
    for area in (sd, work_dir(sd)):   # the control plane and the agents' work area
        files = [path for path in area.rglob("*") if path.is_file()]
        assert files, area
        for path in files:
            assert b"SECRET-MARKER-123" not in path.read_bytes(), path


@pytest.mark.parametrize("robot, path", [
    ({"enabled": True}, "$.RObot.telegram.bot_token"),
    ({"enabled": True, "telegram": {"bot_token": "123:abc"}}, "$.RObot.telegram.allowed_chat_ids"),
    ({"enabled": True, "telegram": {"allowed_chat_ids": [1]}}, "$.RObot.telegram.bot_token"),
])
def test_validate_and_start_refuse_the_same_telegram_config(workspace, robot, path):
    """Issue 13, item 8: one check for both, its line naming the file."""
    write_config(workspace, {"RObot": robot})
    for args in (["validate"], ["session", "start", "x"]):
        r = ralph(workspace, *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"ralph: error: ralph.yml: {path}: "), \
            (args, lines)
    assert not (workspace / ".ralph-sessions").exists() and not session_dirs(workspace)
    if path.endswith("bot_token"):   # the environment's token counts for both
        env = base_env(RALPH_TELEGRAM_BOT_TOKEN="123:abc")
        r = ralph(workspace, "validate", env=env)
        assert ("allowed_chat_ids" in r.stderr) != (r.returncode == 0), r.stderr


def test_validate_reports_every_kind_of_error_in_one_pass(workspace):
    """Issue 13, item 11: types, unknown keys and ranges together, one line each."""
    write_config(workspace, {"event_loop": {"max_iterations": -3, "max_iteration": 2,
                                            "max_runtime_seconds": "soon"},
                             "fallback": {"confidence_threshold": 7},
                             "agent": {"timeout_seconds": 0}})
    for args in (["validate"], ["session", "start", "x"]):
        r = ralph(workspace, *args)
        assert r.returncode == 2
        lines = r.stderr.strip().splitlines()
        assert all(line.startswith("ralph: error: ralph.yml: $") for line in lines), lines
        found = sorted(re.search(r"\$[\w.]*", line)[0] for line in lines)
        assert found == ["$.agent.timeout_seconds", "$.event_loop", "$.event_loop.max_iterations",
                         "$.event_loop.max_runtime_seconds", "$.fallback.confidence_threshold"], \
            lines


def test_a_role_inheriting_a_bad_agent_value_is_not_another_error(workspace):
    """Issue 13, item 11: `agent.timeout_seconds: 0` is one mistake, one line (it was six,
    one per role); a role's own wrong value is its own line."""
    write_config(workspace, {"agent": {"timeout_seconds": 0, "backend": "command"},
                             "roles": {"reviewer": {"agent": {"timeout_seconds": -1}}}})
    r = ralph(workspace, "validate")
    assert r.returncode == 2
    assert sorted(r.stderr.strip().splitlines()) == [
        "ralph: error: ralph.yml: $.agent.command: expected a non-empty argv list for "
        "backend: command",
        "ralph: error: ralph.yml: $.agent.timeout_seconds: expected a positive number, got 0.0",
        "ralph: error: ralph.yml: $.roles.reviewer.agent.timeout_seconds: expected a positive "
        "number, got -1.0"]


def test_unknown_keys_get_a_did_you_mean_and_yaml_booleans_a_hint(workspace):
    """Issue 13, item 11."""
    (workspace / "ralph.yml").write_text(
        "event_loop: {max_iteration: 3}\nknowlege: {}\n"
        "RObot: {on_timeout: off}\nagent: {command: [run, yes]}\n")
    r = ralph(workspace, "validate")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert "ralph: error: ralph.yml: $.event_loop: unknown key max_iteration " \
           "(did you mean max_iterations?)" in lines, lines
    assert "ralph: error: ralph.yml: $: unknown key knowlege (did you mean knowledge?)" in lines
    hinted = [line for line in lines if "quote" in line]
    assert [re.search(r"\$[\w.\[\]0-9]*", line)[0] for line in hinted] == [
        "$.RObot.on_timeout", "$.agent.command[1]"], lines
    assert all("yes/no/on/off" in line for line in hinted)
    assert len(lines) == 4
