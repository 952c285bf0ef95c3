"""``petl-nas doctor``: what this environment has and lacks for petl-nas, and the command that fixes
each gap.

Essentials (any one failing makes the exit status 1): Python and every required package at the
versions the package metadata asks for, and the storage answering (``--storage``; default the
quickstart's SQLite file, created on first use). Reported without failing: GPUs, the CPU threads
a training process would take and why (`petl_nas.training.threads`), Ray importable
(started too with ``--start-ray``, which then counts as essential), the optional extras read from
the same metadata, GLUE data, and whether the Hugging Face hub is reachable.

Example:
    >>> checks = diagnose()                      # doctest: +SKIP
    >>> print(render(checks))                    # doctest: +SKIP
"""

from __future__ import annotations

import os
import platform
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

DIST = "petl-nas"
DEFAULT_STORAGE = "sqlite:///runs/quickstart/study.db"
_EXTRA = re.compile(r'extra\s*==\s*"([^"]+)"')


@dataclass
class Check:
    """One line of the report: ``status`` is ``ok``, ``FAIL`` (an essential is missing), ``warn``
    (something optional is missing) or ``info``; ``fix`` is the command that mends it."""

    name: str
    status: str
    detail: str
    fix: str = ""


def _pip(extra: str | None = None, package: str | None = None) -> str:
    """The install command for an extra (a source checkout installs itself editable)."""
    if package:
        return f"pip install {package}"
    root = Path(__file__).resolve().parents[2]  # petl_nas/app/doctor.py: the checkout
    if (root / "pyproject.toml").is_file():
        where = "." if Path.cwd().resolve() == root else str(root)
        return f'pip install -e "{where}[{extra}]"' if extra else f'pip install -e "{where}"'
    return f'pip install "petl-nas[{extra}]"' if extra else "pip install petl-nas"


def requirements() -> tuple[list, dict[str, list]]:
    """(required, {extra: requirements}) from the installed package's metadata."""
    from packaging.requirements import Requirement

    core: list = []
    extras: dict[str, list] = {}
    for line in metadata.requires(DIST) or []:
        req = Requirement(line)
        m = _EXTRA.search(str(req.marker)) if req.marker else None
        if m is None:
            core.append(req)
        else:
            extras.setdefault(m.group(1), []).append(req)
    return core, extras


def check_requirement(req, extra: str | None = None) -> Check:
    """Is ``req`` installed at a version it accepts? Missing required ones FAIL, optional ones warn."""
    bad = "warn" if extra else "FAIL"
    spec = str(req.specifier) or "any version"
    label = f"{req.name} (extra {extra})" if extra else req.name
    try:
        have = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        return Check(label, bad, f"not installed (needs {spec})", _pip(extra) if extra else _pip(package=str(req)))
    if req.specifier and not req.specifier.contains(have, prereleases=True):
        return Check(label, bad, f"{have} installed, needs {spec}", _pip(package=f'"{req}"'))
    return Check(label, "ok", f"{have} ({spec})")


def check_python() -> Check:
    from packaging.specifiers import SpecifierSet

    needs = metadata.metadata(DIST).get("Requires-Python") or ""
    have = platform.python_version()
    if needs and not SpecifierSet(needs).contains(have):
        return Check(
            "python",
            "FAIL",
            f"{have} at {sys.executable}, needs {needs}",
            f"install Python {needs} and create the virtual environment with it",
        )
    return Check("python", "ok", f"{have} ({needs or 'any'}) at {sys.executable}")


def check_gpus() -> Check:
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - a broken or mismatched build raises more than ImportError
        return Check(
            "gpus",
            "FAIL",
            f"torch is installed but cannot be imported ({type(e).__name__}: {str(e).splitlines()[0]})",
            "pip install --force-reinstall torch",
        )

    cores = os.cpu_count() or 1
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return Check(
            "gpus",
            "ok",
            f"{len(names)} CUDA device(s): {', '.join(names)}; torch {torch.__version__} "
            f"(CUDA {torch.version.cuda}); {cores} CPU cores; fidelity.cuda_graphs: true "
            f"replays each trial's steps as CUDA graphs (6.7x the trials per hour on one H100)",
        )
    has_driver = any((Path(d) / "nvidia-smi").is_file() for d in os.environ.get("PATH", "").split(os.pathsep))
    if has_driver and torch.version.cuda is None:
        return Check(
            "gpus",
            "warn",
            f"nvidia-smi is here but torch {torch.__version__} is a CPU build",
            "pip install --force-reinstall torch  (the CUDA build from PyPI)",
        )
    from ..core.precision import cpu_has_native_bf16

    bf16 = (
        "; the CPU computes bf16 natively: a new study's trials train in bf16 here (fidelity.precision: "
        "native, the default; 1.6x the trials per hour at equal scores)"
        if cpu_has_native_bf16()
        else "; no native bf16 on this CPU: a new study's trials train in full precision (fidelity.precision: "
        "native, the default)"
    )
    return Check("gpus", "info", f"no CUDA GPU (torch {torch.__version__}): trials run on the CPU, {cores} cores{bf16}")


def check_threads() -> Check:
    """The CPU threads a process that trains or predicts here would take now, and why."""
    from ..training.threads import choose

    c = choose()
    return Check(
        "cpu threads",
        "info",
        f"{c.threads} for a process that trains or predicts now ({c.reason}); "
        f"re-chosen at most once a minute as the load changes; a search's trials "
        f"take one each (cpus_per_trial)",
    )


def check_ray(start: bool = False) -> Check:
    try:
        import ray
    except Exception as e:  # noqa: BLE001 - a broken install raises more than ImportError
        return Check(
            "ray runtime", "FAIL", f"cannot be imported ({type(e).__name__}: {e})", _pip(package='"ray[tune]"')
        )
    if not start:
        return Check("ray runtime", "ok", f"{ray.__version__} importable (--start-ray also starts a local instance)")
    if ray.is_initialized():
        return Check("ray runtime", "ok", f"{ray.__version__}: already running in this process")
    from ..search.executors import private_ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    t = time.perf_counter()
    try:  # "local": a fresh instance, not a cluster `ray start` left;
        with private_ray():  # as a search's own: on 127.0.0.1, Ray's own authentication
            ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
        ray.get(ray.remote(lambda: 1).remote())
    except Exception as e:  # noqa: BLE001
        return Check(
            "ray runtime",
            "FAIL",
            f"{ray.__version__} does not start: {str(e).splitlines()[0]}",
            "petl-nas search --executor local runs trials without Ray",
        )
    finally:
        ray.shutdown()
    return Check(
        "ray runtime",
        "ok",
        f"{ray.__version__}: a local instance started and ran a task in {time.perf_counter() - t:.1f}s",
    )


def check_storage(url: str) -> Check:
    """Reachable without writing: an SQLite file (or a folder it can be created in), or a server."""
    import sqlalchemy
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    from ..study.storage import redact, with_installed_driver

    name, shown = "storage", redact(url)  # a password is never printed
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :])
        if not path.exists():
            parent = next(p for p in path.absolute().parents if p.exists())
            try:  # a probe that leaves nothing behind
                tempfile.TemporaryDirectory(dir=parent).cleanup()
            except OSError as e:
                return Check(
                    name,
                    "FAIL",
                    f"{shown}: {path} cannot be created ({parent}: {e.strerror})",
                    "give --storage sqlite:///A/WRITABLE/PATH.db",
                )
            return Check(name, "ok", f"{shown}: not created yet; {parent} is writable")
    try:
        engine = sqlalchemy.create_engine(
            with_installed_driver(url),
            **({"connect_args": {"connect_timeout": 5}} if url.startswith("postgresql") else {}),
        )
    except (ArgumentError, NoSuchModuleError) as e:
        return Check(
            name,
            "FAIL",
            f"{shown}: not a database URL SQLAlchemy knows ({str(e).splitlines()[0]})",
            "sqlite:///runs/NAME/study.db or postgresql+psycopg2://USER:PASSWORD@HOST:5432/DB",
        )
    except ImportError as e:
        fix = _pip("postgres") if "psycopg" in str(e) else _pip(package=str(e.name or "the database driver"))
        return Check(name, "FAIL", f"{shown}: the database driver is not installed ({e})", fix)
    try:
        with engine.connect() as conn:
            studies = []
            if sqlalchemy.inspect(conn).has_table("studies"):
                studies = [r[0] for r in conn.execute(sqlalchemy.text("SELECT study_name FROM studies"))]
    except Exception as e:  # noqa: BLE001 - any driver error is one line
        return Check(
            name,
            "FAIL",
            f"{shown} unreachable: {str(e.__cause__ or e).splitlines()[0]}",
            "start the server / check host, port, user and password in the URL",
        )
    finally:
        engine.dispose()
    held = f"{len(studies)} study(ies): {', '.join(studies[:5])}" if studies else "no studies yet"
    return Check(name, "ok", f"{shown} answers; {held}")


def check_glue(data_dir: str | None = None) -> Check:
    from ..places import glue_candidates, glue_tasks

    places = [Path(data_dir)] if data_dir else glue_candidates()
    for p in places:
        tasks = glue_tasks(p)
        if tasks:
            return Check("glue data", "ok", f"{p} ({', '.join(tasks)})")
    return Check(
        "glue data",
        "info",
        f"none in {', '.join(str(p) for p in places)}: the quickstart uses its demo task offline",
        "give --data-dir DIR with DIR/SST-2/{train,dev}.tsv",
    )


def check_hub() -> Check:
    from ..places import hub_status

    reachable, why = hub_status()
    if reachable:
        return Check("hugging face hub", "ok", f"{why}: hub model and dataset names work")
    return Check("hugging face hub", "info", f"{why}: use local model directories and --data-dir")


def diagnose(storage: str = DEFAULT_STORAGE, start_ray: bool = False, data_dir: str | None = None) -> list[Check]:
    try:
        core, extras = requirements()
    except metadata.PackageNotFoundError:
        return [Check("petl-nas", "FAIL", "the package is not installed in this Python", _pip())]
    checks = [Check("petl-nas", "ok", f"{metadata.version(DIST)} at {Path(__file__).resolve().parent}"), check_python()]
    checks += [check_requirement(r) for r in core]
    essentials_ok = all(c.status != "FAIL" for c in checks)
    for extra, reqs in extras.items():
        if extra != "dev":
            checks += [check_requirement(r, extra) for r in reqs]
    if essentials_ok:  # these import torch, ray and sqlalchemy
        checks += [check_gpus(), check_threads(), check_ray(start_ray), check_storage(storage)]
    checks += [check_glue(data_dir), check_hub()]
    return checks


def render(checks: list[Check]) -> str:
    lines = [f"  {c.status:<5} {c.name:<34} {c.detail}" + (f"\n        fix: {c.fix}" if c.fix else "") for c in checks]
    failed = [c.name for c in checks if c.status == "FAIL"]
    lines.append("essentials: ok" if not failed else f"essentials missing: {', '.join(failed)}")
    return "\n".join(lines)


def run(storage: str = DEFAULT_STORAGE, start_ray: bool = False, data_dir: str | None = None, printer=print) -> int:
    checks = diagnose(storage, start_ray, data_dir)
    printer("petl-nas doctor")
    printer(render(checks))
    return 1 if any(c.status == "FAIL" for c in checks) else 0


__all__ = ["Check", "diagnose", "render", "run", "check_requirement", "check_storage", "DEFAULT_STORAGE"]
