"""`ralph web`: bind, say where, serve until SIGINT or SIGTERM."""
from __future__ import annotations

import os
import socket
import sys

from ralph import session_store
from ralph.session_store import BadInput

from .app import build
from .feed import MAX_STREAMS, Feed
from .security import telegram_tokens, web_token


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket (bound here, so the URL printed is the one that answers, port
    0 included), or BadInput naming the address."""
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        raise BadInput(f"--host {host} --port {port}: cannot listen there "
                       f"({e.strerror or e})") from None
    sock.set_inheritable(True)
    return sock


def serve(workspace: str, host: str = "127.0.0.1", port: int = 8765, *,
          max_streams: int | None = None, environ=None, watch=None) -> int:
    """Serve the live view of `workspace` on host:port until stopped; 0 when stopped.
    `watch` replaces the file-system watcher (a benchmark's fixed-interval poller)."""
    import uvicorn
    environ = os.environ if environ is None else environ
    workspace = os.path.abspath(workspace)
    if not os.path.isdir(workspace):
        raise BadInput(f"--workspace {workspace}: no such directory")
    token, users_own = web_token(host, environ)
    sock = _bind(host, port)
    feed = Feed(workspace, watch or session_store.watch, max_streams or MAX_STREAMS)
    app = build(workspace, feed, token, users_own, telegram_tokens(workspace, environ))

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):   # end the live streams, or shutdown waits on them
            feed.stop_streams()
            super().handle_exit(sig, frame)

    server = Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                   lifespan="on", timeout_graceful_shutdown=2))
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    # as Jupyter does: the URL to open carries the token. One the user set is not printed
    # (it outlives this run, and this line may land in a log); it is theirs to add
    print(f"ralph web: {workspace} on http://{shown}:{bound_port}/"
          + (" (add #token=<the value of $RALPH_WEB_TOKEN> to the URL)" if users_own
             else f"#token={token}"), flush=True)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:   # uvicorn re-raises the signal that stopped it, once done
        pass
    finally:
        sock.close()
    print("ralph web: stopped", file=sys.stderr, flush=True)
    return 0
