"""`ralph diagram`: the machine drawn from its one definition (engine/machine.py) with
transitions' diagram support. With a session (from its session.transition records), the
picture reads at a glance: a title (the session, where it stands, why it paused), its
current state red, the states it has been in filled, each trigger it took an edge of its
own with its count and the steps at which it was taken, the rest grey, a legend, and (in
dot, svg and png) the path as a numbered list beside the machine.
"""
from __future__ import annotations

import json
import re
import shutil
from collections import Counter

from ralph.session_store import BadInput, State, load

from .machine import rows_for_transitions
from .safe_text import printable

TITLE = "ralph session machine"
VISITED = "lightskyblue"   # the fill of a state the session has been in
LEGEND = ("red: where it stands · blue: visited · trigger ×N (steps i, j): taken N times, "
          "at those steps of the path")
MAX_NUMBERS = 4            # step numbers shown on one edge
MAX_LISTED = 24            # steps listed beside the picture
FORMATS = ("mermaid", "dot", "svg", "png")
INSTALL_HINT = ("png needs Graphviz's `dot` on the PATH (Debian/Ubuntu: "
                "apt-get install graphviz; macOS: brew install graphviz); mermaid and dot work "
                "without it")


class _Model:
    pass


def _graph(engine: str, current: State | None):
    from transitions.extensions import GraphMachine
    model = _Model()
    GraphMachine(model=model, states=[s.value for s in State], transitions=rows_for_transitions(),
                 initial=(current or State.PLANNING).value, auto_transitions=False,
                 graph_engine=engine, show_conditions=False, title=TITLE)
    return model.get_graph()


class SessionPath:
    """What a session's picture shows besides the machine: the session, where it stands
    in words, why it paused, and every transition it took, in order."""

    def __init__(self, session_id: str, standing: str, reason: str | None,
                 steps: list[tuple[str, str, str]]):
        self.session_id, self.standing, self.reason = session_id, standing, reason
        self.steps = steps                      # (from, trigger, to), first to last
        self.counts = Counter(steps)

    def title(self) -> str:
        return f"session {self.session_id}: {self.standing}" \
            + (f" — {_clip(self.reason)}" if self.reason else "")

    def visited(self) -> set[str]:
        return visited_states(self.steps)

    def numbers(self, step: tuple[str, str, str]) -> str:
        """When the path took one (from, trigger, to): "step 1", "steps 2, 4", "steps 3, 5,
        … 41"."""
        found = [i for i, s in enumerate(self.steps, 1) if s == step]
        shown = found if len(found) <= MAX_NUMBERS else found[:MAX_NUMBERS - 1] + ["…", found[-1]]
        return f"step{'s' if len(found) > 1 else ''} " + ", ".join(str(n) for n in shown)


def visited_states(steps: list[tuple[str, str, str]]) -> set[str]:
    return {s for step in steps for s in (step[0], step[2])} | {State.PLANNING.value}


def transition_steps(records) -> list[tuple[str, str, str]]:
    """The (from, trigger, to) of the engine's session.transition records, in order."""
    return [(str(r["payload"].get("from")), str(r["payload"].get("trigger")),
             str(r["payload"].get("to")))
            for r in records if r.get("topic") == "session.transition"
            and r.get("source") == "engine" and isinstance(r.get("payload"), dict)]


def session_path(workspace: str, session_id: str) -> tuple[State, SessionPath]:
    """The session's current state, and the path it took (from its session.transition
    records)."""
    from .views import standing
    session = load(workspace, session_id)
    steps = transition_steps(session.events_after(0))
    m = session.metadata
    o = m.orchestrator
    words = standing({"status": m.status.value, "state": o.state.value,
                      "previous_state": o.previous_state.value if o.previous_state else None,
                      "running": session.running_pid() is not None})
    reason = o.pause_reason if o.state is State.PAUSED else None
    return o.state, SessionPath(session.id, words, reason, steps)


def _split(triggers: str, src: str, dst: str, path: SessionPath) -> list[tuple[str, int]]:
    """A shared edge label ("objective_met | abort") as edges of their own: each taken
    trigger alone with its count, the untaken ones together (count 0)."""
    names = [t.strip() for t in triggers.split("|")]
    taken = [(t, path.counts[(src, t, dst)]) for t in names if path.counts[(src, t, dst)]]
    rest = [t for t in names if not path.counts[(src, t, dst)]]
    return taken + ([(" | ".join(rest), 0)] if rest else [])


def mermaid(current: State | None = None, path: SessionPath | None = None) -> str:
    source = _graph("mermaid", current).draw(None)
    if current is None:  # the plain machine: no state is "active"
        source = source.replace("Class PLANNING s_active", "Class PLANNING s_default")
    if path is None:
        return source

    def edge(m):
        src, dst = m["src"], m["dst"]
        return "\n".join(
            f"{m['indent']}{src} --> {dst}: {trigger}"
            + (f" ×{n} ({path.numbers((src, trigger, dst))})" if n else "")
            for trigger, n in _split(m["label"], src, dst, path))
    source = re.sub(r"(?m)^(?P<indent>\s*)(?P<src>\w+) --> (?P<dst>\w+): (?P<label>.+)$",
                    edge, source)
    for state in path.visited() - {current.value}:
        source = source.replace(f"Class {state} s_default", f"Class {state} s_previous")
    source = source.replace("classDef s_previous color:blue,fill:azure",
                            f"classDef s_previous color:black,fill:{VISITED}")
    source = source.replace(f"---\n{TITLE}\n---", f"---\ntitle: {json.dumps(path.title())}\n---")
    return source.rstrip("\n") + f"\n  note right of {current.value}: {LEGEND}\n"


def dot(current: State | None = None, path: SessionPath | None = None) -> str:
    if path is not None:
        return _session_dot(current, path)
    source = _graph("graphviz", current).source
    if current is None:
        source = source.replace(
            'PLANNING [label="PLANNING\\l" color=red fillcolor=darksalmon peripheries=2]',
            'PLANNING [label="PLANNING\\l"]')
    return source


def _session_dot(current: State, path: SessionPath) -> str:
    """The machine with a session on it: a title, the current state red, visited states
    filled, each taken trigger its own bold edge with its count and step numbers, the
    untaken ones grey; a legend and the path as a numbered list beside it."""
    title = f"<b>session {_html(path.session_id)}</b>: {_html(path.standing)}" + (
        f'<br align="left"/><font point-size="12">paused: {_html(_clip(path.reason))}</font>'
        if path.reason else "") + '<br align="left"/>'
    lines = [f'digraph "{TITLE}" {{',
             f"\tgraph [label=<{title}> labelloc=t labeljust=l fontname=Helvetica "
             f"fontsize=16 rankdir=LR nodesep=0.4 ranksep=0.9 pad=0.3]",
             '\tnode [shape=rectangle style="rounded,filled" fontname=Helvetica fontsize=13 '
             'color=gray60 fillcolor=white fontcolor=gray35]',
             "\tedge [color=gray70 fontcolor=gray50 fontname=Helvetica fontsize=10 "
             "arrowsize=0.7]"]
    visited = path.visited()
    for state in State:
        s = state.value
        if state is current:
            style = "color=red fillcolor=darksalmon peripheries=2 fontcolor=black penwidth=2"
        elif s in visited:
            style = f'color=blue fillcolor="{VISITED}" fontcolor=black penwidth=1.5'
        else:
            style = ""
        lines.append(f'\t{s} [label="{s}\\l"{" " + style if style else ""}]')
    for row in rows_for_transitions():
        for src in row["source"]:
            dst = row["dest"]
            for trigger, n in _split(row["trigger"], src, dst, path):
                if n:
                    lines.append(f'\t{src} -> {dst} [label="{trigger} ×{n}\\n'
                                 f'{path.numbers((src, trigger, dst))}" color=blue '
                                 f'fontcolor=blue fontsize=12 penwidth=2.5 weight=2]')
                else:
                    lines.append(f'\t{src} -> {dst} [label="{trigger}"]')
    lines += _beside(path)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _beside(path: SessionPath) -> list[str]:
    """The legend, and the path as a numbered list (its start and end when long)."""
    cell = '<tr><td align="left" bgcolor="{}" color="{}">{}</td></tr>'
    rows = [cell.format("darksalmon", "red", "where it stands"),
            cell.format(VISITED, "blue", "visited"),
            cell.format("white", "gray60", "<font color=\"gray35\">not visited</font>"),
            '<tr><td align="left" border="0"><font color="blue"><b>→ trigger ×N</b>'
            '</font>: taken N times, at those steps of the path</td></tr>',
            '<tr><td align="left" border="0"><font color="gray50">→ trigger</font>: not taken'
            '</td></tr>']
    numbered = list(enumerate(path.steps, 1))
    if len(numbered) > MAX_LISTED:
        numbered = numbered[:3] + [None] + numbered[-(MAX_LISTED - 4):]
    listed = []
    for item in numbered:
        if item is None:
            listed.append(f'<tr><td colspan="2" align="left" border="0">… '
                          f'{len(path.steps) - MAX_LISTED + 1} more</td></tr>')
            continue
        n, (src, trigger, dst) = item
        listed.append(f'<tr><td align="right" border="0">{n}.</td><td align="left" border="0">'
                      f'{_html(src)} → {_html(dst)} <font color="blue">{_html(trigger)}</font>'
                      f'</td></tr>')
    box = ('\t{} [shape=plaintext fontsize=11 fontcolor=black label=<<table border="0" '
           'cellspacing="{}"><tr><td colspan="2" align="left" border="0"><b>{}</b></td></tr>'
           '{}</table>>]')
    return [box.format("legend", 3, "legend", "".join(rows)),
            box.format("steps", 1, "path", "".join(listed)
                       or '<tr><td border="0">(no transition yet)</td></tr>'),
            "\t{rank=sink; legend; steps}"]


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, limit: int = 120) -> str:
    """One line of at most `limit` characters, its control characters escaped."""
    text = printable(" ".join(text.split()))
    return text if len(text) <= limit else text[:limit - 1] + "…"


def graphviz_installed() -> bool:
    return shutil.which("dot") is not None


def render(fmt: str, current: State | None = None, path: SessionPath | None = None) -> bytes:
    if fmt == "mermaid":
        return mermaid(current, path).encode()
    source = dot(current, path)
    if fmt == "dot":
        return source.encode()
    if not graphviz_installed():
        raise BadInput(f"--format {fmt}: {INSTALL_HINT}")
    import graphviz
    return graphviz.Source(source).pipe(format=fmt)
