"""The read-only commands open a study without importing torch, Ray or transformers: `export --list`,
`export`, `report` and `dashboard` (serving a browser's first requests), each in a fresh interpreter on
a real tiny study, with a finder on the import path that records who imports a heavy module first. The
tiny study's trials learn too little to be picked, so `export` writes the preset it trained: the
record a picked trial gets, from the same code."""

import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import REPO

HEAVY = ("torch", "ray", "transformers")

# Runs one read in a fresh interpreter; prints {heavy module: the petl_nas frames that imported it}.
PROBE = """
import json, sys, traceback
HEAVY, seen = set(json.loads(sys.argv[1])), {}

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name in HEAVY and name not in seen:
            seen[name] = [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack() if "petl_nas" in f.filename]
        return None

sys.meta_path.insert(0, Watch())
argv = json.loads(sys.argv[2])
if argv[0] == "dashboard":  # serve a browser's first requests, then stop as Ctrl-C would
    import socketserver, threading, urllib.request
    serve_forever = socketserver.BaseServer.serve_forever

    def browse_then_stop(server, *args):
        thread = threading.Thread(target=serve_forever, args=(server, *args))
        thread.start()
        try:
            base = f"http://127.0.0.1:{server.server_port}"
            studies = json.load(urllib.request.urlopen(base + "/api/studies"))["study_summaries"]
            assert studies, "the dashboard found no study"
            for page in ("/", f"/api/studies/{studies[0]['study_id']}"):
                assert urllib.request.urlopen(base + page).status == 200, page
        finally:
            server.shutdown()
            thread.join()

    socketserver.BaseServer.serve_forever = browse_then_stop
from petl_nas.app.cli import main
assert main(argv) == 0, argv
print("heavy imports:", json.dumps(seen))
"""


def heavy_imports(argv: list[str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(HEAVY), json.dumps(argv)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("heavy imports: ")]
    return json.loads(line.removeprefix("heavy imports: "))


@pytest.mark.parametrize(
    "command",
    ["export --list", "export --preset pfeiffer -o {out}/best.yaml", "report -o {out}/report", "dashboard --port 0"],
)
def test_a_read_imports_neither_torch_nor_ray(small_study, tmp_path, command):
    url = small_study[0]
    argv = command.format(out=tmp_path).split() + ["--storage", url]
    imported = heavy_imports(argv)
    assert not imported, "\n".join(
        f"{argv[0]} imported {name} through:\n  " + "\n  ".join(frames) for name, frames in imported.items()
    )
    if command.startswith("export --preset"):
        assert yaml.safe_load((tmp_path / "best.yaml").read_text())["petl_config"]
    if command.startswith("report"):
        assert (tmp_path / "report" / "report.html").exists()
