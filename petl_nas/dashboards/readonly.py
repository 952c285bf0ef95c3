"""What reaches the dashboard: reads, addressed to this machine.

optuna-dashboard (0.21) serves a read/write API with no authentication: ``DELETE
/api/studies/<id>`` deletes a study, and other calls rename studies, tell trials, and write notes,
user attributes and artifacts. It has no read-only mode and no list of allowed hosts, so this WSGI
middleware wraps its app with three checks:

- **Host** (DNS rebinding): a page on ``evil.example`` whose name is then re-pointed at 127.0.0.1
  is the dashboard's own origin to the browser, and its requests say ``Host: evil.example``. Only
  these names pass: ``localhost``, the bound host, the ``--allowed-host`` names, and any literal IP
  address (a literal address cannot be re-pointed). Anything else gets 403. The port is not checked,
  so an SSH tunnel to another local port still works.
- **Origin**: a request sent from another site's page, with an ``Origin`` header whose host does not
  pass the same check, gets 403. A form that another site posts to 127.0.0.1 sends the right Host.
- **Method**: only GET and HEAD pass unless ``allow_writes``. Anything else gets 405 with a reason
  that says how to allow writes; the dashboard's page shows it. Browsing never needs more: the
  page POSTs only when a user deletes, renames, annotates or uploads, or for preferential studies.

Example:
    >>> app = ReadOnly(wsgi(storage), bound_host="127.0.0.1")    # doctest: +SKIP
"""

from __future__ import annotations

import ipaddress
import json
from urllib.parse import urlsplit

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
READS = ("GET", "HEAD")


def hostname(value: str) -> str | None:
    """The host of a ``Host`` header (``name``, ``name:port``, ``[::1]:port``) or of an ``Origin``
    (``scheme://host[:port]``): lower case, without brackets or a trailing dot."""
    try:
        name = urlsplit(value if "://" in value else f"//{value}").hostname
    except ValueError:
        return None
    return name.rstrip(".") if name else None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class ReadOnly:
    """``app`` behind the Host, Origin and method checks above.

    Args:
        app: a WSGI application (optuna-dashboard's).
        bound_host: the address the server listens on (a name given here passes the Host check).
        allowed_hosts: more host names that reach this machine (a DNS name, a proxy's name).
        allow_writes: let every method through (the Host and Origin checks still apply).
    """

    def __init__(self, app, bound_host: str = "127.0.0.1", allowed_hosts=(), allow_writes: bool = False):
        self.app, self.allow_writes = app, allow_writes
        self.names = {n.lower().strip("[]").rstrip(".") for n in (*LOCAL_NAMES, bound_host, *allowed_hosts)}

    def allowed(self, name: str | None) -> bool:
        return name is not None and (name in self.names or _is_ip(name))

    def __call__(self, environ, start_response):
        host = environ.get("HTTP_HOST", "")
        origin = environ.get("HTTP_ORIGIN")
        method = environ.get("REQUEST_METHOD", "GET").upper()
        if not self.allowed(hostname(host)):
            return _refuse(
                start_response,
                "403 Forbidden",
                f"Host {host!r} is not an address of this dashboard; if that name reaches this "
                f"machine, restart with --allowed-host NAME",
            )
        if origin is not None and not self.allowed(hostname(origin)):
            return _refuse(start_response, "403 Forbidden", f"requests from {origin!r} are refused")
        if method not in READS and not self.allow_writes:
            return _refuse(
                start_response,
                "405 Method Not Allowed",
                f"this dashboard is read-only ({method} refused); to delete, rename or annotate, "
                f"restart it with petl-nas dashboard --allow-writes",
                [("Allow", ", ".join(READS))],
            )
        return self.app(environ, start_response)


def _refuse(start_response, status: str, reason: str, headers=()):
    """A JSON ``{"reason": ...}`` body, the shape optuna-dashboard's page reads its errors from."""
    body = json.dumps({"reason": reason}).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body))), *headers])
    return [body]


__all__ = ["ReadOnly", "hostname", "LOCAL_NAMES"]
