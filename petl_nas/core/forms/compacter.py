"""Compacter (Mahabadi et al., 2021): a bottleneck adapter whose projections are PHM layers, sums
of n Kronecker products of a rule shared by every layer and per-layer low-rank fast matrices."""

from __future__ import annotations

from .adapter import Adapter
from .base import register


class Compacter(Adapter):
    name, title = "compacter", "Compacter"
    keys = ("nonlinearity", "init", "phm_n", "phm_rank")
    dimensions = ("insertion", "composition", "bottleneck", "scale", "nonlinearity", "init", "phm_n", "blocks")
    supernet_rank = 2

    def shared(self, spec):
        from ..modules import SharedRule

        return SharedRule(spec.phm_n)

    def layer(self, spec, at):
        from ..modules import CompacterAdapter

        return CompacterAdapter(spec, at.d, at.shared, at.causal)

    def spec_fields(self, site, values):
        n = int(values["phm_n"])  # PHM layers need n | size: round up
        return {**super().spec_fields(site, values), "phm_n": n, "size": -(-int(values["bottleneck"]) // n) * n}

    def space_values(self, spec):
        return {**super().space_values(spec), "phm_n": spec.phm_n}

    def size_step(self, values):
        return int(values.get("phm_n", 1))

    def supernet_fields(self, site, space, gate):
        return {"insertion": "parallel", "init": "lora", "phm_n": space.smallest("phm_n") or 4, **gate}

    def describe(self, spec):
        return [f"n={spec.phm_n}", *super().describe(spec)]

    def adapters_config(self, spec, hidden_size, leave_out, scaling, where, reasons):
        return {
            **super().adapters_config(spec, hidden_size, leave_out, scaling, where, reasons),
            "phm_layer": True,
            "phm_dim": spec.phm_n,
            "phm_rank": spec.phm_rank,
            "shared_phm_rule": True,
            "factorized_phm_rule": False,
            "learn_phm": True,
        }


COMPACTER = register(Compacter())
