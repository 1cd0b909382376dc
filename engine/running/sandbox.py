"""The sandbox every agent run (and every lifecycle hook) runs in: ralph decides what an
agent can reach, whatever its CLI does. Linux, through bubblewrap (`bwrap`), the tool
Codex and Claude Code's sandbox runtime build on.

What a run sees (`Sandbox.wrap`):

- the system read-only (`/` bound read-only), a /dev and a /proc of its own: in a PID
  namespace of its own it sees no process but its own (not the engine's environment, not
  another run's), and it cannot signal or trace them;
- writable: its workspace (a parallel task's worktree instead), the session's work area,
  its CLI's own folders (~/.claude, ~/.codex, ...: sessions and logins it keeps), and
  the paths the human added (`agent.writable`); a private /tmp, /var/tmp, /dev/shm and
  /run (the user's sockets there, tmux's in /tmp, ssh-agent's, docker's, are not shared);
- read-only inside those: the workspace's `.git` (git is the engine's to write: a hook,
  a filter or fsmonitor planted there would run as the user) and its `ralph.yml`, and
  the run's inbox (the engine's replies, which nothing of the run may forge);
- hidden: ralph's state directory (the control plane), the config file the human gave
  with `-c`, and the secrets in `HIDDEN_IN_HOME` (ssh and cloud keys, ~/.pgpass, other
  CLIs' logins: every CLI's folder but the run's own);
- no capability (a user namespace, all capabilities dropped, so no mount can be undone),
  a session of its own (no terminal to inject keys into), and the network as the engine
  has it unless `agent.network: none` (a network namespace of its own: loopback only).

When the engine runs as root the run is mapped to uid `NESTED_UID`, so that a CLI that
sandboxes itself (Codex's own bubblewrap, Claude Code's) can make its own user namespace
inside this one.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

# secrets under the user's home no run sees (each CLI's own folder is shown to its runs)
HIDDEN_IN_HOME = (
    ".ssh", ".gnupg", ".pgpass", ".pg_service.conf", ".aws", ".azure", ".config/gcloud",
    ".kube", ".docker", ".netrc", ".git-credentials", ".config/git/credentials",
    ".config/gh", ".config/hub", ".npmrc", ".yarnrc", ".pypirc", ".cargo/credentials",
    ".cargo/credentials.toml", ".gem/credentials", ".m2/settings.xml", ".terraform.d",
    ".vault-token", ".password-store", ".local/share/keyrings", ".mozilla",
    ".config/google-chrome", ".config/chromium", ".config/ralph", ".local/state/ralph",
)
# each agent CLI's own folders (logins, sessions, settings): writable for its own runs,
# hidden from every other run
CLI_HOMES: dict[str, tuple[str, ...]] = {
    "claude": (".claude", ".claude.json", ".config/claude", ".cache/claude",
               ".local/state/claude"),
    "codex": (".codex",),
    "gemini": (".gemini",),
    "copilot": (".copilot", ".config/github-copilot"),
    "opencode": (".local/share/opencode", ".config/opencode", ".local/state/opencode"),
    "amp": (".config/amp", ".local/share/amp", ".amp"),
    "kiro": (".kiro", ".aws/amazonq", ".local/share/kiro-cli"),
}
# where a CLI is told its folder is instead (then that folder is the run's own)
CLI_HOME_VARIABLES = {"claude": "CLAUDE_CONFIG_DIR", "codex": "CODEX_HOME",
                      "gemini": "GEMINI_CLI_HOME"}
# the variables that point at what a run no longer reaches (the sockets of the user's
# agents and desktop, a runtime directory), or at a secret beside the store's password
UNSET = ("SSH_AUTH_SOCK", "SSH_AGENT_PID", "GPG_AGENT_INFO", "DBUS_SESSION_BUS_ADDRESS",
         "XDG_RUNTIME_DIR", "TMUX", "TMUX_PANE", "STY", "DISPLAY", "WAYLAND_DISPLAY",
         "XAUTHORITY", "DOCKER_HOST", "PGPASSFILE", "PGSERVICEFILE")
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/run", "/dev/shm")   # a tmpfs of the run's own each
NESTED_UID = 1000   # root's runs, inside (a CLI's own sandbox needs a user namespace)
INSTALL = "apt-get install bubblewrap (Debian, Ubuntu), dnf install bubblewrap (Fedora)"


class SandboxUnavailable(Exception):
    """The sandbox cannot be set up here: one line saying what is missing and how to get
    it (the session is refused, exit 2)."""


@dataclass(frozen=True, slots=True)
class Sandbox:
    """The confinement of one session's runs; `wrap` makes one run's command line."""
    bwrap: str
    hidden: tuple[str, ...] = ()     # beyond the home's secrets: the state dir, -c's file
    writable: tuple[str, ...] = ()   # the human's additions (agent.writable)
    network: bool = True
    home: str = field(default_factory=lambda: os.path.expanduser("~"))

    def wrap(self, argv: list[str], env: dict[str, str], *, tree: str, work_dir: str,
             cli: str | None = None, read_only: tuple[str, ...] = (),
             also_writable: tuple[str, ...] = (), chdir: str | None = None) -> list[str]:
        """`argv` run confined, in `chdir` (default `tree`, the workspace or worktree it
        works in); `read_only`: what it is shown but may not write (its session's control
        plane, the runs' channels), `also_writable`: what inside those it writes after all
        (its own outbox). `env` is changed in place (the variables the run no longer has
        any use for dropped, TMPDIR its own)."""
        own = _own_homes(cli, env, self.home)
        _make_main_home(cli, env, own)
        for name in UNSET:
            env.pop(name, None)
        env["TMPDIR"] = "/tmp"
        args = [self.bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc",
                "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session",
                "--cap-drop", "ALL"]
        if os.geteuid() == 0:
            args += ["--uid", str(NESTED_UID), "--gid", str(NESTED_UID)]
        if not self.network:
            args.append("--unshare-net")
        args += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        for private in PRIVATE_DIRS:
            if os.path.isdir(private):
                args += ["--tmpfs", private]
        for path in _needed(argv, env):   # what runs the agent, were it under a private dir
            if _under(path, PRIVATE_DIRS):
                args += ["--ro-bind", path, path]
        tree = os.path.realpath(tree)
        work = os.path.realpath(work_dir)
        if not _under(work, (tree,)):
            # a lane's worktree: the work areas' folder writable (a CLI's own sandbox makes
            # its mount points there: Codex's keeps a `.git` of every writable root)
            work = os.path.dirname(work)
        writable = _existing([tree, work, *own, *self.writable])
        # (where, its mount): made outer paths first, so that what a run is shown inside a
        # hidden directory (a lane's worktree in the state directory, a workspace the human
        # keeps under ~/.config) is bound over the hiding, never the hiding over it
        mounts = [(path, ["--bind", path, path])   # no mount point an agent's rm trips on
                  for path in _outermost(writable)]
        mounts += [(path, ["--ro-bind", path, path]) for path in _existing(
            [os.path.join(tree, ".git"), os.path.join(tree, "ralph.yml"),
             *_git_common_dir(tree)]) if path not in self.writable]
        secrets = [os.path.join(self.home, p) for p in HIDDEN_IN_HOME] + [
            os.path.join(self.home, p) for name, paths in CLI_HOMES.items() if name != cli
            for p in paths] + list(self.hidden)
        sealed = []   # hidden directories: read-only once what they show is bound in them
        for path in _existing(secrets):
            if path in own or path in writable:
                continue   # the run's own CLI folder; or a path the human made writable
            if os.path.isdir(path):
                mounts.append((path, ["--tmpfs", path]))
                sealed.append(path)
            else:
                mounts.append((path, ["--ro-bind", "/dev/null", path]))
        mounts += [(path, ["--ro-bind", path, path]) for path in _existing(read_only)]
        mounts += [(path, ["--bind", path, path]) for path in _existing(also_writable)]
        for _, mount in sorted(mounts, key=lambda m: m[0].count("/")):   # stable: in order
            args += mount
        for path in sealed:   # not recursive: what is bound inside stays as it was bound
            args += ["--remount-ro", path]
        return [*args, "--chdir", chdir or tree, "--", *argv]

    def probe(self) -> None:
        """Set up a sandbox once, as a run's is set up: SandboxUnavailable says why not."""
        try:
            done = subprocess.run(
                [self.bwrap, "--unshare-user", "--unshare-pid", "--cap-drop", "ALL",
                 *(["--uid", str(NESTED_UID), "--gid", str(NESTED_UID)]
                   if os.geteuid() == 0 else []),
                 "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
                 "--", "true"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SandboxUnavailable(f"bubblewrap ({self.bwrap}) cannot run: {e}") from None
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            hint = ("user namespaces are off on this machine: enable them (sysctl "
                    "kernel.unprivileged_userns_clone=1, or on Ubuntu 24.04+ "
                    "kernel.apparmor_restrict_unprivileged_userns=0)"
                    if "namespace" in why or "uid map" in why or "not permitted" in why
                    else "see `bwrap --version` and the kernel's log")
            raise SandboxUnavailable(f"bubblewrap cannot set up a sandbox here ({why}); "
                                     f"{hint}")


def check_config(config, workspace: str, source: str | None, all_errors: bool = False) -> None:
    """Only the human loosens the sandbox: `agent.sandbox: none` and `agent.writable` come
    from a config outside the workspace (an agent can rewrite the workspace's ralph.yml).
    BadInput: the first that does not, or both with `all_errors`."""
    from ralph.session_store import BadInput

    from ..config import SandboxMode, outside_allowed
    if outside_allowed(workspace, source):
        return
    found = []
    if config.agent.sandbox is SandboxMode.NONE:
        found.append(f"{source}: $.agent.sandbox: none is taken only from a config outside "
                     f"the workspace (-c), or from `--sandbox none`: agents can rewrite "
                     f"this file")
    if config.agent.writable:
        found.append(f"{source}: $.agent.writable: paths an agent may write are taken only "
                     f"from a config outside the workspace (-c): agents can rewrite this "
                     f"file")
    if found:
        raise BadInput("\n".join(found if all_errors else found[:1]))


def find(hidden: tuple[str, ...] = (), writable: tuple[str, ...] = (),
         network: bool = True) -> Sandbox:
    """The sandbox of this machine, checked: SandboxUnavailable when it cannot confine."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(f"bubblewrap (`bwrap`) is not installed: {INSTALL}")
    sandbox = Sandbox(bwrap, tuple(os.path.abspath(p) for p in hidden),
                      tuple(os.path.realpath(p) for p in writable), network)
    sandbox.probe()
    return sandbox


def _own_homes(cli: str | None, env: dict[str, str], home: str) -> list[str]:
    """The run's CLI's own folders: in the home, and where its variable moves them."""
    if cli is None:
        return []
    own = [os.path.realpath(os.path.join(home, p)) for p in CLI_HOMES.get(cli, ())]
    moved = env.get(CLI_HOME_VARIABLES.get(cli, ""))
    if moved and os.path.isabs(moved):
        own.append(os.path.realpath(moved))
    return own


def _make_main_home(cli: str | None, env: dict[str, str], own: list[str]) -> None:
    """The CLI's folder made before the run, as the CLI would make it: only what exists is
    bound writable, and a CLI that cannot keep its conversation cannot continue it (Claude
    Code's `--resume` after a usage limit's wait). Its variable's folder, else the home's."""
    if not own:
        return
    moved = env.get(CLI_HOME_VARIABLES.get(cli or "", ""))
    try:
        os.makedirs(own[-1] if moved and os.path.isabs(moved) else own[0], mode=0o700,
                    exist_ok=True)
    except OSError:
        pass   # then it runs without it: the CLI says what it misses


def _needed(argv: list[str], env: dict[str, str]) -> list[str]:
    """What the run needs to start, real paths: the Python that runs ralph's tools and
    ralph itself, the program (and the agent's, after the supervisor's `--`: it is looked
    up on PATH inside), and every path its command line names."""
    engine_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))))
    found = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)),
             engine_root]
    names = argv[:1] + argv[argv.index("--") + 1:][:1] if "--" in argv else argv[:1]
    for name in names:
        program = shutil.which(name, path=env.get("PATH"))
        if program:
            found += [os.path.dirname(os.path.abspath(program)),
                      os.path.dirname(os.path.realpath(program))]
    found += [a for a in argv if os.path.isabs(a)]
    return [p for p in dict.fromkeys(os.path.realpath(p) for p in found)
            if os.path.exists(p)]


def _git_common_dir(tree: str) -> list[str]:
    """A worktree's repository (its `.git` is a file naming it), which git in the
    worktree reads: shown read-only wherever it is."""
    dot_git = os.path.join(tree, ".git")
    if not os.path.isfile(dot_git):
        return []
    try:
        with open(dot_git, encoding="utf-8") as f:
            line = f.read(4096).strip()
    except OSError:
        return []
    if not line.startswith("gitdir:"):
        return []
    gitdir = os.path.realpath(os.path.join(tree, line[len("gitdir:"):].strip()))
    try:
        with open(os.path.join(gitdir, "commondir"), encoding="utf-8") as f:
            return [os.path.realpath(os.path.join(gitdir, f.read(4096).strip()))]
    except OSError:
        return [gitdir]


def _existing(paths) -> list[str]:
    return [p for p in dict.fromkeys(os.path.realpath(p) for p in paths)
            if os.path.lexists(p)]


def _outermost(paths: list[str]) -> list[str]:
    return [p for p in paths if not any(o != p and _under(p, (o,)) for o in paths)]


def _under(path: str, roots) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)
