"""Task markers and attempt outcomes are data (the iteration's metadata); progress.md is
their view, rendered on every change and never read back: edits to it steer nothing, a
resume renders it again, and an iteration an older ralph kept in markdown is seeded
from it once."""
from __future__ import annotations

import json

import pytest

from ralph.session_store import Attempt, BadInput, PlannedTask, load, progress
from support import progress_markers, progress_view_markers, session_dir
from support.engines import engine_for
from support.recording import SUCCEED, RecordingAgent

TASKS = [PlannedTask("t1", "first"), PlannedTask("t2", "second")]


def planned(session, clock):
    it = session.iteration(1)
    meta = it.start(clock.now())
    it.write_plan(TASKS)
    meta.tasks_defined = list(TASKS)
    meta.planning_completed_at = clock.now()
    it.save(meta)
    return it, meta


def attempt(task: str, outcome: str) -> Attempt:
    return Attempt(task, "a title", outcome, 0, False, 1.0, [("build.blocked", "no tests")], "")


def test_a_marker_is_data_and_progress_md_its_view(session, clock):
    it, meta = planned(session, clock)
    it.set_markers(meta, ["t1"], progress.DONE)
    it.set_markers(meta, ["t2"], progress.FAILED, "it broke\non two lines")
    again = session.iteration(1).load()
    assert [(t.id, t.marker, t.note) for t in again.task_lines()] == [
        ("t1", "x", None), ("t2", "F", "it broke\non two lines")]
    assert it.progress_text() == (
        "# Progress — iteration 1\n\n"
        "Markers: [ ] todo, [/] in progress, [x] done, [F] failed, [C] cancelled\n\n"
        "- [x] t1: first (batch 1)\n"
        "- [F] t2: second (batch 1) — it broke on two lines\n")


def test_an_edit_of_progress_md_changes_no_marker_and_settling_renders_it_again(session, clock):
    it, meta = planned(session, clock)
    it.set_markers(meta, ["t1"], progress.IN_PROGRESS)
    view = it.progress_text()
    edited = view.replace("[/] t1", "[x] t1").replace("[ ] t2", "[x] t2")
    (session_dir(session.workspace, session.id) / "iterations/1/progress.md").write_text(edited)
    fresh = session.iteration(1)
    meta = fresh.load()
    assert [t.marker for t in meta.task_lines()] == ["/", " "]
    fresh.settle(meta)
    assert fresh.progress_text() == view


def test_attempt_outcomes_are_data_and_reports_their_details(session, clock):
    it, meta = planned(session, clock)
    first = it.record_attempt(meta, attempt("t1", "blocked"))
    second = it.record_attempt(meta, attempt("t1", "empty"))
    assert (first.endswith("t1-report.md"), second.endswith("t1-report-r2.md")) == (True, True)
    again = session.iteration(1).load()
    assert again.task_progress("t1").attempts == ["blocked", "empty"]
    assert it.latest_report(again, "t1") == second and it.latest_report(again, "t2") is None
    # a report rewritten by anyone changes no outcome
    with open(second, "w") as f:
        f.write("- outcome: done\n")
    assert session.iteration(1).load().task_progress("t1").attempts == ["blocked", "empty"]


def test_a_marker_outside_the_five_is_refused_on_load(session, clock):
    it, meta = planned(session, clock)
    it.set_markers(meta, ["t1"], progress.DONE)
    path = session_dir(session.workspace, session.id) / "iterations/1/metadata.yaml"
    data = json.loads(path.read_text())
    data["progress"]["t1"]["marker"] = "?"
    path.write_text(json.dumps(data))
    with pytest.raises(BadInput):
        session.iteration(1).load()


def paused_at_t2(session, clock):
    """An engine run until it pauses in t2's run (t1 done): its agent."""
    def pause(_inv):
        session.signals.drop("pause", "hold on", now=clock.now())
    agent = RecordingAgent([
        {"role": "planner", "emit": [("plan.ready", {"tasks": [
            {"id": "t1", "title": "first"}, {"id": "t2", "title": "second"}]})]},
        {"role": "executor", "task": "t2", "during": pause}], otherwise=SUCCEED)
    assert engine_for(session, agent, clock=clock).run() == 3
    sd = session_dir(session.workspace, session.id)
    assert progress_markers(sd) == progress_view_markers(sd) == {"1": {"t1": "x", "t2": "/"}}
    return agent


def resumed(session, clock) -> RecordingAgent:
    agent = RecordingAgent(otherwise=SUCCEED)
    again = load(session.workspace, session.id)
    assert engine_for(again, agent, clock=clock).run(resume=True) == 0
    return agent


def test_markers_survive_a_resume_and_edits_of_the_view_steer_nothing(session, clock):
    paused_at_t2(session, clock)
    sd = session_dir(session.workspace, session.id)
    view = sd / "iterations/1/progress.md"
    # the view says t1 is to do and t2 done: the engine goes by its data
    view.write_text(view.read_text().replace("[x] t1", "[ ] t1").replace("[/] t2", "[x] t2"))
    agent = resumed(session, clock)
    assert [(p.role, p.task) for p in agent.runs("executor")] == [("executor", "t2")]
    assert progress_markers(sd) == progress_view_markers(sd) == {"1": {"t1": "x", "t2": "x"}}


def test_a_session_of_an_older_ralph_is_seeded_from_its_markdown_once(session, clock):
    """An iteration whose metadata has no `progress` (markers were progress.md's lines,
    outcomes its reports'): the resume takes them from there, writes them as data, and
    reads the markdown no more."""
    paused_at_t2(session, clock)
    sd = session_dir(session.workspace, session.id)
    path = sd / "iterations/1/metadata.yaml"
    data = json.loads(path.read_text())
    assert data.pop("progress")["t1"]["attempts"] == ["done"]
    path.write_text(json.dumps(data))
    seeded = session.iteration(1).load()
    assert [(t.marker, seeded.task_progress(t.id).attempts) for t in seeded.task_lines()] == [
        ("x", ["done"]), ("/", [])]
    # a read (`ralph session status`) seeds in memory only; the engine writes it
    assert "progress" not in json.loads(path.read_text())
    agent = resumed(session, clock)
    assert [(p.role, p.task) for p in agent.runs("executor")] == [("executor", "t2")]
    assert json.loads(path.read_text())["progress"]["t1"] == {
        "marker": "x", "note": None, "attempts": ["done"]}
    assert progress_markers(sd) == progress_view_markers(sd) == {"1": {"t1": "x", "t2": "x"}}
