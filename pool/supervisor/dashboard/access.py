"""Who may see the dashboard, and how a browser stays let in.

The dashboard only shows the pool: it runs nothing and changes nothing.
So it has a credential of its own, the *dashboard key*, and never takes or
hands out the pool's token (which lets a caller run code as the pool's
user, SECURITY.md):

- On a loopback address this machine's users are trusted, as with the
  pool's unix sockets; a request whose Host is not a loopback name is
  refused (a foreign page that rebinds its name to 127.0.0.1 reads nothing).
- On any other, every request gives the key (``--dashboard-key-file``):
  ``Authorization: Bearer KEY``, or once ``?key=KEY``, which redirects to
  the same page without it and sets a *session cookie*. The cookie is not
  the key: it is an expiry time and an HMAC of it under a secret this
  process made at start (so it dies with the pool, and a stolen cookie
  never yields the key). It is HttpOnly, SameSite=Strict, for this host
  and this port only (its name carries the port: browsers share cookies
  across ports), and ``Secure`` when the page is served over TLS.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from typing import Final

from aiohttp import web

from pool.supervisor.dashboard import is_loopback

COOKIE_PREFIX: Final = "shmpool_view_"
SESSION_S: Final = 12 * 3600  # how long a browser stays let in


class Access:
    """The dashboard's rule for one request (see the module docstring).

    :param key: what viewers give off loopback; None on loopback.
    :param secure: the page is served over TLS (the cookie says so).
    """

    def __init__(self, key: str | None, *, secure: bool) -> None:
        self._key, self._secure = key, secure
        self._secret = secrets.token_bytes(32)  # (signs sessions; never sent)
        self.port = 0  # the port served, once bound: names the cookie

    def check(self, request: web.Request) -> None:
        """Return if ``request`` may be answered, else raise the answer: a
        refusal, or the redirect that sets a session."""
        if self._key is None:
            if not is_loopback((request.url.host or "").strip("[]")):
                raise web.HTTPForbidden(
                    text="this dashboard answers only to loopback names\n"
                )
            return
        if _same(request.query.get("key"), self._key):
            kept = {k: v for k, v in request.query.items() if k != "key"}
            response = web.HTTPSeeOther(location=str(request.rel_url.with_query(kept)))
            response.set_cookie(
                self.cookie,
                self._session(int(time.time()) + SESSION_S),
                max_age=SESSION_S,
                path="/",
                httponly=True,
                samesite="Strict",
                secure=self._secure,
            )
            raise response
        header = request.headers.get("Authorization", "")
        given = header[7:] if header.startswith("Bearer ") else None
        if _same(given, self._key) or self._valid(request.cookies.get(self.cookie)):
            return
        raise web.HTTPUnauthorized(
            text="this dashboard needs its key: open it once as /?key=KEY (the "
            "contents of the pool's --dashboard-key-file), or send the header "
            "'Authorization: Bearer KEY'\n"
        )

    @property
    def cookie(self) -> str:
        return f"{COOKIE_PREFIX}{self.port}"

    def _session(self, expires: int) -> str:
        return f"{expires}.{self._mac(expires)}"

    def _valid(self, session: str | None) -> bool:
        expires, _, mac = (session or "").partition(".")
        if not expires.isdigit() or int(expires) < time.time():
            return False
        return hmac.compare_digest(mac.encode(), self._mac(int(expires)).encode())

    def _mac(self, expires: int) -> str:
        signed = f"{self.cookie}|{expires}".encode()
        return hmac.new(self._secret, signed, hashlib.sha256).hexdigest()


def _same(given: str | None, key: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), key.encode())
