"""Diagnostics: what the engine decided and why, one JSONL record each, in the session's
control plane (`Session.append_diagnostics`), when `diagnostics: true` or
RALPH_DIAGNOSTICS=1; and `ralph session diagnose`'s summary of them.

Records (each with `at` and `kind`):
  transition  from, to, trigger, why, hooks (the hook runs since the previous transition)
  gate        topic, role, task, read (what the gate read, cut), decided (passed |
              rewritten | warning | ignored), to, reason
  assessment  confidence, factors, triggers, fallback_type, mode
  run         role, task, agent, argv (the configured command, secrets masked), duration,
              exit_code, timed_out, input_tokens, output_tokens, cost_usd
  hook        the `hook.ran` record
"""
from __future__ import annotations

import os

from .safe_text import excerpt, printable
from .secrets import secret

READ_CHARS = 300   # what of a gated payload a gate record keeps
SLOWEST = 5


def enabled(config) -> bool:
    return bool(config.diagnostics) or os.environ.get("RALPH_DIAGNOSTICS") == "1"


class Diagnostics:
    def __init__(self, session, clock):
        self.session = session
        self.clock = clock
        self._hooks: list[dict] = []
        self._assessed = None

    def note(self, kind: str, **fields) -> None:
        self.session.append_diagnostics([{"at": self.clock.now().isoformat(), "kind": kind,
                                          **fields}])

    def hook(self, record: dict) -> None:
        self._hooks.append(record)
        self.note("hook", **record)

    def transition(self, lt) -> None:
        hooks, self._hooks = self._hooks, []
        self.note("transition", n=lt.n, **{"from": lt.source.value}, to=lt.dest.value,
                  trigger=lt.trigger, why=lt.reason,
                  hooks=[{k: h[k] for k in ("hook", "exit_code", "failure")} for h in hooks])

    def gates(self, role: str, task: str | None, judged: list[dict], gated: tuple) -> None:
        for e in judged:
            gate = e.get("gate") or {}
            original = gate.get("rewritten_from", e["topic"])
            if not gate and original not in gated:
                continue   # no gate looked at it
            decided = ("rewritten" if "rewritten_from" in gate else "warning" if "warning"
                       in gate else "ignored" if "ignored" in gate else "passed")
            self.note("gate", topic=original, role=role, task=task,
                      read=excerpt(e.get("payload"), READ_CHARS),
                      decided=decided, to=e["topic"],
                      reason=gate.get("reason") or gate.get("warning") or gate.get("ignored"))

    def assessment(self, a) -> None:
        if a is None or a is self._assessed:
            return
        self._assessed = a
        self.note("assessment", confidence=a.confidence, factors=a.factors,
                  triggers=a.triggers, fallback_type=a.fallback_type, mode=a.mode)

    def run(self, result, agent) -> None:
        o, report = result.outcome, result.outcome.report
        self.note("run", role=result.role, task=result.task.id if result.task else None,
                  agent=agent.backend.value, argv=masked(agent.command),
                  duration=round(o.duration, 3), exit_code=o.exit_code, timed_out=o.timed_out,
                  input_tokens=report.input_tokens, output_tokens=report.output_tokens,
                  cost_usd=report.cost_usd)


def masked(argv: list[str]) -> list[str]:
    """`argv` with the value of any of ralph's secrets (or of the agents' API keys) that
    appears in it replaced by `***`."""
    values = [v for k, v in os.environ.items() if v and len(v) >= 4 and (
        secret(k) or k.endswith(("_API_KEY", "_TOKEN")))]
    out = []
    for arg in argv:
        for value in values:
            arg = arg.replace(value, "***")
        out.append(arg)
    return out


def summary(session_id: str, records: list[dict]) -> str:
    """`ralph session diagnose`: the path taken, the slowest runs, the gates that refused,
    the hooks that failed, the lowest confidence assessed. Every value shown escaped."""
    def text(value) -> str:
        return printable(str(value))

    if not records:
        return (f"session {session_id}: no diagnostics (run it with RALPH_DIAGNOSTICS=1 or "
                f"`diagnostics: true` in ralph.yml)")
    by = {}
    for r in records:
        by.setdefault(r.get("kind"), []).append(r)
    lines = [f"session {session_id}: {len(records)} diagnostics records"]
    moves = by.get("transition", [])
    lines.append(f"path ({len(moves)} transitions):")
    lines += [f"  {i}. {text(t.get('from'))} -> {text(t.get('to'))} ({text(t.get('trigger'))}"
              f"{': ' + text(t['why']) if t.get('why') else ''})"
              for i, t in enumerate(moves, 1)]
    runs = sorted(by.get("run", []), key=lambda r: -(r.get("duration") or 0))
    total = sum(r.get("duration") or 0 for r in runs)
    lines.append(f"agent runs: {len(runs)}, {total:.1f}s in all; slowest:")
    lines += [f"  {r.get('duration', 0):.2f}s {text(r.get('role'))}"
              f"{' ' + text(r['task']) if r.get('task') else ''} (exit {text(r.get('exit_code'))}"
              f"{', timed out' if r.get('timed_out') else ''}, tokens "
              f"{r.get('input_tokens', 0)}/{r.get('output_tokens', 0)})"
              for r in runs[:SLOWEST]]
    refused = [g for g in by.get("gate", []) if g.get("decided") != "passed"]
    gates = by.get("gate", [])
    lines.append(f"gates: {len(gates)} verdicts, {len(refused)} failing:")
    lines += [f"  {text(g.get('topic'))} -> {text(g.get('to'))} ({text(g.get('role'))}"
              f"{' ' + text(g['task']) if g.get('task') else ''}): {text(g.get('reason'))}"
              for g in refused]
    hooks = by.get("hook", [])
    failed = [h for h in hooks if h.get("failure")]
    lines.append(f"hooks: {len(hooks)} runs, {len(failed)} failed:")
    lines += [f"  {text(h.get('failure'))} (on_error: {text(h.get('on_error'))})" for h in failed]
    assessed = [a for a in by.get("assessment", []) if isinstance(a.get("confidence"),
                                                                   (int, float))]
    if assessed:
        low = min(assessed, key=lambda a: a["confidence"])
        lines.append(f"assessments: {len(assessed)}; lowest confidence {low['confidence']:.2f} "
                     f"at {text(low.get('at'))} (triggers: "
                     f"{text(', '.join(map(str, low.get('triggers') or [])) or 'none')})")
    return "\n".join(lines)
