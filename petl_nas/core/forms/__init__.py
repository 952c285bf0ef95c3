"""The functional forms of the design space, one file each (adapter, compacter, lora, prefix,
mh_adapter), and their registry. Every module of this package is imported here, so a new form is
one file holding a `Form` subclass and its ``register(...)`` line; `config`, `inject`, the search
space, the description, the one-shot supernet and the PEFT / AdapterHub mappings read forms from
the registry and name none of them.
"""

import importlib
import pkgutil

from .base import COMMON_KEYS, INITS, Form, all_forms, form_named, form_names, register, registered

for _info in pkgutil.iter_modules(__path__):
    if _info.name != "base":
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["Form", "COMMON_KEYS", "INITS", "register", "registered", "form_named", "form_names", "all_forms"]
