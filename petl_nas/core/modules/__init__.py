"""PETL modules, one file per functional form (IA3's vectors and LN-tuning's norms share `vectors`), plus the
composition and the attention function they share."""

from .adapter import Bottleneck
from .compose import Composition, Gate, as_param_dtype
from .dora import DoRA
from .fourierft import FourierFT
from .head_attention import ATTENTION_NAME, HeadEdits
from .lokr import LoKr
from .lora import LoRA
from .mh_adapter import MultiHeadAdapter
from .phm import CompacterAdapter, PHMLinear, SharedRule
from .prefix import PrefixEncoder
from .prompt import SoftPrompt
from .shared_read import SharedRead
from .vectors import NormCopy, ScaleInput, ScaleOutput
from .vera import VeRA, VeraBases

__all__ = [
    "Bottleneck",
    "Composition",
    "Gate",
    "as_param_dtype",
    "ATTENTION_NAME",
    "HeadEdits",
    "LoRA",
    "DoRA",
    "LoKr",
    "MultiHeadAdapter",
    "CompacterAdapter",
    "PHMLinear",
    "SharedRead",
    "SharedRule",
    "PrefixEncoder",
    "SoftPrompt",
    "NormCopy",
    "ScaleInput",
    "ScaleOutput",
    "FourierFT",
    "VeraBases",
    "VeRA",
]
