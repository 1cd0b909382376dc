"""The machine as an SVG ralph draws itself, for the web page and for `ralph diagram
--format svg` where Graphviz is not installed: no Graphviz, no network.

Its edges come from the table (engine/machine/table.py); where each is drawn is placed
here, by hand, for these six states, so that the picture fits a page's column (810 units
wide) with its labels clear of each other and of the boxes. A transition that leaves
every active state (pause, abort) or returns to the one the session paused in (resume)
is one edge from or to the frame around the active states. A row of the table with no
place here raises KeyError: a new transition is placed before it is drawn.

With a session: its current state red, the states it has been in blue, each edge it
took blue and bold with how many times ("plan_ready ×2"). The shapes carry classes
(`node`, `current`, `visited`, `edge`, `taken`) and each node a <title> with its state.
"""
from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from ralph.session_store import State

from .diagram import VISITED, visited_states
from .machine import ACTIVE, TRANSITIONS

TOP, WIDTH, HEIGHT = 30, 810, 390   # the viewBox: what is drawn lies within
FRAME = "ACTIVE"                       # an edge's end at the frame of the active states
FRAME_BOX = (15, 40, 780, 245)         # x, y, width, height
BOX_HEIGHT = 44
STATE_FONT, EDGE_FONT = 14, 13         # units; the page keeps a unit at least 0.93 px
# each state's box: centre x, centre y, width
BOXES = {
    State.PLANNING: (100, 110, 130),
    State.EXECUTING_BATCH: (375, 110, 180),
    State.REVIEWING_BATCH: (675, 110, 180),
    State.KNOWLEDGE_APPROVAL: (675, 230, 200),
    State.PAUSED: (375, 350, 130),
    State.COMPLETE: (700, 350, 140),
}
# each edge, (from, trigger, to): the points of its line, and its label (x, y, anchor)
EDGES = {
    ("PLANNING", "plan_ready", "EXECUTING_BATCH"): ([(165, 104), (285, 104)], (225, 97, "middle")),
    ("EXECUTING_BATCH", "batch_done", "REVIEWING_BATCH"):
        ([(465, 102), (585, 102)], (525, 95, "middle")),
    ("REVIEWING_BATCH", "next_batch", "EXECUTING_BATCH"):
        ([(585, 122), (465, 122)], (525, 143, "middle")),
    ("REVIEWING_BATCH", "iteration_reviewed", "KNOWLEDGE_APPROVAL"):
        ([(675, 132), (675, 208)], (665, 175, "end")),
    ("REVIEWING_BATCH", "next_iteration", "PLANNING"):
        ([(675, 88), (675, 62), (100, 62), (100, 88)], (388, 56, "middle")),
    ("KNOWLEDGE_APPROVAL", "next_iteration", "PLANNING"):
        ([(575, 230), (120, 230), (120, 132)], (350, 223, "middle")),
    ("PLANNING", "objective_met", "COMPLETE"):
        ([(60, 132), (60, 405), (700, 405), (700, 372)], (190, 399, "middle")),
    (FRAME, "pause", "PAUSED"): ([(355, 285), (355, 328)], (347, 311, "end")),
    ("PAUSED", "resume", FRAME): ([(395, 328), (395, 285)], (403, 311, "start")),
    (FRAME, "abort", "COMPLETE"): ([(720, 285), (720, 328)], (728, 311, "start")),
    ("PAUSED", "abort", "COMPLETE"): ([(440, 350), (630, 350)], (535, 343, "middle")),
}
# what a grouped edge's label says of where it goes
SUFFIX = {("PAUSED", "resume", FRAME): ": back where it paused"}
ACTIVE_NAMES = frozenset(s.value for s in ACTIVE)


def edges() -> list[tuple[str, str, str]]:
    """The table's transitions as drawn: one edge per (from, trigger, to), the active
    states taken together where a trigger leaves (or returns to) each of them."""
    found: dict[tuple[str, str, str], None] = {}
    for t in TRANSITIONS:
        sources = {s.value for s in t.sources}
        if t.only_if_paused_from is not None:   # resume: back to the state it paused in
            found[(sources.pop(), t.trigger.value, FRAME)] = None
            continue
        if ACTIVE_NAMES <= sources:
            found[(FRAME, t.trigger.value, t.dest.value)] = None
            sources -= ACTIVE_NAMES
        for s in sorted(sources):
            found[(s, t.trigger.value, t.dest.value)] = None
    return list(found)


def _edge_of(step: tuple[str, str, str], drawn: set) -> tuple[str, str, str] | None:
    src, trigger, dst = step
    for edge in ((src, trigger, dst), (FRAME, trigger, dst), (src, trigger, FRAME)):
        ends_ok = (edge[0] != FRAME or src in ACTIVE_NAMES) and \
                  (edge[2] != FRAME or dst in ACTIVE_NAMES)
        if edge in drawn and ends_ok:
            return edge
    return None   # not a transition of the table: not drawn


def svg(current: State | None = None, steps: list[tuple[str, str, str]] | None = None) -> str:
    """The machine, with a session on it: where it stands (`current`), and `steps`, the
    (from, trigger, to) it took; with neither, the machine alone."""
    drawn = edges()
    counts: dict[tuple[str, str, str], int] = {}
    for step in steps or []:
        edge = _edge_of(step, set(drawn))
        if edge is not None:
            counts[edge] = counts.get(edge, 0) + 1
    visited = visited_states(steps) if steps is not None else set()
    x, y, w, h = FRAME_BOX
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 {TOP} {WIDTH} {HEIGHT}" '
             f'class="machine" role="img" aria-label="the session machine'
             f'{", in " + current.value if current else ""}" '
             f'font-family="system-ui, DejaVu Sans, Helvetica, sans-serif">',
             f'<rect class="frame" x="{x}" y="{y}" width="{w}" height="{h}" rx="12" '
             f'fill="#f7f9fc" stroke="#b9c3cf" stroke-dasharray="6 4"/>',
             f'<text class="frame-label" x="{x + 10}" y="{y + 16}" font-size="{EDGE_FONT}" '
             f'fill="#5f6b7a">active</text>']
    parts += [_edge(edge, counts.get(edge, 0)) for edge in drawn]
    parts += [_node(state, current, visited) for state in State]
    parts.append("</svg>")
    return "\n".join(parts)


def _node(state: State, current: State | None, visited: set[str]) -> str:
    cx, cy, w = BOXES[state]
    x, y, r = cx - w / 2, cy - BOX_HEIGHT / 2, 8
    if state is current:
        kind, fill, stroke, width = "node current", "darksalmon", "red", 3
    elif state.value in visited:
        kind, fill, stroke, width = "node visited", VISITED, "blue", 1.5
    else:
        kind, fill, stroke, width = "node", "white", "#9aa5b1", 1
    outline = (f"M{x + r},{y} H{x + w - r} Q{x + w},{y} {x + w},{y + r} V{y + BOX_HEIGHT - r} "
               f"Q{x + w},{y + BOX_HEIGHT} {x + w - r},{y + BOX_HEIGHT} H{x + r} "
               f"Q{x},{y + BOX_HEIGHT} {x},{y + BOX_HEIGHT - r} V{y + r} Q{x},{y} {x + r},{y} Z")
    bold = ' font-weight="700"' if state is current else ""
    return (f'<g class={quoteattr(kind)}><title>{state.value}</title>'
            f'<path d="{outline}" fill="{fill}" stroke="{stroke}" stroke-width="{width}"/>'
            f'<text x="{cx}" y="{cy + 5}" text-anchor="middle" font-size="{STATE_FONT}"'
            f'{bold} fill="#1d2430">{state.value}</text></g>')


def _edge(edge: tuple[str, str, str], count: int) -> str:
    points, (lx, ly, anchor) = EDGES[edge]
    color, width = ("blue", 2.5) if count else ("#8a96a3", 1.2)
    label = edge[1] + SUFFIX.get(edge, "") + (f" ×{count}" if count else "")
    (x1, y1), (x2, y2) = points[-2], points[-1]
    # the arrowhead: a triangle at the last point, along the last segment
    length = max(abs(x2 - x1), abs(y2 - y1)) or 1
    dx, dy = (x2 - x1) / length, (y2 - y1) / length
    head = [(x2, y2), (x2 - 9 * dx - 4.5 * dy, y2 - 9 * dy + 4.5 * dx),
            (x2 - 9 * dx + 4.5 * dy, y2 - 9 * dy - 4.5 * dx)]
    line = " ".join(f"{px},{py}" for px, py in points[:-1]) + \
        f" {x2 - 8 * dx},{y2 - 8 * dy}"
    title = f"{edge[0]} → {edge[2]}: {edge[1]}"
    weight = ' font-weight="600"' if count else ""
    return (f'<g class="{"edge taken" if count else "edge"}"><title>{escape(title)}</title>'
            f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="{width}"/>'
            f'<polygon points="{" ".join(f"{px:g},{py:g}" for px, py in head)}" '
            f'fill="{color}"/>'
            f'<text x="{lx}" y="{ly}" text-anchor="{anchor}" font-size="{EDGE_FONT}" '
            f'fill="{"blue" if count else "#4b5663"}"{weight}>{escape(label)}</text></g>')
