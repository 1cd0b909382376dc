"""Issue 33, item 6: a newcomer's first hour with `ralph web`, in a real browser (Debian's
chromium driven by Playwright, as tests/test_web_browser.py does) against a real server.

- "Where it stands" is a picture with or without Graphviz: the machine fitted to its box,
  every label at least 12 px as rendered, no label over another or over a state.
- The list and a session's page fit 900 px (nothing runs off the right edge); a row is
  named by its objective, its id the small print.
- Knowledge Approve/Skip show only while the staged knowledge waits, never beside a
  question; the header and the diagram come from one snapshot, so they never disagree.
- Without a token the page says so once, in plain words, and shows no live badge.

Every test keeps its screenshots: in $RALPH_TEST_SCREENSHOTS, else in web-page/ under
the run's pytest temporary directory; their paths are listed at the end of the run.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from _web import WebServer, ask, now, stop_engine_of
from conftest import ARTIFACTS
from support import EVIDENCE, base_env, session_dir, spawn, wait_for, write_config, write_scenario
import test_web_browser

browser = test_web_browser.browser   # Debian's chromium under Playwright (a fixture)


@pytest.fixture
def shot(request, tmp_path_factory):
    root = os.environ.get("RALPH_TEST_SCREENSHOTS")
    folder = Path(root) if root else tmp_path_factory.getbasetemp() / "web-page"
    folder.mkdir(parents=True, exist_ok=True)

    def take(page, name: str, full_page: bool = True) -> Path:
        path = folder / f"{name}.png"
        page.evaluate("document.getElementById('notice').hidden = true")
        page.screenshot(path=str(path), full_page=full_page)
        request.config.stash[ARTIFACTS].append(str(path))
        return path
    return take


def make_session(ws: Path, sid: str, objective: str):
    from ralph import session_store
    return session_store.create(str(ws), objective, now=now(), session_id=sid)


# The drawing as the browser renders it: each label's size in px (its font size times
# the scale the SVG is shown at), the boxes of labels and states, and whether it fits.
MEASURE = """d => {
  const svg = d.querySelector('svg');
  if (!svg) return { svg: false, text: d.innerText };
  const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
  const box = (el) => { const r = el.getBoundingClientRect();
                        return [r.left, r.top, r.right, r.bottom]; };
  return {
    svg: true, scale,
    frame: [d.clientWidth, d.scrollWidth, d.clientHeight, d.scrollHeight],
    drawing: box(svg), shown: box(d),
    labels: [...svg.querySelectorAll('text')].map((t) => ({
      text: t.textContent, px: parseFloat(getComputedStyle(t).fontSize) * scale,
      box: box(t), node: !!t.closest('g.node') })),
    nodes: [...svg.querySelectorAll('g.node')].map((g) => ({
      state: g.querySelector('title').textContent, box: box(g.querySelector('path, polygon')),
      current: g.classList.contains('current') })),
  };
}"""


def _overlap(a, b) -> bool:
    return a[0] < b[2] - 0.5 and b[0] < a[2] - 0.5 and a[1] < b[3] - 0.5 and b[1] < a[3] - 0.5


def assert_readable_picture(m: dict, current: str) -> None:
    assert m["svg"], f"not a picture: {m['text'][:300]!r}"
    assert "stateDiagram" not in m.get("text", "")
    small = [(t["text"], round(t["px"], 1)) for t in m["labels"] if t["px"] < 12]
    assert not small, f"labels under 12 px: {small}"
    client_w, scroll_w, client_h, scroll_h = m["frame"]
    assert scroll_w <= client_w and scroll_h <= client_h + 1, m["frame"]   # fitted: no scroll
    left, top, right, bottom = m["shown"]
    d = m["drawing"]
    assert left - 1 <= d[0] and d[2] <= right + 1, (m["drawing"], m["shown"])
    labels = m["labels"]
    for i, a in enumerate(labels):   # no text run into another ("EXECUTING_BATCHplan_ready")
        for b in labels[i + 1:]:
            assert not _overlap(a["box"], b["box"]), (a["text"], b["text"])
        if not a["node"]:   # an edge's label over no state
            for n in m["nodes"]:
                assert not _overlap(a["box"], n["box"]), (a["text"], n["state"])
    for n in m["nodes"]:   # each state's name inside its box
        [name] = [t for t in labels if t["node"] and t["text"] == n["state"]]
        b, t = n["box"], name["box"]
        assert b[0] <= t[0] and t[2] <= b[2] and b[1] <= t[1] and t[3] <= b[3], n["state"]
    assert [n["state"] for n in m["nodes"] if n["current"]] == [current]


@pytest.mark.slow
@pytest.mark.parametrize("graphviz", [True, False], ids=["with-graphviz", "without-graphviz"])
def test_where_it_stands_is_a_readable_picture_fitted_to_its_box(workspace, tmp_path, browser,
                                                                  shot, graphviz):
    session = make_session(workspace, "wide", "Add a read-through cache to the catalogue")
    ask(session, "Which cache should it use?", options=["redis", "memcached"])
    env = base_env()
    if not graphviz:   # no `dot` to be found: the page draws the same picture
        empty = tmp_path / "bin"
        empty.mkdir()
        env["PATH"] = str(empty)
    server = WebServer(workspace, env=env)
    try:
        for width in (1280, 900):
            page = browser.new_page(viewport={"width": width, "height": 900})
            errors = []   # a script's error, or a CSP refusal (said on the console)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(server.page("/s/wide"))
            page.locator("#diagram .drawing svg, #diagram .drawing pre").first.wait_for(
                timeout=30000)
            page.locator("#diagram").scroll_into_view_if_needed()
            name = "graphviz" if graphviz else "no-graphviz"
            shot(page, f"diagram-{name}-{width}", full_page=False)
            drawing = page.locator("#diagram .drawing")
            assert_readable_picture(drawing.evaluate(MEASURE), "PLANNING")
            assert errors == []
            page.close()
    finally:
        server.stop(expect=None)


def test_every_transition_of_the_table_is_on_the_picture_and_nothing_else():
    """The picture is drawn from the table: each (from, trigger, to) of every row is an
    edge of it (or of the frame of the active states); a step that is no transition of
    the table (a forged record) counts on no edge."""
    from ralph.engine import diagram_svg
    from ralph.engine.machine import TRANSITIONS
    from ralph.session_store import State
    drawn = set(diagram_svg.edges())
    assert drawn == set(diagram_svg.EDGES)   # each placed, nothing placed in vain
    for t in TRANSITIONS:
        for source in t.sources:
            step = (source.value, t.trigger.value, t.dest.value)
            assert diagram_svg._edge_of(step, drawn) is not None, step
    picture = diagram_svg.svg(State.PAUSED, [("PLANNING", "plan_ready", "EXECUTING_BATCH"),
                                             ("EXECUTING_BATCH", "pause", "PAUSED"),
                                             ("PLANNING", "<b>forged</b>", "COMPLETE")])
    assert "plan_ready ×1" in picture and "pause ×1" in picture
    assert "forged" not in picture and picture.count("×") == 2


def fleet(ws: Path) -> None:
    """Sessions as a newcomer's list has them: long objectives, timestamp ids, questions,
    a paused one with its reason."""
    a = make_session(ws, "20261128-231502-4f2a", "Write the HTTP API of the order service, "
                     "with pagination on every listing endpoint and an OpenAPI document")
    ask(a, "Which database should the service use?", options=["sqlite", "postgres"],
        minutes_ago=12)
    ask(a, "Ship the API behind a feature flag?", minutes_ago=2)
    make_session(ws, "20261128-232210-9c01", "Add a read-through cache to the catalogue")
    b = make_session(ws, "20261128-233045-77de", "Document the public API of "
                     "billing-service-internal-reconciliation-adapter-v2 for the partners")
    ask(b, "Publish the draft to the partner portal now, or wait for legal review?",
        minutes_ago=4)


def no_horizontal_overflow(page) -> dict:
    return page.evaluate("""() => ({ scroll: document.scrollingElement.scrollWidth,
                                     inner: innerWidth })""")


@pytest.mark.slow
def test_the_list_and_a_session_fit_900_px_and_rows_are_named_by_objective(workspace, browser,
                                                                           shot):
    fleet(workspace)
    server = WebServer(workspace)
    page = browser.new_page(viewport={"width": 900, "height": 700})
    try:
        page.goto(server.page())
        page.wait_for_function("() => document.querySelectorAll('table.sessions tbody tr')"
                               ".length === 3")
        shot(page, "list-900", full_page=False)
        sizes = no_horizontal_overflow(page)
        assert sizes["scroll"] <= sizes["inner"], sizes
        row = page.locator('tr[data-session="20261128-232210-9c01"]')
        link = row.locator("td").first.locator("a")
        assert link.text_content() == "Add a read-through cache to the catalogue"
        assert row.locator(".sid").text_content() == "20261128-232210-9c01"
        # the objective is the row's main label: larger than the id, and not grey
        weight = link.evaluate("a => [parseFloat(getComputedStyle(a).fontSize), "
                               "getComputedStyle(a).fontWeight]")
        sid_size = row.locator(".sid").evaluate("e => parseFloat(getComputedStyle(e).fontSize)")
        assert weight[0] > sid_size and int(weight[1]) >= 600, (weight, sid_size)

        link.click()
        page.wait_for_url("**/s/20261128-232210-9c01")
        page.locator("#diagram .drawing svg").wait_for(timeout=30000)
        shot(page, "session-900")
        sizes = no_horizontal_overflow(page)
        assert sizes["scroll"] <= sizes["inner"], sizes
        page.goto(server.page("/s/20261128-231502-4f2a"))   # two questions waiting
        page.locator("article.question").nth(1).wait_for(timeout=30000)
        page.locator("#diagram .drawing svg").wait_for(timeout=30000)
        shot(page, "session-with-questions-900")
        sizes = no_horizontal_overflow(page)
        assert sizes["scroll"] <= sizes["inner"], sizes
    finally:
        server.stop(expect=None)


@pytest.mark.slow
def test_without_a_token_the_page_says_so_once_and_plainly(workspace, browser, shot):
    make_session(workspace, "s1", "An objective")
    server = WebServer(workspace)
    try:
        for path in ("/", "/s/s1"):
            page = browser.new_page(viewport={"width": 1280, "height": 600})
            page.goto(f"{server.url}{path}")
            page.locator("#no-token").wait_for()
            page.wait_for_timeout(1500)   # the wait is the point: nothing comes back to say more
            shot(page, f"no-token{path.replace('/', '-')}", full_page=False)
            assert page.locator("#live").is_hidden()   # no "connecting…" that never connects
            text = page.evaluate("document.body.innerText")
            assert "`" not in text, text
            assert text.count("token") >= 1 and page.locator("#no-token").count() == 1
            assert page.locator(".error, #notice:not([hidden])").count() == 0, text
            page.close()
        # a token the server does not hold: said once, in words, and no live badge
        page = browser.new_page(viewport={"width": 1280, "height": 600})
        page.goto(f"{server.url}/#token=not-the-servers")
        page.locator("p.error").wait_for()
        page.wait_for_timeout(1500)
        assert page.locator("#live").is_hidden()
        assert page.locator("p.error").count() == 1
        assert "`" not in page.evaluate("document.body.innerText")
        page.close()
    finally:
        server.stop(expect=None)


# Records every render in which the header's state and the diagram's disagree.
DISAGREEMENTS = """
window.disagreements = [];
window.renders = 0;
document.addEventListener("DOMContentLoaded", () => {
  new MutationObserver(() => {
    const header = document.getElementById("state")?.textContent;
    const drawn = document.querySelector("#diagram g.node.current title")?.textContent;
    if (header && drawn) {
      window.renders += 1;
      if (header !== drawn) window.disagreements.push(`${header} / ${drawn}`);
    }
  }).observe(document.getElementById("main"), { childList: true, subtree: true,
                                                characterData: true, attributes: true });
});
"""
SID = "knowing"
KNOWLEDGE_RUN = [
    {"role": "planner", "iteration": 1, "emit": [{"topic": "plan.ready", "json": {
        "tasks": [{"id": "db", "title": "Pick the database", "batch": 1}]}}]},
    {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE", "payload": "nothing left"}]},
    {"role": "executor", "ask": {"question": "Which database should the service use?",
                                 "options": ["sqlite", "postgres"], "timeout": 600},
     "emit": [{"topic": "build.done", "payload": EVIDENCE + "; db: {answer}"}]},
    {"role": "reviewer", "emit": [{"topic": "review.done", "payload": "tests: pass, build: pass"}]},
    {"role": "librarian", "iteration": 1,
     "write_iteration": {"knowledge/notes.md": "# notes\n\npostgres it is\n"},
     "emit": [{"topic": "knowledge.staged", "payload": "notes.md"}]},
]


@pytest.mark.slow
def test_knowledge_buttons_show_only_when_it_waits_and_the_header_agrees_with_the_diagram(
        workspace, browser, shot):
    scenario = write_scenario(workspace, KNOWLEDGE_RUN)
    write_config(workspace, {"agent": {"backend": "demo", "script": str(scenario)},
                             "fallback": {"enabled": False},
                             "knowledge": {"approval": "required", "timeout_seconds": 600}})
    env = base_env(RALPH_DEMO_SLEEP_SCALE=0)
    server = WebServer(workspace, env=env)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.add_init_script(DISAGREEMENTS)
    engine = spawn(workspace, "session", "start", "Pick a database and write it down",
                   "--id", SID, env=env)
    try:
        wait_for(lambda: (session_dir(workspace, SID) / "metadata.yaml").exists())
        page.goto(server.page(f"/s/{SID}"))
        question = page.locator("article.question", has_text="Which database")
        question.wait_for(timeout=30000)
        # a question waits: the controls beside it are the session's, no knowledge decision
        assert page.locator("#knowledge-decision").is_hidden()
        assert page.locator("button[data-signal=approve]").is_hidden()
        assert page.locator("button[data-signal=skip]").is_hidden()
        shot(page, "question-no-knowledge-buttons")

        question.locator("button.option", has_text="postgres").click()
        decision = page.locator("#knowledge-decision")
        decision.wait_for(state="visible", timeout=60000)
        page.locator("#state", has_text="KNOWLEDGE_APPROVAL").wait_for()
        shot(page, "knowledge-waits")
        decision.locator("button[data-signal=approve]").click()
        page.locator("#summary .badge.completed").wait_for(timeout=60000)
        assert decision.is_hidden()
        assert engine.wait(timeout=60) == 0
        assert page.evaluate("window.renders") >= 3
        assert page.evaluate("window.disagreements") == []
        assert (workspace / ".docs").exists() or any(workspace.rglob("notes.md"))
    finally:
        if engine.poll() is None:
            engine.terminate()
            engine.wait(timeout=30)
        stop_engine_of(session_dir(workspace, SID))
        server.stop(expect=None)


@pytest.mark.slow
def test_a_failed_run_is_said_on_the_page_as_text(workspace, browser, shot):
    """Issue 33, item 3, on the page: the last failed run's exit code, its last stderr line
    (the agent's words, shown as text: a tag in them is not markup) and its log."""
    write_config(workspace, {
        "agent": {"backend": "command", "command": [
            "sh", "-c", "printf 'fatal: <b>overloaded</b>\\n' >&2; exit 7"]},
        "fallback": {"error_count_threshold": 2}, "RObot": {"timeout_seconds": 1}})
    engine = spawn(workspace, "session", "start", "fail on purpose", "--id", "f1",
                   env=base_env(RALPH_DEMO_SLEEP_SCALE="0"))
    assert engine.wait(timeout=120) == 3, engine.stderr.read()   # paused after the retries
    server = WebServer(workspace)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.goto(server.page("/s/f1"))
        said = page.locator("#last-failure")
        said.wait_for(timeout=30000)
        shot(page, "last-failure")
        text = said.text_content()
        assert "the planner (iteration 1) exited with code 7" in text, text
        assert "its last stderr line: fatal: <b>overloaded</b>" in text, text
        assert ".stderr" in text.split("its log: ")[1], text
        assert said.locator("b").count() == 0
    finally:
        server.stop(expect=None)
