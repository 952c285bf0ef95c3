"""Time the deployed form of a study's trials again, side by side, for `export --pick fastest-within`.

A trial times its deployed form once, beside whatever else runs then: on 2 CPU cores, with the
other trial running, one configuration measured 20-60% above its quiet time and the order of
configurations that do the same work was noise (`experiments/sst2_latency/README.md`). `retime` rebuilds
each candidate's configuration on the study's backbone in this process, deploys it as the trial
did (`costs.deployed_latency_ms`: LoRA merged where it can be), and times one batch of the same
search-dev rows in interleaved rounds, each round timing every candidate once, so that drift hits
all of them alike. Latency depends on the structure, not on trained values: the modules are
freshly initialised. Each candidate is a copy of the backbone, so at most `MAX_CANDIDATES` (those
the study timed fastest) are re-timed, and fewer when the copies would not fit in memory.

Example:
    >>> times = retime(study, trials)        # {trial number: median ms}    # doctest: +SKIP
"""

from __future__ import annotations

import copy
import statistics

from ..errors import ConfigError
from ..study.header import StudyHeader

__all__ = ["retime", "ROUNDS", "MAX_CANDIDATES"]

ROUNDS = 15
MAX_CANDIDATES = 8
_MEMORY_SHARE = 0.5  # of the memory available now, what the copies may take


def retime(
    study, trials: list, rounds: int = ROUNDS, device: str | None = None, limit: int = MAX_CANDIDATES
) -> dict[int, float]:
    """``{trial number: median ms}`` of one forward pass of the study's latency batch, timed here in
    ``rounds`` interleaved rounds; the trials beyond ``limit``, or beyond what can be copied, are
    left out (the ones the study timed slowest first). ConfigError when the backbone or the data
    cannot be read here."""
    import torch

    from ..core.inject import apply_petl
    from ..study.records import StoredTrial
    from ..tasks import load_splits, resolve_task
    from ..tasks.encoding import encode
    from ..training.costs import LATENCY_BATCH, deployed_latency_ms
    from ..training.loading import load_backbone

    header = StudyHeader.of(study)
    fidelity = header.fidelity
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        task = resolve_task(header.task_ref)
        splits = load_splits(
            task,
            data_dir=header.data_dir,
            k=fidelity.get("k"),
            data_seed=header.data_seed,
            search_dev_size=fidelity.get("search_dev", 500),
        )
        base, tok = load_backbone(header.backbone_spec, task, splits)
    except (ConfigError, OSError) as e:
        raise ConfigError(
            f"the candidates cannot be timed again here ({e}); --no-retime picks by the latencies the trials measured"
        ) from None
    batch = next(
        iter(encode(splits, tok, fidelity.get("max_length", 128)).search_dev.batches(LATENCY_BATCH, shuffle=False))
    )
    stored = [StoredTrial.of(t) for t in trials]
    ordered = sorted(stored, key=lambda t: t.latency_ms if t.latency_ms is not None else float("inf"))
    ordered = ordered[: min(limit, _copies_that_fit(base, device))]
    models = {}
    for t in ordered:
        torch.manual_seed(0)
        model = apply_petl(copy.deepcopy(base).to(device), t.config())
        deployed_latency_ms(model, batch, device, repeats=1)  # merges; warms up
        models[t.number] = model
    times: dict[int, list[float]] = {n: [] for n in models}
    for _ in range(rounds):
        for n, model in models.items():
            times[n].append(deployed_latency_ms(model, batch, device, repeats=1, warm_ups=0))
    return {n: statistics.median(v) for n, v in times.items()}


def _copies_that_fit(model, device) -> int:
    """How many copies of ``model`` fit in half the memory ``device`` has free now (at least 1)."""
    import torch

    size = sum(p.numel() * p.element_size() for p in model.parameters())
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = _available_bytes()
    return max(1, int(_MEMORY_SHARE * free // max(1, size))) if free is not None else MAX_CANDIDATES


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
