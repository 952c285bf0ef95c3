"""What a user gets from `pip install petl-nas` (a wheel, not this editable checkout): every module
of the source tree, the search spaces and presets, the dashboard code. A subpackage left out of
pyproject.toml's list works here (CI installs editable) and fails for everyone else."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def shipped_files(source: Path, package: str) -> set[str]:
    return {
        f"{package}/{p.relative_to(source).as_posix()}"
        for p in source.rglob("*")
        if p.is_file() and p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts
    }


@pytest.mark.slow
def test_the_wheel_holds_every_module_space_and_dashboard_file(tmp_path):
    source = tmp_path / "source"  # a clean copy: a build/ folder left in the checkout would be packed
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "petl_nas", "search_space"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(
            ROOT / name,
            source / name,
            **({"ignore": shutil.ignore_patterns("__pycache__")} if (ROOT / name).is_dir() else {}),
        )
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if build.returncode != 0 and "No module named" in build.stderr:
        pytest.skip(f"cannot build a wheel here: {build.stderr.strip().splitlines()[-1]}")
    assert build.returncode == 0, build.stderr
    (wheel,) = tmp_path.glob("petl_nas-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = shipped_files(ROOT / "petl_nas", "petl_nas") | shipped_files(
        ROOT / "search_space", "petl_nas/search_space"
    )
    assert {
        "petl_nas/search/oneshot/supernet.py",
        "petl_nas/search_space/presets.yaml",
        "petl_nas/dashboards/readonly.py",
        "petl_nas/core/backbones/bert.py",
    } <= expected
    assert sorted(expected - names) == []
