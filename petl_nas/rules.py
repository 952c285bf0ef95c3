"""One validation dialect for every file and value petl-nas reads (experiment files, module specs,
export records): a rule is ``(ok, what)``, a test and the words for what it accepts, and
`check_fields` raises the first field that breaks its rule as one line,
``where.field: expected <what>, got <value>``, with a hint where YAML read a number as text.
A rule also carries the JSON Schema of what it accepts, and `option` declares a file's key as a
dataclass field with its rule and one-line meaning, so the docs and the schema are read off the
same declaration (`petl_nas.app.reference`).

Example:
    >>> try:
    ...     check_fields({"trials": "many"}, "e.yaml: ", {"trials": whole(1)})
    ... except ConfigError as e:
    ...     print(e)
    e.yaml: trials: expected a whole number >= 1, got 'many'
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from .errors import ConfigError


class Rule(tuple):
    """``(ok, what)``: a test and the words for what it accepts; ``schema``: the JSON Schema of the
    values it accepts (None where none was given)."""

    def __new__(cls, ok: Callable[[Any], bool], what: str, schema: dict | None = None):
        rule = super().__new__(cls, (ok, what))
        rule.schema = schema
        return rule


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


NUMBER = Rule(_is_number, "a number", {"type": "number"})
WHOLE = Rule(_is_whole, "a whole number", {"type": "integer"})
BOOL = Rule((lambda v: isinstance(v, bool)), "true or false", {"type": "boolean"})
TEXT = Rule(
    (lambda v: isinstance(v, str) and v.strip() != ""), "a non-empty string", {"type": "string", "pattern": "\\S"}
)


def whole(low: int) -> Rule:
    return Rule((lambda v: _is_whole(v) and v >= low), f"a whole number >= {low}", {"type": "integer", "minimum": low})


def number(low: float, strict: bool) -> Rule:
    """A finite number above ``low`` (``strict``) or at least ``low``: inf and nan are refused too."""
    ok = lambda v: _is_number(v) and math.isfinite(v) and (v > low if strict else v >= low)  # noqa: E731
    return Rule(
        ok,
        f"a number {'>' if strict else '>='} {low:g}",
        {"type": "number", ("exclusiveMinimum" if strict else "minimum"): low},
    )


def between(low: float, high: float) -> Rule:
    """A finite number above ``low`` and at most ``high``: a range a value must lie in to be sane."""
    ok = lambda v: _is_number(v) and math.isfinite(v) and low < v <= high  # noqa: E731
    return Rule(
        ok, f"a number above {low:g} and at most {high:g}", {"type": "number", "exclusiveMinimum": low, "maximum": high}
    )


def _either(*schemas) -> dict | None:
    return None if None in schemas else {"anyOf": list(schemas)}


def optional(rule: Rule) -> Rule:
    ok, what = rule
    return Rule(
        (lambda v: v is None or ok(v)), f"{what} or null", _either(getattr(rule, "schema", None), {"type": "null"})
    )


def auto_or(rule: Rule) -> Rule:
    ok, what = rule
    return Rule(
        (lambda v: v == "auto" or ok(v)), f"auto or {what}", _either({"const": "auto"}, getattr(rule, "schema", None))
    )


def one_of(*names) -> Rule:
    return Rule((lambda v: v in names), "one of " + ", ".join(names), {"enum": list(names)})


def list_of(rule: Rule, what: str) -> Rule:
    """A list (or tuple) whose every item keeps ``rule``; None passes (the field's default)."""
    ok, items = rule[0], getattr(rule, "schema", None)
    return Rule(
        (lambda v: v is None or (isinstance(v, (list, tuple)) and all(ok(x) for x in v))),
        f"a list of {what}",
        _either({"type": "null"}, items and {"type": "array", "items": items}),
    )


def option(
    default=dataclasses.MISSING,
    meaning: str = "",
    rule: Rule | Callable[[], Rule] | None = None,
    *,
    factory=dataclasses.MISSING,
    accepts: str | None = None,
    schema: dict | None = None,
):
    """A dataclass field that is a file's key: its ``default`` (or ``factory``), its one-line
    ``meaning``, and its ``rule`` (a `Rule`, or a function returning one, read when checked) that
    `field_rules` collects. A key checked elsewhere has no rule: ``accepts`` says what it takes and
    ``schema`` is its JSON Schema."""
    meta = {"meaning": meaning, "rule": rule, "accepts": accepts, "schema": schema}
    return dataclasses.field(default=default, default_factory=factory, metadata=meta)


def field_rules(cls) -> dict[str, Rule]:
    """The rule of every field of dataclass ``cls`` declared by `option` with one, in field order."""
    rules = {}
    for f in dataclasses.fields(cls):
        rule = f.metadata.get("rule")
        if rule is not None:
            rules[f.name] = rule if isinstance(rule, tuple) else rule()
    return rules


def check_fields(obj, where: str, rules: dict[str, Rule]) -> None:
    """`ConfigError` naming the first field of ``obj`` (attributes, or the keys a mapping has) whose
    value breaks its rule; ``where`` prefixes the field's name (``"e.yaml: "``, ``"module."``)."""
    for name, (ok, what) in rules.items():
        if isinstance(obj, dict):
            if name not in obj:
                continue
            value = obj[name]
        else:
            value = getattr(obj, name)
        if not ok(value):
            raise ConfigError(f"{where}{name}: expected {what}, got {value!r}{yaml_hint(value)}")


def yaml_hint(value) -> str:
    """YAML 1.1 reads ``1e-3`` (no dot) as text: say how to write it as a number."""
    if isinstance(value, str):
        try:
            n = float(value)
        except ValueError:
            return ""
        if math.isfinite(n) and "e" in value.lower():
            mantissa, _, exponent = value.lower().partition("e")
            return f" (YAML reads {value} as text: write {float(mantissa):.1f}e{exponent})"
    return ""


__all__ = [
    "Rule",
    "NUMBER",
    "WHOLE",
    "BOOL",
    "TEXT",
    "whole",
    "number",
    "between",
    "optional",
    "auto_or",
    "one_of",
    "list_of",
    "option",
    "field_rules",
    "check_fields",
    "yaml_hint",
]
