"""The export record: one configuration with everything `petl-nas train` needs to train it and where
it came from (`ExportRecord`), read (`read_record`, checked key by key) and written (`write_record`)
here only.

The YAML's layout is the record's fields in order (`RECORD_KEYS`); the recipe, counts and
provenance are written as they are given, so a record written by any earlier version reads, and
writes back, byte for byte. A hand-written record may leave out what it does not need: a field it
lacks reads as None, and the trainer gives it its default (`petl_nas.deploy.runs`).

Example:
    >>> rec = read_record("best.yaml")                                    # doctest: +SKIP
    >>> rec.config().modules, rec.training_recipe().epochs                # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..core.config import PetlConfig
from ..errors import ConfigError, read_text, read_yaml, suggest
from ..fileio import atomic_write
from ..rules import check_fields, number


@dataclass(frozen=True)
class ExportRecord:
    """A configuration to train, as ``petl-nas export`` writes it.

    Attributes:
        petl_nas_version: the version that wrote it.
        backbone: a local path, a hub name, or ``{"tiny": {...}}``; task: a task's name or a file
            task's mapping.
        data_dir, data_seed, k, search_dev: where the data is, the seed that carves it, the training
            rows (None: all) and the search-dev rows carved beside them.
        petl_config: the PetlConfig as a dict (`config`).
        recipe: `training.loop.Recipe` fields (`training_recipe`); those left out train at its defaults.
        seeds: how many seeds `train` runs; counts: deployable, trainable and backbone parameters.
        provenance: where it came from (storage, study, trial, scores, how it was picked).
    """

    petl_nas_version: str | None = None
    backbone: Any = None
    task: Any = None
    data_dir: str | None = None
    data_seed: int | None = None
    k: int | None = None
    search_dev: int | None = None
    petl_config: dict | None = None
    recipe: dict | None = None
    seeds: int | None = None
    counts: dict | None = None
    provenance: dict | None = None

    def to_dict(self) -> dict:
        """The record as the YAML holds it, keys in `RECORD_KEYS` order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict) -> ExportRecord:
        """A record from a mapping of its keys (unchecked: `read_record` checks a file's)."""
        return cls(**{key: data.get(key) for key in RECORD_KEYS})

    @classmethod
    def of(cls, rec: ExportRecord | dict) -> ExportRecord:
        """``rec`` itself, or the record a mapping of its keys holds."""
        return rec if isinstance(rec, ExportRecord) else cls.from_dict(rec)

    def config(self) -> PetlConfig:
        return PetlConfig.from_dict(self.petl_config)

    def training_recipe(self, **overrides):
        """The recipe as a `training.loop.Recipe` (keys it does not know left out), with ``overrides``
        where they are not None."""
        from ..training.recipe import Recipe

        fields = {k: v for k, v in (self.recipe or {}).items() if k in Recipe.__dataclass_fields__}
        return Recipe(**fields).with_overrides(**overrides)


RECORD_KEYS = tuple(f.name for f in dataclasses.fields(ExportRecord))


def make_parent(path: Path) -> None:
    """Create the folder ``path`` is written to; one clear line where a file stands in its way."""
    blocking = next((p for p in path.parents if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise ConfigError(f"output {str(path)!r} cannot be written: {blocking} is a file, not a folder")
    path.parent.mkdir(parents=True, exist_ok=True)


def write_record(rec: ExportRecord | dict, path: str | Path) -> Path:
    """Write ``rec`` to ``path``, whole or not at all: a record in `RECORD_KEYS` order, a mapping
    (a record read as YAML, say) as it is given."""
    path, data = Path(path), rec.to_dict() if isinstance(rec, ExportRecord) else dict(rec)
    make_parent(path)
    atomic_write(path, lambda p: Path(p).write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8"))
    return path


def read_record(path: str | Path) -> ExportRecord:
    """Read and check an export record; unknown keys and bad configs name the file and key."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config {str(path)!r}: no such file")
    rec = read_yaml(read_text(path), path)
    if not isinstance(rec, dict):
        raise ConfigError(f"{path}: expected a mapping of {', '.join(RECORD_KEYS)}")
    from ..study.experiment import Experiment

    searched = {f.name for f in dataclasses.fields(Experiment)} - set(RECORD_KEYS)
    for key in rec:
        if key in searched and not {"petl_config", "recipe"} & set(rec):
            raise ConfigError(
                f"{path}: this is an experiment file (key {key!r}): petl-nas search --experiment "
                f"runs it; train takes a record that petl-nas export writes"
            )
        if key not in RECORD_KEYS:
            raise ConfigError(f"{path}: unknown key {key!r}{suggest(key, RECORD_KEYS)}")
    for key in ("backbone", "task", "petl_config", "recipe"):
        if rec.get(key) is None:
            raise ConfigError(f"{path}: {key}: missing")
    record = ExportRecord.from_dict(rec)
    try:
        record.config()
    except ConfigError as e:
        raise ConfigError(f"{path}: petl_config.{e}") from None
    _check_recipe(path, record.recipe)
    return record


def _check_recipe(path: Path, recipe) -> None:
    """A record's recipe: known keys only (a misspelt one would silently train at the default) and
    positive sizes and rates."""
    from ..training.recipe import Recipe

    if not isinstance(recipe, dict):
        raise ConfigError(f"{path}: recipe: expected a mapping of {', '.join(Recipe.__dataclass_fields__)}")
    for key in recipe:
        if key not in Recipe.__dataclass_fields__:
            raise ConfigError(f"{path}: recipe.{key}: unknown key{suggest(key, Recipe.__dataclass_fields__)}")
    check_fields(
        recipe, f"{path}: recipe.", {key: number(0, True) for key in ("lr", "epochs", "batch_size", "max_length")}
    )


__all__ = ["ExportRecord", "RECORD_KEYS", "read_record", "write_record", "make_parent"]
