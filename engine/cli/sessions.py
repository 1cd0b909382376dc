"""`ralph session ...`: start, resume, and look at sessions; answer their questions."""
from __future__ import annotations

import os
import sys

from .common import (EXIT_OK, bad, channel_errors, check_channels, config_file, human_only,
                     session_id_of, workspace)


def cmd_start(args) -> int:
    from ralph.session_store import ROLES, Limits, check_id, create, dump_yaml, new_session_id

    from .. import config as cfg
    from ..config_started import check_approvals_as_started
    config_path = config_file(args)
    # every error, one a line, as `validate` (RObot.enabled needs a token and a chat)
    config = cfg.load(config_path, all_errors=True, channels=channel_errors)
    # the file's own rules and agents (--agent is the human's, from the command line)
    check_approvals_as_started(config, workspace(args), config_path)
    if args.agent:
        config.agent = _choose_agent(config.agent, args.agent)
    objective = args.objective
    if args.prompt_file:
        try:
            with open(args.prompt_file, encoding="utf-8") as f:
                objective = f.read()
        except OSError as e:
            raise bad(f"{args.prompt_file}: cannot read the objective ({e.strerror})") from None
    if not objective or not objective.strip():
        raise bad("an objective is required: ralph session start \"OBJECTIVE\" or -p FILE")
    loop = config.event_loop
    limits = Limits(max_iterations=loop.max_iterations,
                    max_runtime_seconds=loop.max_runtime_seconds, max_cost_usd=loop.max_cost_usd)
    _apply_limit_flags(limits, args)
    cfg.check_paths(config, workspace(args), config_path)
    _check_pinned(config, config_path, args)   # before any of its programs is looked for
    _preflight(config)
    from ..running.sandbox import check_config
    check_config(config, workspace(args), config_path)
    unasked = [r for r in ROLES if config.agent.approve and config.role_enabled(r)
               and config.agent_for(r).backend not in cfg.HOOKED]
    if unasked:
        print(f"ralph: note: agent.approve: the {', '.join(unasked)} run an agent with no "
              f"pre-tool hook ({config.agent_for(unasked[0]).backend.value}): their tool "
              f"calls are not asked about", file=sys.stderr, flush=True)
    notice = _demo_mode(config, config_path)
    from ..clock import SystemClock
    now = SystemClock().now()
    session_id = check_id(args.id) if args.id else new_session_id(now)
    repo = _repository(config, workspace(args))
    if config.event_loop.parallel > 1 and repo is None:
        raise bad(f"{config_path or 'the config'}: $.event_loop.parallel: "
                  f"{config.event_loop.parallel} tasks at once need a git workspace with "
                  f"git.commits on (each task runs in a git worktree of its own); `git init` "
                  f"and commit, or set event_loop.parallel: 1")
    sandbox, confinement = _sandbox(config, args, workspace(args), config_path)
    git = None
    if repo is not None:   # before anything is made: a dirty tree is refused
        _git(repo.check_can_start, session_id)
        git = _git(repo.begin, session_id)   # the engine makes the branch, switches to it
    session = create(workspace(args), objective.strip(), now=now,
                     session_id=session_id, limits=limits,
                     config_path=os.path.abspath(config_path) if config_path else None,
                     config_snapshot=dump_yaml(cfg.to_data(cfg.without_secrets(config))),
                     git=git)
    if notice:   # once the session exists: a refused start stays one line
        print(notice, file=sys.stderr, flush=True)
    print(f"session {session.id} created: its work area is {session.work_dir}, its "
          f"control files (out of agents' reach) are in {session.dir}", flush=True)
    args.engine_session = session.id   # ^C says how to resume it
    return _run(session, config, sandbox, confinement, resume=False)


def _check_pinned(config, config_path: str | None, args) -> None:
    """A config in the workspace (agents can rewrite it) that runs other programs than the
    workspace's newest session started with (config_started.programs: the agents'
    commands, the hooks) is refused in one line, unless the human adopts it:
    --accept-config, or a yes at a terminal. Adopted, it is said so."""
    from ..config_started import unpinned
    found = unpinned(config, workspace(args), config_path, human_backend=bool(args.agent))
    if found is None:
        return
    at_terminal = sys.stdin.isatty() and sys.stderr.isatty()
    if args.accept_config or at_terminal:
        human_only("session start --accept-config")   # an agent's yes is no human's
    if not (args.accept_config or (at_terminal and _said_yes(found, config_path))):
        others = [path for path, _, _ in found.changes[1:]]
        raise bad(f"{config_path}: what it runs changed since session {found.session_id} "
                  f"started: {found.lines()[0]}"
                  + (f" (also {', '.join(others)})" if others else "")
                  + "; agents can rewrite this file: check it, then adopt it with "
                    "`ralph session start --accept-config ...` (or give a config outside the "
                    "workspace with -c)")
    print(f"ralph: adopted {config_path} as it is now, unlike session {found.session_id}: "
          f"{found.paths()}", file=sys.stderr, flush=True)


def _said_yes(found, config_path: str) -> bool:
    """The changes shown at the terminal, one a line, and the human's yes or no."""
    print(f"ralph: {config_path} runs other programs than session {found.session_id} "
          f"started with, and agents can rewrite it:", file=sys.stderr)
    for line in found.lines():
        print(f"  {line}", file=sys.stderr)
    print("adopt it for this session? [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _repository(config, ws: str):
    """The workspace's repository when the session is to commit its tasks (git.commits, in
    a git work tree that does not ignore it), else None."""
    from ..workspace_git import WorkspaceGit, in_work_tree
    if not (config.git.commits and in_work_tree(ws)):
        return None
    repo = WorkspaceGit(ws)
    return None if _git(repo.ignored) else repo


def _git(verb, *args):
    """A git verb, its failure one line (exit 2)."""
    from ..workspace_git import GitError
    try:
        return verb(*args)
    except GitError as e:
        raise bad(str(e)) from None


def _session_branch(args):
    """(session, its workspace's repository, its GitInfo) for `diff` and `clean`; refused
    in one line where the session has no branch."""
    from ralph.session_store import load

    from ..workspace_git import WorkspaceGit
    ws = workspace(args)
    session = load(ws, session_id_of(args, newest_if_none_open=True))
    info = session.metadata.git
    if info is None:
        raise bad(f"session {session.id} has no branch: its workspace is not a git work tree, "
                  f"or it ran with git.commits: false")
    return session, WorkspaceGit(ws), info


def cmd_diff(args) -> int:
    from ralph.session_store import check_id

    from ..workspace_git import commit_record
    session, repo, info = _session_branch(args)
    if not _git(repo.has_branch, info):
        raise bad(f"session {session.id}: its branch {info.branch} is gone")
    commits = None
    if args.task is not None:
        commits = _git(repo.task_commits, info, session.id, check_id(args.task, "task id"))
        if not commits:
            if commit_record(session, lambda p: p.get("task") == args.task) is None:
                raise bad(f"session {session.id} has no commit of a task {args.task!r}")
            print(f"task {args.task} of session {session.id} changed no file", flush=True)
            return EXIT_OK
    sys.stdout.write(_git(repo.diff, info, commits))
    return EXIT_OK


def cmd_clean(args) -> int:
    human_only("session clean")
    session, repo, info = _session_branch(args)
    if session.running_pid() is not None:
        raise bad(f"session {session.id} is running: stop it (ralph signal pause --session {session.id}) before "
                  f"removing its branch")
    from ralph.session_store import worktree_root
    lanes = _git(repo.clear_lanes, session.id, worktree_root(session.workspace, session.id))
    said = [f"removed {lanes} worktree(s) and lane branch(es)"] if lanes else []
    if _git(repo.has_branch, info):
        said.append(_git(repo.remove_branch, info))
    print(f"session {session.id}: {'; '.join(said) if said else 'nothing to clean'}"
          + ("" if said else f" ({info.branch} is gone)"), flush=True)
    return EXIT_OK


def cmd_diagnose(args) -> int:
    from ralph.session_store import load

    from ..diagnostics import summary
    ws = workspace(args)
    session = load(ws, session_id_of(args, newest_if_none_open=True))
    print(summary(session.id, session.diagnostics()), flush=True)
    return EXIT_OK


def _demo_mode(config, config_path: str | None) -> str | None:
    """When the demo agent plays (no model is called): what to say first, so it is never
    taken for a real run; and, for the built-in scenario, its promoted knowledge goes under
    .ralph-demo/ with its files (the config is changed so), not into the project's docs."""
    from ralph.session_store import ROLES

    from ..config import Backend
    from ..demo_agent import DEMO_DIR
    roles = [r for r in ROLES if config.role_enabled(r)]
    demo = [r for r in roles if config.agent_for(r).backend is Backend.DEMO]
    if not demo:
        return None
    if all(config.agent_for(r).script is None for r in roles) and len(demo) == len(roles) \
            and config.knowledge.docs_dir == ".docs":
        config.knowledge.docs_dir = f"{DEMO_DIR}/docs"
    who = "" if len(demo) == len(roles) else f" for the {', '.join(demo)}"
    how = (f"set agent.backend in {config_path}" if config_path else "`ralph init`") \
        + " to choose yours"
    return f"demo agent{who}: no model is called; {how} (its files go to {DEMO_DIR}/)"


def cmd_resume(args) -> int:
    from ralph.session_store import BadInput, Status, load

    from .. import config as cfg
    human_only("session resume")
    ws = workspace(args)
    session = load(ws, session_id_of(args))
    args.engine_session = session.id   # ^C says how to resume it
    status = session.metadata.status
    if status in (Status.COMPLETED, Status.ABORTED):
        if session.has_summary():
            raise BadInput(f"session {session.id} is {status.value}: there is nothing to resume")
        # a crash came between the final transition and the summary: finish the closing
        # work (the transition's record, the summary) and exit as the session ended
        config = cfg.load_session_config(session)
        return _run(session, config, *_sandbox(config, args, ws, session.metadata.config_path),
                    resume=True)
    from ..views import higher_limit_flag, limit_still_reached, resume_command
    if held := limit_still_reached(session.metadata, max_iterations=args.max_iterations,
                                   max_runtime=args.max_runtime, max_cost=args.max_cost):
        raise bad(f"session {session.id} paused at its limit and would pause again at once "
                  f"({held[1]}): resume it with a higher limit: "
                  f"{resume_command(session.id, session.workspace)}{higher_limit_flag(held)}")
    config = cfg.load_session_config(session)
    check_channels(config, session.metadata.config_path or session.config_snapshot()[1])
    cfg.check_paths(config, ws, session.metadata.config_path)
    _preflight(config)
    sandbox, confinement = _sandbox(config, args, ws, session.metadata.config_path)
    _apply_limit_flags(session.metadata.limits, args)
    return _run(session, config, sandbox, confinement, resume=True, message=args.message,
                now=args.now)


def _run(session, config, sandbox, confinement: str, *, resume: bool,
         message: str | None = None, now: bool = False) -> int:
    from ..agents import containment
    from ..driver import Engine
    # this process is the engine: orphans of its agents' runs are its to find and stop
    # (a library or a test running an Engine in-process keeps its own process as it is)
    containment.adopt_orphans()
    return Engine(session, config, sandbox=sandbox, confinement=confinement).run(
        resume=resume, message=message, now=now)


def _sandbox(config, args, ws: str, config_path: str | None):
    """(the sandbox this engine's runs and hooks get, the line that says so once the
    engine holds its session); None when the human said `none` (the flag, or a config
    outside the workspace). A sandbox that cannot be set up refuses the session (exit 2)."""
    from ralph.session_store import state_root

    from .. import config as cfg
    from ..running import sandbox as sb
    mode = args.sandbox or config.agent.sandbox.value
    if mode == "none":
        why = "--sandbox none" if args.sandbox else f"agent.sandbox: none in {config_path}"
        return None, (f"ralph: sandbox: none ({why}): agents and hooks run with your "
                      f"rights, unconfined")
    hidden = [state_root()]
    if config_path and cfg.outside_allowed(ws, config_path):
        hidden.append(config_path)   # the human's own config: its token, its choices
    try:
        found = sb.find(hidden=tuple(hidden), writable=tuple(
            os.path.expanduser(p) for p in config.agent.writable),
            network=config.agent.network is cfg.Network.OPEN)
    except sb.SandboxUnavailable as e:
        raise bad(f"agent.sandbox: enforce: {e}; or run unconfined with --sandbox none") \
            from None
    extra = f", and {', '.join(found.writable)}" if found.writable else ""
    return found, (f"ralph: sandbox: agents and hooks write only the workspace and their "
                   f"work area{extra}; ralph's control files and your secrets are out of "
                   f"their sight{'' if found.network else '; no network'}")


def _preflight(config) -> None:
    """Refuse, in one line and before any run, an agent that cannot run here (its CLI
    not installed, a flag it refuses as root) rather than four failed runs and a pause."""
    problems = preflight_problems(config)
    if problems:
        raise bad(problems[0])


def preflight_problems(config) -> list[str]:
    """Why the enabled roles' agents cannot run here, one line each (the first role on an
    agent says it)."""
    from ralph.session_store import ROLES

    from ..agents import preflight
    found: dict[str, None] = {}
    for role in ROLES:
        if config.role_enabled(role) and (problem := preflight(config.agent_for(role))):
            found.setdefault(problem if config.agent_for(role) is config.agent
                             else f"roles.{role}: {problem}")
    return list(found)


def _apply_limit_flags(limits, args) -> None:
    if args.max_iterations is not None:
        limits.max_iterations = args.max_iterations
    if args.max_runtime is not None:
        limits.max_runtime_seconds = args.max_runtime
    if args.max_cost is not None:
        limits.max_cost_usd = args.max_cost


def _choose_agent(agent, name: str):
    import attrs

    from ..agents import installed_backend
    from ..config import Backend
    if name == "auto":
        found = installed_backend()
        if found is None:
            raise bad("--agent auto: none of the agent CLIs (claude, codex, gemini, kiro, amp, "
                       "copilot, opencode) is on the PATH")
        return attrs.evolve(agent, backend=found)
    try:
        return attrs.evolve(agent, backend=Backend(name))
    except ValueError:
        raise bad(f"--agent {name}: expected auto or one of "
                   f"{', '.join(b.value for b in Backend)}") from None


def cmd_status(args) -> int:
    import json

    from ..views import session_view, status_text
    ws = workspace(args)
    view = session_view(ws, session_id_of(args, newest_if_none_open=True))
    print(json.dumps(view, indent=2) if args.json else status_text(view))
    return EXIT_OK


def cmd_list(args) -> int:
    import json

    from ..session_list import list_text, list_views
    views = list_views(workspace(args))
    print(json.dumps(views, indent=2) if args.json else list_text(views))
    return EXIT_OK


def cmd_answer(args) -> int:
    from ralph.session_store import BadInput, check_id, load

    from ..clock import SystemClock
    human_only("session answer")
    ws = workspace(args)
    session = load(ws, session_id_of(args))
    qid = args.question
    if qid is None:
        waiting = session.questions.pending()
        if len(waiting) > 1:
            raise BadInput(f"session {session.id} has several pending questions "
                           f"({', '.join(q.id for q in waiting)}); name one with --question")
        if not waiting:
            asked = session.questions.all()
            if asked and session.questions.has_answer(asked[-1].id):
                raise BadInput(f"question {asked[-1].id} of session {session.id} is already "
                               f"answered; no question is pending")
            raise BadInput(f"session {session.id} has no pending question")
        qid = waiting[0].id
    check_id(qid, "question id")
    given = session.questions.answer(qid, args.text, now=SystemClock().now(),
                                     channel="cli")
    chose = f" with option {given.text!r}" if given.text != args.text else ""
    from ..views import answer_outcome
    print(f"answered {qid}{chose}: "
          f"{answer_outcome(session, session.questions.load(qid))}")
    return EXIT_OK


def cmd_tail(args) -> int:
    from ..views import tail
    ws = workspace(args)
    return tail(ws, session_id_of(args, newest_if_none_open=True), follow=args.follow,
                count=args.lines, as_json=args.json)
