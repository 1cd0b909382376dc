"""Approvals (`agent.approve`) with the real Claude Code, Codex and Gemini CLIs, driven by
the scripted model server: the model calls a shell command a rule names, the CLI's own
pre-tool hook (installed by ralph for the run) asks ralph, a durable question of kind
`approval` appears, and the human's answer decides whether the CLI runs the command. A
denial's reason reaches the model's next request; an unanswered one is denied at its
deadline. Every decision is on the bus.
"""
from __future__ import annotations

import pytest

from support import events, finish, question_files, wait_for, write_config
from support.agents import CLIS, Rig
from support.model_server import Brain, Say, Shell, Turn

pytestmark = pytest.mark.slow

RULES = [{"rule": "Bash(echo deployed*)", "timeout_seconds": 300},
         {"rule": "Bash(echo released*)", "timeout_seconds": 3}]


class Deployer(Brain):
    """An executor that deploys (denied, with a reason), deploys again (allowed), releases
    (nobody answers), then reports."""

    def executor(self, turn: Turn):
        steps = [Shell("echo deployed-once > deployed.txt"),
                 Shell("cd . && echo deployed-twice > deployed.txt"),
                 Shell("echo released > released.txt"),
                 Shell(f'{turn.ralph} emit build.done "{self.EVIDENCE}"')]
        return steps[turn.step] if turn.step < len(steps) else Say("Deployed.")


def pending_approval(sd, seen: set) -> dict:
    """The next approval question asked (not one of `seen`)."""
    found = {}

    def asked():
        for q in question_files(sd) if (sd / "questions").exists() else []:
            if q["kind"] == "approval" and q["id"] not in seen:
                found.update(q)
                return True
        return False
    wait_for(asked, timeout=120)
    seen.add(found["id"])
    return found


@pytest.mark.parametrize("cli", CLIS)
def test_a_rule_asks_a_human_who_denies_allows_or_lets_it_time_out(cli, tmp_path):
    r = Rig(cli, tmp_path, Deployer())
    try:
        config = write_config(tmp_path, {"agent": {"approve": RULES}}, name="ralph.yml")
        engine = r.start("-c", str(config))
        sd = r.session_dir()
        seen: set = set()

        first = pending_approval(sd, seen)
        assert "echo deployed-once > deployed.txt" in first["text"], first
        assert first["options"] == ["allow", "deny"] and first["default"] == "deny"
        denied = r.ralph("session", "answer", "real", "deny: not on a Friday")
        assert denied.returncode == 0 and "it denies the call (the agent is told: not on a " \
            "Friday)" in denied.stdout, denied

        second = pending_approval(sd, seen)
        assert "deployed-twice" in second["text"], second
        # the denied command never ran, and the model was told why
        assert not (r.ws / "deployed.txt").exists()
        assert any("not on a Friday" in body for body in r.server.bodies())
        allowed = r.ralph("session", "answer", "real", "allow")
        assert allowed.returncode == 0 and "decided now" in allowed.stdout, allowed

        third = pending_approval(sd, seen)   # released: nobody answers in its 3 s
        assert "echo released" in third["text"], third
        code, out, err = finish(engine, timeout=240)
        assert code == 0, out + err
        assert (r.ws / "deployed.txt").read_text().strip() == "deployed-twice"
        assert not (r.ws / "released.txt").exists()

        bus = events(sd)
        asked = [e for e in bus if e["topic"] == "approval.asked"]
        decided = {e["payload"]["id"]: e["payload"] for e in bus
                   if e["topic"] == "approval.decided"}
        assert [a["payload"]["id"] for a in asked] == [first["id"], second["id"], third["id"]]
        assert all(a["source"] == "executor" and a["payload"]["tool"] == "Bash" for a in asked)
        assert decided[first["id"]]["decision"] == "deny"
        assert decided[first["id"]]["reason"] == "Denied by a human (cli): not on a Friday"
        assert decided[second["id"]] == {"id": second["id"], "decision": "allow",
                                         "by": "human", "channel": "cli"}
        assert decided[third["id"]]["decision"] == "deny"
        assert decided[third["id"]]["by"] == "timeout"
        # the executor's other commands asked nobody
        assert len(asked) == 3
    finally:
        r.close()
