"""The config every git call of the engine runs with (engine/workspace_git.py): no
program an agent configured runs as the engine, and git works on the workspace only.

git runs as the engine in a repository agents can write (.git/config, an include
it names, .gitattributes, .git/info/attributes, hooks): so never through a shell, always
with a timeout, without the caller's GIT_* variables, and with every config key that
makes git run a program, or work elsewhere, neutralised for each call, read anew each
time (an agent may add one mid-session; an `include.path`/`includeIf` file's keys are
read with the rest). What was checked (`git help config`, git 2.39):

- run by the engine's own calls, neutralised: hooks (`core.hooksPath=/dev/null`, and
  `--no-verify`), `core.fsmonitor`, every `filter.<driver>` (clean, smudge, process:
  emptied), every `merge.<driver>.driver` a `merge=` attribute or `merge.default` selects
  (run in a merge of a parallel batch's lane: replaced by git's own `merge-file`, the
  built-in text merge), `gpg.program`/`gpg.<format>.program` (signing off:
  `commit.gpgSign`; verifying off: `log.showSignature`, `merge.verifySignatures`),
  `core.worktree` (git would read and write another directory as the work tree: the
  workspace's own is given, `--work-tree`), every transport program a lazy fetch of a
  partial clone would run (`remote.<name>.url` `ext::`, `protocol.<name>.allow`,
  `core.sshCommand`, `core.gitProxy`, `credential.helper`, `core.askPass`: no protocol is
  allowed, GIT_ALLOW_PROTOCOL empty; no askpass, no terminal prompt), `submodule.recurse`
  (a submodule's own config would go unread: off), auto gc and maintenance;
- never reached by them, and set off where a variable does it: `core.editor`,
  `sequence.editor` (every commit and merge has its message: GIT_EDITOR=:),
  `core.pager`/`pager.<cmd>` (`--no-pager`, GIT_PAGER=cat), `diff.external`,
  `diff.<driver>.command`/`.textconv` (no patch is made but for the human's `session
  diff`, `--no-ext-diff --no-textconv`), `trailer.<token>.cmd`/`.command` (the trailers
  are written in the message, never `--trailer`), `commit.template` (`--file=-`),
  `mergetool.*`/`difftool.*`, `alias.*` (builtins only), `receive.*`, `uploadpack.*`
  (`packObjectsHook` is read from protected config only), `core.alternateRefsCommand`,
  `submodule.<name>.update` (no fetch, push or submodule command is ever run), `trace2.*`
  (protected config only; GIT_TRACE* are dropped with every GIT_*).
"""
from __future__ import annotations

import os
import shlex

# what runs code from config an agent can write: off, whatever the repository says
SAFE_CONFIG = ("core.hooksPath=/dev/null", "core.fsmonitor=false", "commit.gpgSign=false",
               "log.showSignature=false", "merge.verifySignatures=false",
               "submodule.recurse=false", "credential.helper=", "gc.auto=0",
               "maintenance.auto=false")
# the configured drivers, each given commands of git's own: (section, key, command)
DRIVEN = (("filter", "clean", ""), ("filter", "smudge", ""), ("filter", "process", ""),
          ("merge", "driver", "{git} merge-file --marker-size=%L %A %O %B"))


def overrides(names: list[str], git: str) -> list[tuple[str, str]]:
    """The config of one call, given the names of the `filter.*` and `merge.*` keys the
    repository has now (`git config --name-only --get-regexp`): each driver they name
    gets commands of git's own (a filter none, a merge driver the built-in text merge)."""
    drivers = sorted({(n.split(".", 1)[0], n.split(".", 1)[1].rsplit(".", 1)[0])
                      for n in names if n.count(".") >= 2})
    return [*((o.split("=", 1)[0], o.split("=", 1)[1]) for o in SAFE_CONFIG),
            *((f"{section}.{name}.{key}", command.format(git=shlex.quote(git)))
              for section, name in drivers for of, key, command in DRIVEN if of == section),
            *((f"filter.{name}.required", "false") for section, name in drivers
              if section == "filter")]


def environment() -> dict:
    """The engine's environment without GIT_* (an agent's, or a caller's, could point git
    at another repository, index or config) and without a terminal prompt, an editor, a
    pager, an askpass program or any transport (a lazy fetch would run a remote's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_TERMINAL_PROMPT="0", LC_ALL="C", GIT_EDITOR=":", GIT_SEQUENCE_EDITOR=":",
               GIT_PAGER="cat", GIT_ASKPASS="", GIT_ALLOW_PROTOCOL="")
    return env


def config_env(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """Config for one call, as git's command line gives it (above every file), each key
    apart from its value (`-c` would split a driver's name holding a `=`)."""
    env = {"GIT_CONFIG_COUNT": str(len(pairs))}
    for i, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return env


def work_tree_top(workspace: str) -> str | None:
    """The top of the work tree the workspace is in, as git finds it (the nearest
    directory with a `.git`), before any `core.worktree` points elsewhere."""
    path = os.path.realpath(workspace)
    while True:
        if a_repository(os.path.join(path, ".git")):
            return path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def a_repository(dot_git: str) -> bool:
    """A `.git` above the workspace that is a repository's (a gitdir file, or a directory
    with a HEAD): an empty `.git` left in /tmp makes no workspace a git one."""
    return os.path.isfile(dot_git) or os.path.isfile(os.path.join(dot_git, "HEAD"))
