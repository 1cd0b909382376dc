"""Test support, imported by the tests as `support` (tests/ is on sys.path):

    cli         the real `ralph` as a subprocess: ralph, spawn, finish, base_env, wait_for,
                signal_file (the file `ralph signal` dropped)
    disk        what a session left on disk: its control plane (session_dir, only_session)
                and its work area (work_dir, run_logs, prompts); events, metadata,
                progress markers, questions, signal files
    scenarios   demo scenarios and configs, the outcomes that pass the gates (EVIDENCE),
                and `start`: a session started on a scenario
    scripted    script_agent: a real agent program running the test's code inside a run,
                held there while the test acts from outside (held, recorded)
    sessions    a session created in-process (fixtures workspace, clock, session)
    clock       FrozenClock: the engine's clock on freezegun's time, moved by the test
    engines     an Engine in-process over a session, on the frozen clock (imports the engine)
    recording   RecordingAgent: the one in-process agent, scripted steps, invocations kept
    agents, model_server   the real agent CLIs against a scripted model server
    users       another local user (setpriv/runuser), for what other users can reach

The light modules are re-exported here; engines, recording and users are imported by name.
"""
from .cli import FAST, RALPH, REPO, base_env, finish, ralph, signal_file, spawn, wait_for
from .clock import FrozenClock
from .disk import (append_raw, events, metadata, only_session, progress_markers,
                   progress_view_markers, prompts, question_files, run_logs, session_dir, session_dirs, signal_files,
                   taken_marks, topics, transitions, work_dir)
from .scenarios import (DONE, EVIDENCE, QUALITY, REVIEW_OK, demo_config, plan, start,
                        write_config, write_scenario)
from .scripted import held, recorded, script_agent
from .sessions import new_session

__all__ = ["FAST", "RALPH", "REPO", "base_env", "finish", "ralph", "signal_file", "spawn",
           "wait_for",
           "FrozenClock", "append_raw", "events", "metadata", "only_session", "progress_markers",
           "progress_view_markers", "prompts", "question_files", "run_logs", "session_dir", "session_dirs",
           "signal_files", "taken_marks", "topics", "transitions", "work_dir", "DONE",
           "EVIDENCE", "QUALITY", "REVIEW_OK", "demo_config", "plan", "start", "write_config",
           "write_scenario", "held", "recorded", "script_agent", "new_session"]
