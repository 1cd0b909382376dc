"""The routes: the page (static, no data in it), a JSON API over reads.py and actions.py,
and two server-sent-event streams fed by feed.py. Wrapped in the security middleware."""
from __future__ import annotations

import contextlib
import json
from importlib import resources

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ralph.session_store import BadInput, check_id

from . import actions, reads
from .feed import Feed
from .reads import Problem, dumps
from .security import Guard, Redact

MAX_BODY = 1 << 20
# a body refused as too large is not read on: the connection closes rather than drain it;
# a refused stream says when to try again
PROBLEM_HEADERS = {413: {"connection": "close"}, 503: {"retry-after": "10"}}
STATIC = {"app.js": "text/javascript; charset=utf-8", "session.js": "text/javascript; charset=utf-8",
          "util.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}


def _json(data, status: int = 200, headers=None) -> Response:
    return Response(dumps(data), status_code=status, media_type="application/json",
                    headers=headers)


def _problem(_request: Request, p: Problem) -> Response:
    return _json({"error": p.message, **p.extra}, p.status, PROBLEM_HEADERS.get(p.status))


async def _body(request: Request) -> dict:
    """The JSON object a POST carries, read as it streams: past MAX_BODY bytes it is
    refused there (413), so a body without a length (chunked) is never held whole."""
    too_large = Problem(413, f"a request body has at most {MAX_BODY} bytes")
    if int(request.headers.get("content-length") or 0) > MAX_BODY:
        raise too_large
    raw = bytearray()
    async with contextlib.aclosing(request.stream()) as chunks:
        async for chunk in chunks:
            raw += chunk
            if len(raw) > MAX_BODY:
                raise too_large
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise Problem(400, "the body is not JSON") from None
    if not isinstance(data, dict):
        raise Problem(400, "$: expected a JSON object")
    return data


def build(workspace: str, feed: Feed, token: str, any_host: bool, secrets: list[str]):
    """The ASGI application for one workspace (security.Guard says what `token` and
    `any_host` are)."""
    package = resources.files(__package__).joinpath("static")
    files = {name: package.joinpath(name).read_bytes() for name in (*STATIC, "index.html")}

    def page(_request: Request) -> Response:
        return Response(files["index.html"], media_type="text/html; charset=utf-8")

    def session_page(request: Request) -> Response:
        try:   # the page reads the session through the API; a bad id is refused here
            check_id(request.path_params["sid"])
        except BadInput:
            return Response("no such session\n", 404, media_type="text/plain")
        return page(request)

    def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return Response("not found\n", 404, media_type="text/plain")
        return Response(files[name], media_type=STATIC[name])

    def reader(read):
        async def endpoint(request: Request) -> Response:
            params = request.path_params
            args = [params[k] for k in ("sid", "n", "name") if k in params]
            return _json(await run_in_threadpool(read, workspace, *args))
        return endpoint

    def writer(act):
        async def endpoint(request: Request) -> Response:
            body = await _body(request)
            args = [request.path_params[k] for k in ("sid", "qid") if k in request.path_params]
            return _json(await run_in_threadpool(act, workspace, *args, body))
        return endpoint

    async def stream_sessions(_request: Request) -> Response:
        return _Stream(feed.sessions(), feed.take_stream())

    async def stream_session(request: Request) -> Response:
        end = feed.take_stream()
        try:
            session, first = await run_in_threadpool(reads.first_events, workspace,
                                                     request.path_params["sid"])
        except BaseException:
            end()
            raise
        return _Stream(feed.session(session, first), end)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        await feed.start()
        yield
        await feed.close()

    S = "/api/sessions/{sid}"
    app = Starlette(routes=[
        Route("/", page),
        Route("/s/{sid}", session_page),
        Route("/static/{name}", static),
        Route("/api/sessions", reader(reads.sessions)),
        Route(S, reader(reads.snapshot)),
        Route(S + "/diagram", reader(reads.diagram)),
        Route(S + "/iterations", reader(reads.iterations)),
        Route(S + "/iterations/{n:int}/logs/{name}", reader(reads.run_log)),
        Route("/api/stream", stream_sessions),
        Route(S + "/stream", stream_session),
        Route(S + "/questions/{qid}/answer", writer(actions.answer), methods=["POST"]),
        Route(S + "/signals", writer(actions.signal), methods=["POST"]),
        Route(S + "/resume", writer(actions.resume), methods=["POST"]),
    ], exception_handlers={Problem: _problem}, lifespan=lifespan)
    return Redact(Guard(app, token, any_host), secrets)


class _Stream(StreamingResponse):
    """Server-sent events holding one of the feed's streams until they end, however they
    end (the reader gone, the server stopping)."""

    def __init__(self, events, end):
        super().__init__(events, media_type="text/event-stream",
                         headers={"x-accel-buffering": "no"})
        self._end = end

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._end()
            await self.body_iterator.aclose()   # its subscription ends now, not when collected
