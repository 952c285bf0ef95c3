"""Writing files whole or not at all: a reader (or a killed run, or a full disk) never sees half
a file or half a folder under its final name, and an error names the file asked for, not the
temporary one beside it.

Example:
    >>> atomic_write(Path("best.yaml"), lambda tmp: Path(tmp).write_text("a: 1\\n"))    # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path


def atomic_write(path: Path, write) -> None:
    """``write(tmp)`` fills a temporary file beside ``path``, which is flushed to disk and then
    renamed over ``path``: readers see the old file or the new one, never half of one."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:  # name the file asked for, not the temporary one
        raise OSError(e.errno, f"cannot write here ({e.strerror})", str(path)) from None
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        with _named_as(path):
            write(tmp)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; keep the usual file mode
            with open(tmp, "rb") as f:  # on disk before the rename, so a power cut cannot
                os.fsync(f.fileno())  # leave an empty file under the final name
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_folder(path: Path, write) -> None:
    """``write(tmp)`` fills a temporary folder beside ``path``, which then replaces ``path``: a
    failed write (a full disk) leaves no half-written folder under the final name."""
    path = Path(path)
    try:
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    except OSError as e:
        raise OSError(e.errno, f"cannot write here ({e.strerror})", str(path)) from None
    try:
        with _named_as(path):
            write(tmp)
            if path.is_dir():
                shutil.rmtree(path)
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _named_as(path: Path):
    """An error writing a temporary file comes out naming ``path``, the file asked for; a full disk
    reported by a library in its own words (safetensors, tokenizers: "os error 28") as one too."""
    try:
        yield
    except OSError as e:
        raise OSError(e.errno, e.strerror or str(e), str(path)) from None
    except Exception as e:  # noqa: BLE001 - re-raised as it is unless a full disk
        if "os error 28" not in str(e) and "No space left on device" not in str(e):
            raise
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from None


__all__ = ["atomic_write", "atomic_folder"]
