"""petl-nas's errors and the readers that raise them: `ConfigError` (one line that names the file,
key or value and what is accepted), `PetlWarning`, "did you mean" suggestions, unknown-key checks,
and reading text and YAML files so that a mistake in them is one such line.

Example:
    >>> try:
    ...     check_keys("experiment.yaml", {"budjet": 1}, ["budget", "trials"])
    ... except ConfigError as e:
    ...     print(e)
    experiment.yaml.budjet: unknown key (did you mean 'budget'?); accepted: budget, trials
"""

from __future__ import annotations

import difflib
from pathlib import Path

import yaml


class ConfigError(ValueError):
    """An invalid configuration; the message names the field, the value and what is accepted."""


class PetlWarning(UserWarning):
    """petl-nas's own warnings (the command line prints them as ``petl-nas: warning: ...`` lines)."""


def suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"{hint}; accepted: {', '.join(map(str, choices))}"


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key written twice in one mapping (YAML says keys are unique;
    PyYAML keeps the last, so an edited file would silently run the value the user meant to replace)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_text(path: str | Path) -> str:
    """The text of the file at ``path``, read as UTF-8 (a byte-order mark is not text); another
    encoding is one `ConfigError` naming the file, the line and the byte."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} on line {line}); save it as UTF-8"
        ) from None


def read_yaml(text: str, source: str | Path):
    """``text`` parsed as YAML; a mistake is one `ConfigError` naming ``source``, the line and column,
    and what is wrong (a key written twice included)."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        context = getattr(e, "context", None)
        raise ConfigError(f"{source}: not valid YAML{where}: {what}" + (f" ({context})" if context else "")) from None


def check_keys(where: str, data: dict, allowed, sep: str = ".") -> None:
    """Raise ConfigError for the first key of ``data`` not in ``allowed`` (with a suggestion)."""
    for k in data:
        if k not in allowed:
            raise ConfigError(f"{where}{sep}{k}: unknown key{suggest(k, list(allowed))}")


def error_line(e: ConfigError | OSError) -> str:
    """What a command says of ``e`` after ``petl-nas: error: ``: a ConfigError's own line, or the
    path an OSError could not read or write and why."""
    return f"{e.filename}: {e.strerror}" if isinstance(e, OSError) and e.filename else str(e)


__all__ = ["ConfigError", "PetlWarning", "suggest", "check_keys", "error_line", "read_text", "read_yaml"]
