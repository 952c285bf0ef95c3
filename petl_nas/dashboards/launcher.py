"""``petl-nas dashboard``: the real optuna-dashboard on a study's storage, until Ctrl-C.

Serves optuna-dashboard's WSGI app with the standard library's threaded WSGI server (the same
server ``optuna-dashboard`` itself uses by default), without request logging. The storage is
checked first, so a bad URL is one clear error, and ``--port 0`` picks a free port. The app sits
behind `readonly.ReadOnly`: read-only unless ``allow_writes``, and only for requests addressed to
this machine (it has no authentication). Bound to an address other machines reach, it says so.

Example:
    >>> serve("sqlite:///runs/smoke/study.db", port=8080)    # doctest: +SKIP
    optuna-dashboard on sqlite:///runs/smoke/study.db (1 study: smoke) at http://127.0.0.1:8080/, read-only \
(Ctrl-C to stop)
"""

from __future__ import annotations

import ipaddress
import signal
import threading
import warnings
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ..errors import ConfigError, PetlWarning
from .readonly import LOCAL_NAMES, ReadOnly
from .storage import open_storage, redact


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # Ctrl-C never waits for a browser's open connection


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _stop_on_sigterm():
    """SIGTERM stops the server like Ctrl-C (only the main thread may set handlers); returns the
    handler it replaced, for `serve` to put back (None: none was replaced)."""
    if threading.current_thread() is threading.main_thread():
        return signal.signal(signal.SIGTERM, _interrupt)
    return None


def is_loopback(host: str) -> bool:
    """Whether only this machine reaches ``host`` (an address or ``localhost``)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower().rstrip(".") in LOCAL_NAMES


def make_dashboard(
    storage_url: str, host: str = "127.0.0.1", port: int = 8080, allow_writes: bool = False, allowed_hosts=()
) -> tuple[WSGIServer, list[str]]:
    """A bound (not yet serving) optuna-dashboard server on the storage at ``storage_url``, and the
    names of the studies it holds. Read-only unless ``allow_writes``; ``allowed_hosts``: host names
    beside this machine's own that requests may address (`readonly.ReadOnly`)."""
    storage = open_storage(storage_url)
    names = [s.study_name for s in storage.get_all_studies()]
    try:
        from optuna_dashboard import wsgi
    except ImportError:
        raise ConfigError("the dashboard needs optuna-dashboard: pip install 'petl-nas[dashboard]'") from None
    app = ReadOnly(wsgi(storage), bound_host=host, allowed_hosts=allowed_hosts, allow_writes=allow_writes)
    try:
        return make_server(host, port, app, server_class=_Server, handler_class=_QuietHandler), names
    except OSError as e:
        raise ConfigError(
            f"cannot listen on {host}:{port}: {e.strerror or e}; choose another --port (0 picks a free one) or --host"
        ) from None


def serve(
    storage_url: str,
    host: str = "127.0.0.1",
    port: int = 8080,
    printer=None,
    allow_writes: bool = False,
    allowed_hosts=(),
) -> None:
    """Serve until Ctrl-C (or SIGTERM); returns normally when stopped. Arguments as `make_dashboard`."""
    printer = printer or (lambda line: print(line, flush=True))
    server, names = make_dashboard(storage_url, host, port, allow_writes, allowed_hosts)
    if not is_loopback(host):
        warnings.warn(
            f"the dashboard listens on {host}, which other machines may reach, and has no "
            f"authentication: anyone who reaches port {server.server_port} reads the study"
            f"{' and may change or delete it (--allow-writes)' if allow_writes else ' (read-only)'}; "
            f"prefer the default 127.0.0.1 and an SSH tunnel: "
            f"ssh -L {server.server_port}:127.0.0.1:{server.server_port} THIS_HOST",
            PetlWarning,
            stacklevel=2,
        )
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    printer(
        f"optuna-dashboard on {redact(storage_url)} ({len(names)} "
        f"{'study' if len(names) == 1 else 'studies'}{': ' + shown if names else ''}) "
        f"at http://{host}:{server.server_port}/, {'read/write' if allow_writes else 'read-only'} "
        f"(Ctrl-C to stop)"
    )
    previous = _stop_on_sigterm()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if previous is not None:  # a caller in-process (a test) keeps its own handler
            signal.signal(signal.SIGTERM, previous)


__all__ = ["serve", "make_dashboard", "is_loopback"]
