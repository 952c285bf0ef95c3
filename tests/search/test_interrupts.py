"""A stop dropped inside a finaliser is not printed, and is raised again; other errors there still are."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import os, signal
    from petl_nas.search.interrupts import stops_on_signals, raise_if_stopped, Stopped

    class StopsWhileCollected:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)    # the handler runs inside the finaliser
            sum(range(1000))

    class FailsWhileCollected:
        def __del__(self):
            raise ValueError("a finaliser's own error")

    try:
        with stops_on_signals():
            FailsWhileCollected()
            StopsWhileCollected()
            sum(range(1000))
            raise_if_stopped()
            print("not stopped")
    except Stopped as stop:
        print("stopped", stop.signum)
""")


def test_a_stop_in_a_finaliser_is_kept_off_stderr_and_raised_again():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "stopped 15"
    assert "Stopped" not in done.stderr
    assert "ValueError: a finaliser's own error" in done.stderr  # other unraisable errors still said
