"""PETL modules, one file per functional form (VeRA, FourierFT among them), plus the composition and the attention function they share."""

from .adapter import Bottleneck
from .compose import Composition, Gate, as_param_dtype
from .fourierft import FourierFT
from .head_attention import ATTENTION_NAME, HeadEdits
from .lora import LoRA
from .mh_adapter import MultiHeadAdapter
from .phm import CompacterAdapter, PHMLinear, SharedRule
from .prefix import PrefixEncoder
from .prompt import SoftPrompt
from .shared_read import SharedRead
from .vera import VeraBases, VeRA

__all__ = ["Bottleneck", "Composition", "Gate", "as_param_dtype", "ATTENTION_NAME", "HeadEdits", "LoRA",
           "MultiHeadAdapter", "CompacterAdapter", "PHMLinear", "SharedRead", "SharedRule", "PrefixEncoder", "SoftPrompt",
           "FourierFT", "VeraBases", "VeRA"]
