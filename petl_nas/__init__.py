"""petl-nas: search the design space of parameter-efficient transfer learning.

The core API (no optuna or ray imported here):

    >>> from petl_nas import PetlConfig, ModuleSpec, apply_petl, count_parameters, preset  # doctest: +SKIP
    >>> model = apply_petl(model, preset("unipelt_apl", model.config))                      # doctest: +SKIP
"""

from .budget import ParameterCount, count_model, count_parameters
from .config import ConfigError, ModuleSpec, PetlConfig
from .inject import apply_petl, load_petl, petl_disabled, petl_state_dict, remove_petl, save_petl
from .presets import preset, preset_names


def load(backbone, directory):
    """A fresh backbone with the trained PETL modules saved in ``directory`` (see `deploy.load`)."""
    from .deploy import load as _load

    return _load(backbone, directory)

__version__ = "0.1.0"

__all__ = [
    "PetlConfig", "ModuleSpec", "ConfigError",
    "apply_petl", "remove_petl", "petl_disabled", "petl_state_dict", "save_petl", "load_petl",
    "count_parameters", "count_model", "ParameterCount",
    "preset", "preset_names", "load", "__version__",
]
