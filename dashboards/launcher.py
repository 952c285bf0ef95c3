"""``petl-nas dashboard``: the real optuna-dashboard on a study's storage, until Ctrl-C.

Serves optuna-dashboard's WSGI app with the standard library's threaded WSGI server (the same
server ``optuna-dashboard`` itself uses by default), without request logging. The storage is
checked first, so a bad URL is one clear error, and ``--port 0`` picks a free port.

Example:
    >>> serve("sqlite:///runs/smoke/study.db", port=8080)    # doctest: +SKIP
    optuna-dashboard on sqlite:///runs/smoke/study.db (1 study: smoke) at http://127.0.0.1:8080/ (Ctrl-C to stop)
"""

from __future__ import annotations

import signal
import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ..config import ConfigError
from .storage import open_storage, redact


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True             # Ctrl-C never waits for a browser's open connection


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):   # noqa: A002 - the base class's signature
        pass


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _stop_on_sigterm() -> None:
    """SIGTERM stops the server like Ctrl-C (only the main thread may set handlers)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


def make_dashboard(storage_url: str, host: str = "127.0.0.1", port: int = 8080) -> tuple[WSGIServer, list[str]]:
    """A bound (not yet serving) optuna-dashboard server on the storage at ``storage_url``, and the
    names of the studies it holds."""
    storage = open_storage(storage_url)
    names = [s.study_name for s in storage.get_all_studies()]
    try:
        from optuna_dashboard import wsgi
    except ImportError:
        raise ConfigError("the dashboard needs optuna-dashboard: pip install 'petl-nas[dashboard]'") from None
    app = wsgi(storage)
    try:
        return make_server(host, port, app, server_class=_Server, handler_class=_QuietHandler), names
    except OSError as e:
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}; choose another --port "
                          f"(0 picks a free one) or --host") from None


def serve(storage_url: str, host: str = "127.0.0.1", port: int = 8080, printer=None) -> None:
    """Serve until Ctrl-C (or SIGTERM); returns normally when stopped."""
    printer = printer or (lambda line: print(line, flush=True))
    server, names = make_dashboard(storage_url, host, port)
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    printer(f"optuna-dashboard on {redact(storage_url)} ({len(names)} "
            f"{'study' if len(names) == 1 else 'studies'}{': ' + shown if names else ''}) "
            f"at http://{host}:{server.server_port}/ (Ctrl-C to stop)")
    _stop_on_sigterm()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


__all__ = ["serve", "make_dashboard"]
