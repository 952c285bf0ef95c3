"""Named presets (`search_space/presets.yaml`): every paper method as a `PetlConfig`.

Sizes written ``d/16`` resolve against the backbone's hidden size, so presets scale with it
(for Compacter, rounded up to a multiple of phm_n, which PHM layers need).

Example:
    >>> preset("lora").modules[0].size
    8
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

from ..errors import ConfigError, suggest
from .config import PetlConfig

_RATIO = re.compile(r"^d\s*/\s*(\d+)$")


def space_dir() -> Path:
    """The `search_space/` folder: the repository's, or the copy installed with the package."""
    repo = Path(__file__).resolve().parents[2] / "search_space"  # petl_nas/core/presets.py
    if repo.is_dir():
        return repo
    return Path(str(resources.files("petl_nas") / "search_space"))


@lru_cache(maxsize=1)
def _raw_presets() -> dict:
    data = yaml.safe_load((space_dir() / "presets.yaml").read_text(encoding="utf-8"))
    return data["presets"]


def preset_names() -> list[str]:
    """The names `preset` takes (`search_space/presets.yaml`): houlsby, lora, unipelt_apl, ..."""
    return list(_raw_presets())


def check_preset_names(names) -> None:
    """ConfigError for the first name that is not a preset (``auto`` and ``none`` are fine)."""
    if names in ("auto", "none", None):
        return
    unknown = [n for n in names if n not in preset_names()]
    if unknown:
        raise ConfigError(f"presets: unknown name {unknown[0]!r}{suggest(unknown[0], preset_names())}")


def preset_doc(name: str) -> str:
    return _raw_presets()[name].get("doc", "")


def preset_entry(name: str) -> dict:
    """The preset ``name`` as `search_space/presets.yaml` writes it: the PetlConfig's fields, sizes
    such as ``d/16`` unresolved, without its description and learning rate."""
    raw = _raw_presets()
    if name not in raw:
        raise ConfigError(f"preset: unknown name {name!r}{suggest(name, raw)}")
    return {k: v for k, v in raw[name].items() if k not in ("doc", "lr", "budget_baseline")}


def budget_baseline_presets() -> list[str]:
    """The presets marked ``budget_baseline: true``: today's small-budget methods, each a baseline at
    every budget where some shape of it fits (`petl_nas.search.baselines.family_baselines`)."""
    return [name for name, entry in _raw_presets().items() if entry.get("budget_baseline")]


def preset_lr(name: str) -> float:
    """The learning rate the preset's paper trains it with (used when a study seeds it)."""
    return float(_raw_presets()[name]["lr"])


def preset(name: str, model_config=None, hidden_size: int | None = None) -> PetlConfig:
    """The preset ``name`` as a PetlConfig; ``d/N`` sizes need the backbone's hidden size."""
    body = preset_entry(name)
    d = hidden_size or (model_config.hidden_size if model_config is not None else None)
    mods = []
    for i, m in enumerate(body.get("modules", [])):
        m = dict(m)
        match = _RATIO.match(str(m.get("size", "")))
        if match:
            if d is None:
                raise ConfigError(
                    f"preset {name}: modules[{i}].size is {m['size']}, which needs the "
                    f"backbone's hidden size (pass model_config or hidden_size)"
                )
            size = max(1, d // int(match.group(1)))
            if m.get("form") == "compacter":  # PHM layers need n | size: round up to a multiple of n
                n = int(m.get("phm_n", 4))
                size = -(-size // n) * n
            m["size"] = size
        mods.append(m)
    body["modules"] = mods
    try:
        return PetlConfig.from_dict(body)
    except ConfigError as e:
        raise ConfigError(f"preset {name}: {e}") from None


__all__ = [
    "preset",
    "preset_names",
    "check_preset_names",
    "preset_doc",
    "preset_entry",
    "preset_lr",
    "space_dir",
    "budget_baseline_presets",
]
