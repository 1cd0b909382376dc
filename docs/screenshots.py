"""The README's pictures, made from the real thing: `python docs/screenshots.py`.

In a throwaway workspace (and state directory) it runs sessions on the bundled demo
agent, serves them with `ralph web` on loopback, opens the page from the URL the server
printed in headless Chromium (Debian's `chromium`, driven by Playwright's Python package)
and saves, next to this file:

  web-paused-question.png   a session paused from the page (Pause) with a question pending
  web-sessions-waiting.png  the sessions list: two sessions wait on a human
  diagram-paused.png        `ralph diagram --session ID --format png` of the demo paused by
                            `--max-iterations 1` (needs Graphviz's `dot`)

`--out DIR` saves them elsewhere; `--chromium PATH` names the browser. Exit 0 when all
three were saved, 2 when something they need is missing (said in one line).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
RALPH = [sys.executable, "-m", "ralph.engine"]
# the demo agent's steps: the planner plans two tasks; the executor asks about the first
PAUSED_SCENARIO = [
    {"role": "planner", "iteration": 1, "emit": [{"topic": "plan.ready", "json": {"tasks": [
        {"id": "db", "title": "Pick and wire the database", "batch": 1},
        {"id": "api", "title": "Write the HTTP API", "batch": 1}]}}]},
    {"role": "executor", "task": "db",
     "ask": {"question": "Which database should the service use?",
             "options": ["sqlite", "postgres"], "timeout": 3600}},
    {"role": "executor", "task": "api",
     "ask": {"question": "Ship the API behind a feature flag?", "options": ["yes", "no"],
             "timeout": 3600}},
]
# the list: two sessions that ask (the first asks first), one that completes
WAITING = [("orders", "Write the HTTP API of the order service",
            "Which database should the service use?", ["sqlite", "postgres"]),
           ("docs", "Document the public API for the partners",
            "Publish the draft to the partner portal now?", ["yes", "wait for legal"])]
DONE = [{"role": "planner", "emit": [{"topic": "LOOP_COMPLETE", "payload": "nothing left"}]}]


def asking(question: str, options: list[str]) -> list[dict]:
    return [{"role": "planner", "iteration": 1, "emit": [{"topic": "plan.ready", "json": {
                "tasks": [{"id": "t1", "title": "the first step", "batch": 1}]}}]},
            {"role": "executor", "ask": {"question": question, "options": options,
                                         "timeout": 3600}}]


class Failed(Exception):
    """Something the pictures need is missing: one line says what."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent),
                        help="where the PNGs are saved (default: docs/)")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args(argv)
    out = Path(args.out)
    try:
        if not os.path.exists(args.chromium):
            raise Failed(f"--chromium {args.chromium}: no such browser (apt-get install chromium)")
        if shutil.which("dot") is None:
            raise Failed("diagram-paused.png needs Graphviz's dot (apt-get install graphviz)")
        with tempfile.TemporaryDirectory(prefix="ralph-shots-") as tmp:
            Pictures(Path(tmp), out, args.chromium).make()
    except Failed as e:
        print(f"screenshots: {e}", file=sys.stderr)
        return 2
    return 0


class Pictures:
    def __init__(self, tmp: Path, out: Path, chromium: str):
        self.out, self.chromium = out, chromium
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RALPH_")}
        self.env.update(PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                        RALPH_STATE_DIR=str(tmp / "state"), RALPH_DEMO_SLEEP_SCALE="0")
        self.tmp = tmp
        self.engines: list[subprocess.Popen] = []

    def ralph(self, ws: Path, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(RALPH + list(args), cwd=ws, env=self.env, capture_output=True,
                              text=True, timeout=120)

    def start(self, ws: Path, *args: str) -> subprocess.Popen:
        engine = subprocess.Popen(RALPH + ["session", "start", *args], cwd=ws, env=self.env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.engines.append(engine)
        return engine

    def workspace(self, name: str) -> Path:
        ws = self.tmp / name
        ws.mkdir()
        return ws

    def config(self, ws: Path, name: str, steps: list[dict]) -> str:
        """A config whose demo agent plays `steps`; its path. Outside the workspace: a
        config there is the agents' to rewrite, and a second one is refused."""
        folder = self.tmp / "configs" / ws.name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.yaml").write_text(yaml.safe_dump({"steps": steps}, sort_keys=False))
        (folder / f"{name}.yml").write_text(yaml.safe_dump({
            "agent": {"backend": "demo", "script": str(folder / f"{name}.yaml")},
            "fallback": {"enabled": False}}, sort_keys=False))
        return str(folder / f"{name}.yml")

    def asking(self, ws: Path, sid: str) -> bool:
        shown = self.ralph(ws, "session", "status", sid, "--json")
        return shown.returncode == 0 and bool(json.loads(shown.stdout)["pending_questions"])

    @contextlib.contextmanager
    def served(self, ws: Path):
        """`ralph web` on loopback over `ws`: the URL it printed."""
        server = subprocess.Popen(RALPH + ["web", "--port", "0"], cwd=ws, env=self.env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            yield _printed_url(server)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)

    def make(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        try:
            self.diagram()
            self.pages()
        finally:
            for engine in self.engines:
                if engine.poll() is None:
                    engine.send_signal(signal.SIGTERM)
                    engine.wait(timeout=60)

    def diagram(self) -> None:
        ws = self.workspace("limit")   # the bundled demo, as the README's first command
        done = self.ralph(ws, "session", "start", "Build a greeting CLI", "--id", "greeting",
                          "--max-iterations", "1")
        if done.returncode != 5:
            raise Failed(f"the demo did not pause by its limit (exit {done.returncode}): "
                         f"{done.stderr.strip()[-300:]}")
        target = self.out / "diagram-paused.png"
        drawn = self.ralph(ws, "diagram", "--session", "greeting", "--format", "png",
                           "-o", str(target))
        if drawn.returncode != 0:
            raise Failed(f"ralph diagram: {drawn.stderr.strip()}")
        print(f"saved {target}")

    def pages(self) -> None:
        from playwright.sync_api import sync_playwright
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=self.chromium, headless=True,
                                        args=["--no-sandbox", "--disable-gpu"])
            try:
                self.paused_question(browser)
                self.sessions_waiting(browser)
            finally:
                browser.close()

    def paused_question(self, browser) -> None:
        ws = self.workspace("service")
        self.start(ws, "Build a small web service", "--id", "web-demo",
                   "-c", self.config(ws, "ralph", PAUSED_SCENARIO))
        _wait(lambda: self.ralph(ws, "session", "status", "web-demo").returncode == 0,
              "the session to start")
        with self.served(ws) as url:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(_at(url, "/s/web-demo"))
            question = page.locator("article.question", has_text="Which database")
            question.wait_for(timeout=60000)
            page.fill("#signal-message", "lunch break")
            page.click("button[data-signal=pause]")
            page.locator("#summary .pause-reason", has_text="lunch break").wait_for(
                timeout=60000)
            page.locator('#diagram .drawing[data-state="PAUSED"]').wait_for(timeout=60000)
            page.locator("#resume:not([hidden])").wait_for()
            bottom = page.locator("#diagram").evaluate(
                "d => d.getBoundingClientRect().bottom + window.scrollY")
            self.save(page, "web-paused-question.png",
                      full_page=True, clip={"x": 0, "y": 0, "width": 1280, "height": bottom + 16})

    def sessions_waiting(self, browser) -> None:
        ws = self.workspace("fleet")
        self.start(ws, "Add a read-through cache to the catalogue", "--id", "cache",
                   "-c", self.config(ws, "done", DONE)).wait(timeout=120)
        for sid, objective, question, options in WAITING:
            self.start(ws, objective, "--id", sid,
                       "-c", self.config(ws, sid, asking(question, options)))
            _wait(lambda sid=sid: self.asking(ws, sid), f"session {sid} to ask")
        with self.served(ws) as url:
            page = browser.new_page(viewport={"width": 1280, "height": 360})
            page.goto(url)
            page.wait_for_function("() => document.querySelectorAll("
                                   "'table.sessions tr.waits-on-human').length === 2",
                                   timeout=60000)
            self.save(page, "web-sessions-waiting.png", full_page=False)

    def save(self, page, name: str, **options) -> None:
        page.evaluate("document.getElementById('notice').hidden = true")   # a passing toast
        target = self.out / name
        page.screenshot(path=str(target), **options)
        print(f"saved {target}")


def _printed_url(server: subprocess.Popen) -> str:
    """The URL `ralph web` printed (its token in the fragment)."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(server.stdout.readline()), daemon=True)
    reader.start()
    reader.join(30)
    found = re.search(r"http://\S+", got[0] if got else "")
    if not found:
        raise Failed(f"ralph web did not say where it listens: {got!r}")
    return found.group(0)


def _at(url: str, path: str) -> str:
    base, _, fragment = url.partition("#")
    return base.rstrip("/") + path + "#" + fragment


def _wait(check, what: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise Failed(f"waited {timeout} s for {what}")
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
