"""petl-nas: search the design space of parameter-efficient transfer learning.

The core API (no optuna or ray imported here):

    >>> from petl_nas import PetlConfig, ModuleSpec, apply_petl, count_parameters, preset  # doctest: +SKIP
    >>> model = apply_petl(model, preset("unipelt_apl", model.config))                      # doctest: +SKIP

Names are imported on first use, so ``petl-nas doctor`` and ``--help`` work before torch is installed.
"""

from importlib import import_module

__version__ = "0.1.0"

_HOMES = {
    "ParameterCount": "core.budget",
    "count_model": "core.budget",
    "count_parameters": "core.budget",
    "ConfigError": "errors",
    "ModuleSpec": "core.config",
    "PetlConfig": "core.config",
    "apply_petl": "core.inject",
    "load_petl": "core.inject",
    "petl_disabled": "core.inject",
    "petl_state_dict": "core.inject",
    "remove_petl": "core.inject",
    "save_petl": "core.inject",
    "merge_lora": "core.inject",
    "merge_and_unload": "deploy.convert",
    "preset": "core.presets",
    "preset_names": "core.presets",
}

__all__ = [
    "PetlConfig",
    "ModuleSpec",
    "ConfigError",
    "apply_petl",
    "remove_petl",
    "petl_disabled",
    "petl_state_dict",
    "save_petl",
    "load_petl",
    "merge_lora",
    "merge_and_unload",
    "count_parameters",
    "count_model",
    "ParameterCount",
    "preset",
    "preset_names",
    "load",
    "__version__",
]


def load(backbone, directory):
    """A fresh backbone with the trained PETL modules saved in ``directory`` (see `deploy.runs.load`)."""
    from .deploy.runs import load as _load

    return _load(backbone, directory)


def __getattr__(name: str):
    if name in _HOMES:
        value = getattr(import_module(f".{_HOMES[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
