"""Texts given to `predict`: how long one may be, how much of it is shown back, and the rows that
texts given on the command line (``--text``) or on standard input make.

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


def given_texts(texts: list[str], where, max_bytes: int = MAX_TEXT_BYTES) -> dict[int, str]:
    """The texts of ``--text`` flags or standard input's lines, by their place (from 0), each checked
    by `check_size`; blank ones are not texts. ``where(i)`` names the i-th in an error."""
    for i, text in enumerate(texts):
        check_size(text, where(i), max_bytes)
    return {i: text for i, text in enumerate(texts) if text.strip()}


def rows_of(texts: dict[int, str], text_columns, where) -> list[tuple[str, ...]]:
    """One row per text of `given_texts`; a task that reads several texts a row takes them tab-separated."""
    columns = list(text_columns)
    rows = []
    for i, text in texts.items():
        row = tuple(text.split("\t")) if len(columns) > 1 else (text,)
        if len(row) != len(columns):
            raise ConfigError(
                f"{where(i)}: the model reads {len(columns)} texts a row ({', '.join(columns)}), "
                f"tab-separated; found {len(row)} (starts {echo(text, 20)!r})"
            )
        rows.append(row)
    return rows


__all__ = ["MAX_TEXT_BYTES", "ECHO_CHARS", "echo", "check_size", "given_texts", "rows_of"]
