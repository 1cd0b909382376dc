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

from session_store import BadInput, check_id

from . import actions, reads
from .feed import Feed
from .reads import Problem, dumps
from .security import Guard, Redact

MAX_BODY = 1 << 20
STATIC = {"app.js": "text/javascript; charset=utf-8", "session.js": "text/javascript; charset=utf-8",
          "util.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}


def _json(data, status: int = 200) -> Response:
    return Response(dumps(data), status_code=status, media_type="application/json")


def _problem(_request: Request, p: Problem) -> Response:
    return _json({"error": p.message, **p.extra}, p.status)


async def _body(request: Request) -> dict:
    if int(request.headers.get("content-length") or 0) > MAX_BODY:
        raise Problem(413, f"a request body has at most {MAX_BODY} bytes")
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise Problem(413, f"a request body has at most {MAX_BODY} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise Problem(400, "the body is not JSON") from None
    if not isinstance(data, dict):
        raise Problem(400, "$: expected a JSON object")
    return data


def build(workspace: str, feed: Feed, token: str | None, secrets: list[str]):
    """The ASGI application for one workspace."""
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
        return _stream(feed.sessions())

    async def stream_session(request: Request) -> Response:
        sid = request.path_params["sid"]
        first, reader_ = await run_in_threadpool(reads.first_events, workspace, sid)
        return _stream(feed.session(sid, first, reader_))

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
    return Redact(Guard(app, token), secrets)


def _stream(events) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"x-accel-buffering": "no"})
