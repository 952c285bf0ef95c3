"""Texts given to `predict`: how long one may be and how much of it is shown back.

The rule: a text (a line of a .txt input, a cell of a table) over `MAX_TEXT_BYTES` (UTF-8, changed
with ``predict --max-text-bytes``) is refused in one line before it is tokenized, since the model
reads only the run's ``max_length`` tokens of it and tokenizing 22 MB took 3.3 GB and 45 s; an
answer or an error line shows at most `ECHO_CHARS` characters of a text.
"""

from __future__ import annotations

from ..errors import ConfigError

MAX_TEXT_BYTES = 100_000
ECHO_CHARS = 200


def echo(text: str, limit: int = ECHO_CHARS) -> str:
    """``text`` as an answer or error shows it: its first ``limit`` characters, then "..." if cut."""
    return text if len(text) <= limit else text[:limit] + "..."


def check_size(text: str, where: str, max_bytes: int = MAX_TEXT_BYTES) -> None:
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise ConfigError(f"{where}: {size:,} bytes, over --max-text-bytes {max_bytes:,} (starts {echo(text, 20)!r})")


__all__ = ["MAX_TEXT_BYTES", "ECHO_CHARS", "echo", "check_size"]
