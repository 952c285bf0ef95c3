"""A suite's whole plan checked before its first study trains: every study's input (its task and
data, backbone, space, budget, rates file) as `petl_nas.search.inputs.check_inputs` checks one
search's, so a mistake in the last task is said at once, not after the earlier studies have trained.

The rule: nothing is written while checking, and the first problem is one `ConfigError` line naming
the suite file, the task and the budget, in the suite's own terms (its keys, not search's flags).
"""

from __future__ import annotations

from ..errors import ConfigError
from .config import Suite, in_suite_terms


def check_plan(suite: Suite) -> None:
    """Check every study of ``suite``, in running order; one line for the first that cannot run."""
    from ..search.inputs import check_inputs  # torch: only when a suite is about to run

    for label, budget, exp in suite.in_running_order():
        try:
            check_inputs(exp)
        except ConfigError as e:
            raise ConfigError(f"{suite.source}: {label} at {budget}: {in_suite_terms(str(e))}") from None


__all__ = ["check_plan"]
