"""Who may use the page, and what never leaves it.

- Every /api request (the reads, the live streams, the changes) carries the server's token
  in the X-Ralph-Token header, compared in constant time; without it: 401. The token is
  $RALPH_WEB_TOKEN or, when that is not set, one made at start (32 random bytes) and
  printed in the URL `ralph web` shows. The page takes it from that URL's fragment
  (#token=...), which browsers never send: it is in no request line, log or Referer.
  Another user of this machine reaches the port, not the token; the page and its scripts,
  served without it, hold no data.
- Without $RALPH_WEB_TOKEN the server binds loopback only and answers only to a loopback
  Host name (a DNS-rebinding page that reaches 127.0.0.1 under its own name is refused).
  Any other address needs $RALPH_WEB_TOKEN: there is no TLS, so serving the network is
  the user's choice, with a token they keep.
- Every state-changing request is a same-origin JSON POST: its Origin must be the page's
  own, which a page of another site cannot forge.
- The Telegram bot token (from the environment or the workspace's ralph.yml) is masked in
  every response body, whatever file it might have reached.
"""
from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from urllib.parse import urlsplit

from ralph.session_store import BadInput

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


def web_token(host: str, environ) -> tuple[str, bool]:
    """The token every /api request must carry, and whether it is the user's own
    ($RALPH_WEB_TOKEN) rather than one made now. BadInput when `host` is not loopback and
    no token is set, or when the one set is short."""
    given = (environ.get(TOKEN_ENV) or "").strip()
    if not given:
        if not is_loopback(host):
            raise BadInput(f"--host {host}: not a loopback address; set ${TOKEN_ENV} to serve "
                           f"there (every request then needs it)")
        return secrets.token_urlsafe(32), False
    if len(given) < 16:
        raise BadInput(f"${TOKEN_ENV}: expected at least 16 characters")
    return given, True


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
    """ASGI middleware: the checks above, then the security headers on every response.
    `any_host`: serve whatever Host name the request gives (a proxy's, a LAN name)."""

    def __init__(self, app, token: str, any_host: bool):
        self.app, self.token, self.any_host = app, token.encode(), any_host

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refused = self.refusal(scope)
        if refused is not None:
            return await _plain(send, *refused)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + HEADERS
            await send(message)
        await self.app(scope, receive, with_headers)

    def refusal(self, scope) -> tuple[int, str] | None:
        host = _header(scope, b"host") or ""
        if not self.any_host and not is_loopback(urlsplit("//" + host).hostname or ""):
            return 403, "refused: this server answers only to a loopback host name"
        if scope["path"].startswith("/api/"):
            given = (_header(scope, TOKEN_HEADER) or "").encode("latin-1")
            if not hmac.compare_digest(given, self.token):
                return 401, (f"refused: a valid {TOKEN_HEADER.decode()} header is required "
                             f"(open the URL `ralph web` printed)")
        if scope["method"] not in SAFE_METHODS:
            origin = _header(scope, b"origin")
            if origin is None or urlsplit(origin).netloc != host:
                return 403, "refused: a state-changing request must come from this page (Origin)"
            kind = (_header(scope, b"content-type") or "").split(";")[0].strip()
            if kind != "application/json":
                return 403, "refused: expected a JSON body (Content-Type: application/json)"
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
    """A refusal. The request's body is not read: the connection closes rather than
    drain it."""
    body = (text + "\n").encode()
    extra = [(b"www-authenticate", TOKEN_HEADER)] if status == 401 else []
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *extra, *HEADERS]})
    await send({"type": "http.response.body", "body": body})
