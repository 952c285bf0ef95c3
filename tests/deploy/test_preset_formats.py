"""Which loadable formats each preset converts to, measured: every preset of
`search_space/presets.yaml` is trained one step on a tiny BERT with mean pooling (what ``pooling:
auto`` reads on the default backbone, all-MiniLM-L6-v2) and converted to each `convert` target
(each conversion reloads and checks itself, or writes nothing); the AdapterHub column is whether
`interop.to_adapters` expresses its configuration. The table in docs/export-and-deploy.md ("Formats each preset
exports to") must be this one.
"""

import dataclasses
import re
from pathlib import Path

import pytest

from petl_nas.core.presets import preset, preset_names
from petl_nas.deploy.convert import TARGETS, convert
from petl_nas.deploy.interop import NotExpressible, to_adapters
from petl_nas.deploy.runs import train_record
from petl_nas.errors import ConfigError

pytest.importorskip("peft")
pytest.importorskip("sentence_transformers")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")]

TINY_BERT = {"tiny": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}}
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "export-and-deploy.md"


def formats(name: str, folder: Path) -> list[str]:
    config = dataclasses.replace(preset(name, hidden_size=32), pooling="mean")
    rec = {
        "backbone": TINY_BERT,
        "task": "demo_sentiment",
        "data_dir": None,
        "data_seed": 111,
        "k": 16,
        "seeds": 1,
        "counts": {},
        "petl_config": config.to_dict(),
        "recipe": {"lr": 1e-2, "epochs": 1, "batch_size": 16, "max_length": 16},
    }
    train_record(rec, out=folder / "run", progress=False, printer=lambda *a: None)
    out = []
    for to in TARGETS:
        try:
            convert(folder / "run" / "seed_0", folder / to, to)
            out.append(to)
        except ConfigError:
            pass
    try:
        to_adapters(config, 32, 2)
        out.append("AdapterHub config")
    except NotExpressible:
        pass
    return out


def documented() -> dict[str, list[str]]:
    text = GUIDE.read_text(encoding="utf-8").split("### Formats each preset exports to", 1)[1]
    table = re.search(r"^\| preset \| formats \|\n\|---\|---\|\n((?:\|.*\n)+)", text, flags=re.M).group(1)
    rows = re.findall(r"^\| `(\w+)` \| ([^|]*) \|", table, flags=re.M)
    return {
        name: [f.strip() for f in cell.replace("`", "").split(",") if f.strip() and f.strip() != "none"]
        for name, cell in rows
    }


def test_the_guides_preset_table_is_measured(tmp_path):
    measured = {name: formats(name, tmp_path / name) for name in preset_names()}
    assert documented() == measured
