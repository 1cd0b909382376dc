"""Who may use the page, and what never leaves it.

- Bound to loopback with no token: anyone on this machine may read and act, but only
  through a loopback Host name (a DNS-rebinding page that reaches 127.0.0.1 under its own
  name is refused).
- With RALPH_WEB_TOKEN (required on any other address): every /api request carries it in
  the X-Ralph-Token header. The page takes it from its URL's fragment (#token=...), which
  browsers never send, so it is in no request line and no log.
- Every state-changing request is a same-origin JSON POST: its Origin must be the page's
  own, which a page of another site cannot forge.
- The Telegram bot token (from the environment or the workspace's ralph.yml) is masked in
  every response body, whatever file it might have reached.
"""
from __future__ import annotations

import hmac
import ipaddress
import os
from urllib.parse import urlsplit

from session_store import BadInput

TOKEN_ENV = "RALPH_WEB_TOKEN"
TOKEN_HEADER = b"x-ralph-token"
SAFE_METHODS = ("GET", "HEAD")
MIN_SECRET = 8   # shorter "tokens" are no secret worth masking, and would mask common text
HEADERS = [
    (b"content-security-policy", b"default-src 'self'; img-src 'self' data:; "
                                 b"object-src 'none'; base-uri 'none'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


def is_loopback(host: str) -> bool:
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def web_token(host: str, environ) -> str | None:
    """The token requests must carry, or None on loopback without one; BadInput when
    `host` is not loopback and no token is set."""
    token = (environ.get(TOKEN_ENV) or "").strip() or None
    if token is None and not is_loopback(host):
        raise BadInput(f"--host {host}: not a loopback address; set ${TOKEN_ENV} to serve "
                       f"there (every request then needs it)")
    if token is not None and len(token) < 16:
        raise BadInput(f"${TOKEN_ENV}: expected at least 16 characters")
    return token


def telegram_tokens(workspace: str, environ) -> list[str]:
    """The Telegram bot tokens this workspace may know: $RALPH_TELEGRAM_BOT_TOKEN and the
    one in its ralph.yml (a config that does not load hides nothing from us: skipped)."""
    from ... import config as cfg
    found = [environ.get("RALPH_TELEGRAM_BOT_TOKEN") or ""]
    path = os.path.join(workspace, "ralph.yml")
    if os.path.isfile(path):
        try:
            found.append(cfg.load(path).RObot.telegram.bot_token or "")
        except BadInput:
            pass
    return [t.strip() for t in found if len(t.strip()) >= MIN_SECRET]


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


class Guard:
    """ASGI middleware: the checks above, then the security headers on every response."""

    def __init__(self, app, token: str | None):
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refused = self.refusal(scope)
        if refused is not None:
            return await _plain(send, 403, refused)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + HEADERS
            await send(message)
        await self.app(scope, receive, with_headers)

    def refusal(self, scope) -> str | None:
        host = _header(scope, b"host") or ""
        if self.token is None and not is_loopback(urlsplit("//" + host).hostname or ""):
            return "refused: this server answers only to a loopback host name"
        if self.token is not None and scope["path"].startswith("/api/"):
            given = _header(scope, TOKEN_HEADER) or ""
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                return f"refused: a valid {TOKEN_HEADER.decode()} header is required"
        if scope["method"] not in SAFE_METHODS:
            origin = _header(scope, b"origin")
            if origin is None or urlsplit(origin).netloc != host:
                return "refused: a state-changing request must come from this page (Origin)"
            kind = (_header(scope, b"content-type") or "").split(";")[0].strip()
            if kind != "application/json":
                return "refused: expected a JSON body (Content-Type: application/json)"
        return None


class Redact:
    """ASGI middleware: every secret in a response body is masked (same length, so a
    Content-Length stays true). Each body message is one whole JSON document or one
    whole server-sent event, so a secret is never split across two of them."""

    def __init__(self, app, secrets: list[str]):
        self.app = app
        self.secrets = [s.encode() for s in secrets]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.secrets:
            return await self.app(scope, receive, send)

        async def masked(message):
            if message["type"] == "http.response.body":
                body = message.get("body", b"")
                for secret in self.secrets:
                    body = body.replace(secret, b"*" * len(secret))
                message["body"] = body
            await send(message)
        await self.app(scope, receive, masked)


async def _plain(send, status: int, text: str) -> None:
    body = (text + "\n").encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()), *HEADERS]})
    await send({"type": "http.response.body", "body": body})
