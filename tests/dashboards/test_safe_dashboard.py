"""The dashboard is read-only and answers only requests addressed to this machine: a real server on
port 0 refuses DELETE/POST/PUT/PATCH with 405 (the study stays), a foreign Host or Origin with 403
(DNS rebinding, other sites' pages), serves every read, and with ``allow_writes`` deletes as
optuna-dashboard does. In headless Chromium (PETL_NAS_CHROMIUM) the page renders the study
read-only and its own JavaScript cannot delete or rename it."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import threading
import time

import optuna
import pytest
from test_dashboard import CHROMIUM_FLAGS, chromium_or_skip, make_study

from petl_nas.app.cli import main
from petl_nas.dashboards import launcher
from petl_nas.dashboards.launcher import is_loopback, make_dashboard
from petl_nas.dashboards.readonly import hostname
from petl_nas.errors import PetlWarning

WRITES = [
    ("DELETE", "/api/studies/{id}", None),
    ("POST", "/api/studies/{id}/rename", {"study_name": "renamed"}),
    ("POST", "/api/studies", {"study_name": "new", "directions": ["minimize"]}),
    ("PUT", "/api/studies/{id}/note", {"version": 1, "body": "note"}),
    ("PATCH", "/api/studies/{id}", {}),
]


class Served:
    """A dashboard served in this process on a free port, stopped by `close`."""

    def __init__(self, url: str, **kwargs):
        self.server, _ = make_dashboard(url, "127.0.0.1", 0, **kwargs)
        self.port, self.study_id = self.server.server_port, None
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.study_id = self.json("GET", "/api/studies")[1]["study_summaries"][0]["study_id"]

    def request(self, method: str, path: str, body=None, **headers) -> tuple[int, bytes, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            headers = {"Host": f"127.0.0.1:{self.port}", **{k.replace("_", "-"): v for k, v in headers.items()}}
            data = json.dumps(body).encode() if body is not None else None
            if data is not None:
                headers["Content-Type"] = "application/json"
            conn.request(method, path.format(id=self.study_id), body=data, headers=headers)
            r = conn.getresponse()
            return r.status, r.read(), dict(r.getheaders())
        finally:
            conn.close()

    def json(self, method: str, path: str, body=None, **headers):
        status, data, _ = self.request(method, path, body, **headers)
        return status, json.loads(data) if data else None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def study_url(tmp_path):
    url = f"sqlite:///{tmp_path}/study.db"
    make_study(url, "dash_study")
    return url


@pytest.fixture
def served(study_url):
    s = Served(study_url)
    yield s
    s.close()


@pytest.mark.parametrize("method,path,body", WRITES, ids=[f"{m} {p}" for m, p, _ in WRITES])
def test_writes_are_refused_and_the_study_stays(served, study_url, method, path, body):
    def system_attrs() -> dict:  # the note (the calibration runs') lives here
        storage = optuna.storages.get_storage(study_url)
        return storage.get_study_system_attrs(storage.get_study_id_from_name("dash_study"))

    before = system_attrs()
    assert any("note" in k for k in before)  # make_study wrote one, as a search does
    status, data, headers = served.request(method, path, body)
    assert status == 405, data
    assert headers["Allow"] == "GET, HEAD"
    assert "read-only" in json.loads(data)["reason"] and "--allow-writes" in json.loads(data)["reason"]
    assert optuna.get_all_study_names(study_url) == ["dash_study"]
    study = optuna.load_study(study_name="dash_study", storage=study_url)
    assert len(study.trials) == 4
    assert system_attrs() == before  # the note neither rewritten nor removed


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example:{port}", ""])
def test_a_request_for_another_host_is_refused(served, host):
    """DNS rebinding: evil.example re-pointed at 127.0.0.1 reaches the server with its own name."""
    status, data, _ = served.request("GET", "/api/studies", Host=host.format(port=served.port))
    assert status == 403 and "--allowed-host" in json.loads(data)["reason"]
    assert served.request("GET", "/dashboard", Host="evil.example")[0] == 403


def test_a_request_from_another_sites_page_is_refused(served):
    assert served.request("GET", "/api/studies", Origin="http://evil.example")[0] == 403
    assert served.request("GET", "/api/studies", Origin="null")[0] == 403
    assert served.request("GET", "/api/studies", Origin=f"http://localhost:{served.port}")[0] == 200


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:{port}",
        "localhost:{port}",
        "LOCALHOST",
        "[::1]:{port}",
        "localhost.",
        "127.0.0.1:9999",
        "192.0.2.7:{port}",
    ],
)  # a tunnel's port; an IP, never rebound
def test_reads_work_from_this_machines_names(served, host):
    status, body = served.json("GET", "/api/studies", Host=host.format(port=served.port))
    assert status == 200 and [s["study_name"] for s in body["study_summaries"]] == ["dash_study"]


def test_every_read_is_served(served):
    status, detail = served.json("GET", f"/api/studies/{served.study_id}")
    assert status == 200 and len(detail["trials"]) == 4
    assert served.json("GET", f"/api/studies/{served.study_id}/param_importances")[0] == 200
    status, page, _ = served.request("GET", "/dashboard")
    assert status == 200 and b"<script" in page
    assert served.request("HEAD", "/dashboard")[0] == 200
    status, csv, _ = served.request("GET", f"/csv/{served.study_id}")
    assert status == 200 and b"Number" in csv


def test_allowed_host_names_pass(study_url):
    s = Served(study_url, allowed_hosts=["dash.example"])
    try:
        assert s.request("GET", "/api/studies", Host=f"dash.example:{s.port}")[0] == 200
        assert s.request("GET", "/api/studies", Host="evil.example")[0] == 403
    finally:
        s.close()


def test_allow_writes_lets_a_delete_through_but_still_checks_host_and_origin(study_url):
    s = Served(study_url, allow_writes=True)
    try:
        assert s.request("DELETE", "/api/studies/{id}", Host="evil.example")[0] == 403
        assert s.request("DELETE", "/api/studies/{id}", Origin="http://evil.example")[0] == 403
        assert optuna.get_all_study_names(study_url) == ["dash_study"]
        assert s.request("DELETE", "/api/studies/{id}", Origin=f"http://127.0.0.1:{s.port}")[0] == 204
        assert optuna.get_all_study_names(study_url) == []
    finally:
        s.close()


def test_the_cli_passes_its_flags_and_warns_off_loopback(study_url, monkeypatch, capsys):
    seen = {}
    monkeypatch.setattr(launcher, "serve", lambda url, **kw: seen.update(kw))
    assert (
        main(
            [
                "dashboard",
                "--storage",
                study_url,
                "--allow-writes",
                "--allowed-host",
                "a.lan",
                "--allowed-host",
                "b.lan",
            ]
        )
        == 0
    )
    assert seen == {"host": "127.0.0.1", "port": 8080, "allow_writes": True, "allowed_hosts": ["a.lan", "b.lan"]}
    monkeypatch.undo()

    def stopped(self, *a, **k):  # Ctrl-C at once: bound to 0.0.0.0 only for a moment
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher._Server, "serve_forever", stopped)
    handler = signal.getsignal(signal.SIGTERM)
    assert main(["dashboard", "--storage", study_url, "--host", "0.0.0.0", "--port", "0"]) == 0
    assert signal.getsignal(signal.SIGTERM) is handler  # pytest's own, put back
    out = capsys.readouterr()
    (warning,) = out.err.splitlines()
    assert warning.startswith("petl-nas: warning: the dashboard listens on 0.0.0.0") and "(read-only)" in warning
    assert "no authentication" in warning and "ssh -L" in warning
    assert "read-only (Ctrl-C to stop)" in out.out
    assert main(["dashboard", "--storage", study_url, "--port", "0"]) == 0  # loopback: no warning
    assert capsys.readouterr().err == ""
    with pytest.warns(PetlWarning, match=r"may change or delete it \(--allow-writes\)"):
        launcher.serve(study_url, host="0.0.0.0", port=0, printer=lambda line: None, allow_writes=True)


def test_names_and_addresses():
    assert [hostname(h) for h in ("Evil.Example:80", "[::1]:8080", "localhost.", "http://a.b:1", "", "[x")] == [
        "evil.example",
        "::1",
        "localhost",
        "a.b",
        None,
        None,
    ]
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("gpu-box")


class DevTools:
    """Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: it
    reads commands on fd 3 and answers on fd 4, each message ending in a NUL byte)."""

    def __init__(self, chromium: str, profile):
        to_browser, self.w = os.pipe()
        self.r, from_browser = os.pipe()

        def as_fds_3_and_4():
            a, b = os.dup(to_browser), os.dup(from_browser)  # out of the way of 3 and 4 first
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"],
            preexec_fn=as_fds_3_and_4,
            close_fds=False,  # 3 and 4 stay open
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser)
        os.close(from_browser)
        self.next_id, self.buffer = 0, b""

    def send(self, method: str, session: str | None = None, **params):
        self.next_id += 1
        message = {
            "id": self.next_id,
            "method": method,
            "params": params,
            **({"sessionId": session} if session else {}),
        }
        os.write(self.w, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self.buffer:
                chunk = os.read(self.r, 1 << 20)
                if not chunk:
                    raise RuntimeError("Chromium closed its DevTools pipe")
                self.buffer += chunk
            line, self.buffer = self.buffer.split(b"\0", 1)
            reply = json.loads(line)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(reply["error"])
                return reply["result"]

    def evaluate(self, session: str, expression: str):
        result = self.send("Runtime.evaluate", session, expression=expression, awaitPromise=True, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def close(self):
        try:
            self.send("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.w)
        os.close(self.r)


def test_the_page_browses_read_only_and_its_own_scripts_cannot_write(served, study_url, tmp_path):
    chromium = chromium_or_skip()
    browser = DevTools(chromium, tmp_path / "chromium")
    try:
        target = browser.send(
            "Target.createTarget", url=f"http://127.0.0.1:{served.port}/dashboard/studies/{served.study_id}/trials"
        )["targetId"]
        session = browser.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        deadline, text = time.time() + 60, ""
        while time.time() < deadline and not ("dash_study" in text and "Trial 3" in text):
            time.sleep(0.5)
            text = browser.evaluate(session, "document.body ? document.body.innerText : ''") or ""
        assert "dash_study" in text and "Trial 1" in text and "Trial 3" in text, text[:2000]  # the trial list
        answers = browser.evaluate(
            session,
            f"""Promise.all([
            fetch('/api/studies/{served.study_id}', {{method: 'DELETE'}}),
            fetch('/api/studies/{served.study_id}/rename', {{method: 'POST',
                  headers: {{'Content-Type': 'application/json'}},
                  body: JSON.stringify({{study_name: 'renamed'}})}}),
        ]).then(rs => Promise.all(rs.map(async r => [r.status, await r.text()])))""",
        )
    finally:
        browser.close()
    assert [status for status, _ in answers] == [405, 405]
    assert all("--allow-writes" in json.loads(body)["reason"] for _, body in answers)
    assert optuna.get_all_study_names(study_url) == ["dash_study"]
