"""`inject.weight_edits`: every PETL module computed on a backbone weight, named by that weight's
module path and by its module spec (so deploy/ reaches each form's hooks without naming a form)."""

from conftest import TINY, tiny_model

from petl_nas import ModuleSpec, PetlConfig, apply_petl
from petl_nas.core.inject import merge_lora, weight_edits
from petl_nas.core.modules import LoRA

L = TINY["num_hidden_layers"]
CONFIG = PetlConfig(
    modules=(ModuleSpec(form="lora", size=4, targets=("q", "v")), ModuleSpec(form="adapter", position="ffn", size=4))
)


def test_each_module_on_a_weight_is_listed_with_its_spec():
    model = apply_petl(tiny_model(), CONFIG)
    edits = weight_edits(model)
    assert len(edits) == 2 * L + L  # LoRA on q and v of each layer; an adapter per FFN
    lora = [(path, module) for path, i, module, _ in edits if i == 0]
    assert len(lora) == 2 * L and all(isinstance(m, LoRA) for _, m in lora)
    assert {path for path, _ in lora} == {
        f"bert.encoder.layer.{l}.attention.self.{w}" for l in range(L) for w in ("query", "value")
    }
    assert all(model.get_submodule(path) is not None for path, *_ in edits)
    assert sum(i == 1 for _, i, _, _ in edits) == L and all(extra is None for *_, extra in edits)
    merge_lora(model)  # folded: no longer computed beside the weight
    assert [i for _, i, _, _ in weight_edits(model)] == [1] * L
