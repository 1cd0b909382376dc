"""ralph.yml: strict loading, every error with its path, `init` and `validate`."""
from __future__ import annotations

import re

import pytest

from conftest import ralph, write_config
from engine import config as cfg
from session_store import BadInput


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
    assert not (workspace / ".ralph-sessions").exists()  # nothing created on bad input


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


def test_role_override_merges_over_agent():
    config = cfg.parse("agent: {timeout_seconds: 10}\n"
                       "roles: {executor: {agent: {backend: command, command: [echo]}}}\n", "x")
    executor = config.agent_for("executor")
    assert executor.backend is cfg.Backend.COMMAND and executor.timeout_seconds == 10
    assert config.agent_for("planner").backend is cfg.Backend.DEMO


def test_telegram_without_chats_is_an_error():
    with pytest.raises(BadInput, match=r"\$\.RObot\.telegram\.allowed_chat_ids"):
        cfg.parse("RObot: {enabled: true, telegram: {bot_token: 'x'}}\n", "ralph.yml")


def test_session_snapshot_keeps_no_token(workspace):
    write_config(workspace, {"RObot": {"telegram": {"bot_token": "SECRET-MARKER-123"}}})
    r = ralph(workspace, "session", "start", "obj", "--id", "s1",
              env=None)
    assert r.returncode == 0, r.stderr
    for path in (workspace / ".ralph-sessions").rglob("*"):
        if path.is_file():
            assert b"SECRET-MARKER-123" not in path.read_bytes(), path
