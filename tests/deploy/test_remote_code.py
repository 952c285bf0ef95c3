"""Every preset no standard library holds (adapters, Compacter, prefix, the multi-head adapter,
UniPELT's gates, a prompt after [CLS]) loads without petl-nas as a transformers folder with its own
modeling file: ``AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)``
in a subprocess that never imports petl_nas (`test_load_elsewhere.load_elsewhere`) gives the trained
model's logits to 1e-5. Each is trained one step on a mean-pooled tiny BERT, the default backbone's
pooling.
"""

import dataclasses
import json

import pytest
from test_load_elsewhere import TINY_BERT, load_elsewhere, trained, trained_logits

from petl_nas.core.presets import preset
from petl_nas.deploy.convert import convert

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*frozen pooler looks untrained"),
]

CARRIED = (
    "houlsby",
    "pfeiffer",
    "parallel_adapter",
    "scaled_pa",
    "mh_pa",
    "prefix",
    "mam",
    "mam_glue",
    "unipelt_ap",
    "unipelt_apl",
    "compacter",
    "compacter_pp",
    "prompt_tuning",
)


@pytest.mark.parametrize("name", CARRIED)
def test_each_preset_no_library_holds_loads_as_remote_code(tmp_path_factory, tmp_path, name):
    config = dataclasses.replace(preset(name, hidden_size=32), pooling="mean")
    run = trained(tmp_path_factory, TINY_BERT, config, k=16)
    done = convert(run, tmp_path / "out")
    assert done["to"] == "transformers-remote-code", done.get("why")
    assert "trust_remote_code=True" in done["load_with"]
    assert done["why"].startswith("no standard library holds it")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["auto_map"]["AutoModelForSequenceClassification"] == "modeling_petl.PetlForSequenceClassification"
    got, expected = load_elsewhere(done, None), trained_logits(run)
    assert got.shape == expected.shape == (4, 2)
    assert float((got - expected).abs().max()) <= 1e-5
