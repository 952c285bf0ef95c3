"""One-shot structure search: train one network that holds every candidate, read configurations off it.

A *supernet* (`supernet.py`) is an ordinary PETL model, built by `apply_petl` from a space, whose
every LoRA rank component, adapter unit, Compacter column and prefix or multi-head adapter position
sits behind its own hard-concrete gate (`gates.py`).
Training it under a penalty on the expected deployable count (a Lagrange multiplier drives that
expectation to a target) lets the data decide which components are worth their parameters.
`derive.py` then reads, for any budget, the configuration made of the components most likely to be
open, as a plain `PetlConfig` whose exact count `budget.py` checks; a study trains it from scratch
like any trial. `run.py` makes one run a job for whichever process takes it (a Ray Tune trial with
the Ray executor, on a GPU where the cluster has one); `propose.py` puts its proposals in the study.
`knobs.py` searches the supernet's own knobs (learning rates, the penalty's step, the gates'
temperature) with Optuna across a few runs, comparing them by their proposals' search-dev scores
with the supernet's own weights (`inherit.py`: every gate exactly open or shut, no training).

What the supernet holds: LoRA on every attention and FFN weight the space allows, a parallel
adapter and a parallel Compacter at each position the space allows them, and a flat prefix and a
multi-head adapter at attention where it allows them, on every layer, at the largest size that
alone fits the budget; where the space allows UniPELT's input gates, one more gate per LoRA,
adapter, Compacter and multi-head adapter instance choosing between the module with its gate and
without; BitFit (every backbone bias, one gate) and trained LayerNorms (every norm's weight and
bias, one gate) where the space allows them and they fit; a soft prompt at the space's longest
length that fits, one gate per position.
"""

from .derive import derive, ladder
from .gates import HardConcrete
from .supernet import Supernet, build_supernet

__all__ = ["HardConcrete", "Supernet", "build_supernet", "derive", "ladder"]
