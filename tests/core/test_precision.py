"""Half-precision checkpoints: the body stays in its dtype, everything that trains is fp32, and a
small learning-rate step still moves the weights (it would vanish in bf16)."""

from __future__ import annotations

import dataclasses

import torch
from conftest import batch, tiny_model

from petl_nas import ModuleSpec, PetlConfig, apply_petl, load_petl, preset, save_petl
from petl_nas.core.models import load_classifier
from petl_nas.core.precision import autocast_for
from petl_nas.tasks import get_task
from petl_nas.training.loop import Recipe, train


def bf16_checkpoint(tmp_path):
    """A tiny BERT saved in bf16, loaded the way petl-nas loads backbones (dtype "auto")."""
    tiny_model().to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    model = load_classifier(str(tmp_path / "bf16"), num_labels=2)
    assert model.bert.encoder.layer[0].attention.self.query.weight.dtype == torch.bfloat16
    return model


class Rows:
    """A split of one fixed batch (the trainer's data interface)."""

    def __init__(self, n=4):
        self.x = {**batch(n=n), "labels": torch.arange(n) % 2}

    def __len__(self):
        return len(self.x["labels"])

    def by_length(self):
        return torch.arange(len(self))

    def batches(self, size, shuffle=False, seed=0, order=None):
        yield dict(self.x)


def test_bf16_body_trains_fp32_masters_and_small_steps_move_them(tmp_path):
    unipelt = preset("unipelt_apl", hidden_size=32)
    model = apply_petl(bf16_checkpoint(tmp_path), dataclasses.replace(unipelt, bitfit=True, train_layernorms=True))
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n: p for n, p in model.named_parameters() if not p.requires_grad}
    assert any(n.startswith("classifier") for n in trained) and any(".LayerNorm." in n for n in trained)
    before = {n: p.detach().clone() for n, p in trained.items()}
    data = type("D", (), {"train": Rows(), "dev": Rows()})()
    train(model, data, get_task("demo_sentiment"), Recipe(lr=1e-5, epochs=1, batch_size=4, warmup_ratio=0.0))
    moved = {n for n, p in trained.items() if not torch.equal(p, before[n])}
    petl = {n for n in trained if n.startswith("petl.")}
    # Every PETL tensor with a gradient moves by ~1e-5; the prefix MLP's output layer is flattened
    # at deployment, but it trains too. (Zero-initialised LoRA B gets a gradient; A does not yet.)
    assert len(moved & petl) >= len(petl) - 2 * 2 * 3 and "classifier.weight" in moved
    assert {p.dtype for p in trained.values()} == {torch.float32}  # PETL, head, biases, norms
    assert {p.dtype for p in frozen.values()} == {torch.bfloat16}  # the body keeps its dtype


def test_modules_follow_the_body_outside_autocast(tmp_path):
    """Without autocast (plain inference on a CPU) the fp32 modules read bf16 activations and hand
    back bf16, and a saved model loads back with fp32 modules and the same logits."""
    model = apply_petl(
        bf16_checkpoint(tmp_path),
        PetlConfig(
            modules=(
                ModuleSpec(form="lora", size=4, gate=True),
                ModuleSpec(form="adapter", position="ffn", size=4),
                ModuleSpec(form="mh_adapter", size=3),
            )
        ),
    )
    x = batch()
    with torch.no_grad():
        plain = model(**x).logits
        with autocast_for(model, "cpu"):
            ours = model(**x).logits
    assert plain.dtype == torch.bfloat16 and torch.allclose(plain.float(), ours.float(), atol=0.05)
    save_petl(model, tmp_path / "saved")
    again = load_petl(load_classifier(str(tmp_path / "bf16"), num_labels=2), tmp_path / "saved")
    assert {p.dtype for p in again.petl.parameters()} == {torch.float32}
    with torch.no_grad(), autocast_for(again, "cpu"):
        assert torch.equal(again(**x).logits, ours)


def test_trials_step_with_fused_adamw_which_equals_the_per_tensor_loop():
    from petl_nas.training.loop import adamw

    torch.manual_seed(0)
    shapes = [(8, 16), (16,), (1, 16), (1,)]
    fused = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    loop = [torch.nn.Parameter(p.detach().clone()) for p in fused]
    groups = [
        {"params": fused[:2], "lr": 1e-2, "weight_decay": 0.01},
        {"params": fused[2:], "lr": 1e-3, "weight_decay": 0.0},
    ]
    opt = adamw(groups, 1e-2)
    ref = torch.optim.AdamW(
        [{"params": loop[:2], "lr": 1e-2, "weight_decay": 0.01}, {"params": loop[2:], "lr": 1e-3, "weight_decay": 0.0}],
        lr=1e-2,
        foreach=False,
    )
    assert opt.defaults["fused"] is True
    for step in range(5):
        for a, b in zip(fused, loop):
            a.grad = torch.randn(a.shape, generator=torch.Generator().manual_seed(step))
            b.grad = a.grad.clone()
        opt.step()
        ref.step()
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(fused, loop))


# --- casts under autocast: each one is a kernel (and one more in backward) ---------------------------


class CastCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the shape of every tensor cast (aten._to_copy) while active."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default:
            self.shapes.append(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


def activation_casts(model, x) -> int:
    """Casts of [B, L, d] activations in one forward under CPU bf16 autocast."""
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), CastCounter() as counter:
        model(**x)
    b, length = x["input_ids"].shape
    return sum(1 for s in counter.shapes if s[:2] == (b, length) and len(s) == 3)


def test_modules_under_autocast_cast_no_activation_the_body_does_not():
    """Autocast casts a matmul's operands itself; an fp32 module that cast its bf16 input to fp32
    first (for autocast to cast it back) paid two kernels forward and two backward per module."""
    x = batch()
    floor = activation_casts(tiny_model(), x)
    sequential = PetlConfig(
        modules=(
            ModuleSpec(form="adapter", position="ffn", insertion="sequential", size=4),
            ModuleSpec(form="adapter", position="attn", insertion="sequential", size=4, gate=True),
        )
    )
    assert activation_casts(apply_petl(tiny_model(), sequential), x) == floor


def test_phm_layer_under_autocast_casts_only_its_weight_bias_and_input():
    from petl_nas.core.modules import PHMLinear, SharedRule

    torch.manual_seed(0)
    layer = PHMLinear(SharedRule(4), 32, 8, n=4, rank=2)
    z = torch.randn(2, 5, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16), CastCounter() as counter:
        y = layer(z)
    # W = Σ kron(A_i, s_i t_i) is built in fp32 (no casts of s, t, A); one addmm in bf16 reads the
    # cast W, bias and input, and hands back bf16 (x @ W + b promoted the sum back to fp32)
    assert sorted(counter.shapes) == sorted([(8, 32), (8,), (2, 5, 32)]) and y.dtype == torch.bfloat16
    assert torch.allclose(y.float(), z @ layer.weight() + layer.bias, atol=2e-2)


def test_per_example_gate_weights_follow_the_mask_they_were_computed_for():
    from petl_nas.core.modules.compose import sequence_mean

    g = torch.rand(2, 4, 1)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    expected = lambda m: torch.stack([g[i, m[i].bool()].mean(0, keepdim=True) for i in range(2)])  # noqa: E731
    assert torch.allclose(sequence_mean(g, mask), expected(mask))
    assert torch.allclose(sequence_mean(g, mask), expected(mask))  # reused
    mask[0, 3] = 0  # changed in place: recomputed
    assert torch.allclose(sequence_mean(g, mask), expected(mask))
    other = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0]])  # another mask: its own weights
    assert torch.allclose(sequence_mean(g, other), expected(other))
    assert sequence_mean(g.double(), other).dtype == torch.float64


def matmul_dtypes(model, recipe_precision: str):
    """The dtypes the body's query projection computes in while ``model`` trains one step at
    ``recipe_precision`` on a CPU, and the dtypes of what trains afterwards (with their grads)."""
    seen = []
    query = model.bert.encoder.layer[0].attention.self.query
    handle = query.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    data = type("D", (), {"train": Rows(), "dev": Rows()})()
    try:
        train(
            model,
            data,
            get_task("demo_sentiment"),
            Recipe(lr=1e-3, epochs=1, batch_size=4, warmup_ratio=0.0, precision=recipe_precision),
        )
    finally:
        handle.remove()
    trained = {p.dtype for p in model.parameters() if p.requires_grad}
    return set(seen), trained


def test_recipe_precision_bf16_computes_in_bf16_on_a_cpu_and_keeps_fp32_masters():
    auto, masters = matmul_dtypes(apply_petl(tiny_model(), preset("lora", hidden_size=32)), "auto")
    assert auto == {torch.float32} and masters == {torch.float32}  # a CPU's default: full precision
    model = apply_petl(tiny_model(), preset("lora", hidden_size=32))
    bf16, masters = matmul_dtypes(model, "bf16")
    assert bf16 == {torch.bfloat16} and masters == {torch.float32}
    with autocast_for(model, "cpu"):  # evaluation, latency: the same choice
        assert model.bert.encoder.layer[0].attention.self.query(torch.ones(1, 32)).dtype == torch.bfloat16


def test_precision_fp32_keeps_a_gpu_default_off_and_refuses_a_half_body(tmp_path, monkeypatch):
    import pytest

    from petl_nas.core.precision import compute_dtype, use_precision

    model = apply_petl(tiny_model(), preset("lora", hidden_size=32))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert compute_dtype(model, "cuda") is None  # a V100 or T4 would only emulate it
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # a GPU with bf16 (asked, not used)
    assert compute_dtype(model, "cuda") == torch.bfloat16  # auto: bf16 on such a GPU
    use_precision(model, "fp32")
    assert compute_dtype(model, "cuda") is None  # fp32: not even there
    use_precision(model, "auto")
    assert compute_dtype(model, "cpu") is None and compute_dtype(model, "cuda") == torch.bfloat16
    with pytest.raises(ValueError, match="fp32 needs an fp32 checkpoint"):
        use_precision(apply_petl(bf16_checkpoint(tmp_path), preset("lora", hidden_size=32)), "fp32")
    with pytest.raises(ValueError, match="expected one of auto, native, bf16, fp32, got 'fp16'"):
        use_precision(model, "fp16")


def test_native_is_bf16_wherever_the_device_computes_it_natively(monkeypatch):
    """``native`` (a new study's default): bf16 on a CPU with AVX512-BF16 or AMX and on a GPU from
    Ampere on; full precision on a CPU without it, where bf16 would be emulated and slower."""
    from petl_nas.core import precision
    from petl_nas.core.precision import compute_dtype, use_precision

    model = apply_petl(tiny_model(), preset("lora", hidden_size=32))
    use_precision(model, "native")
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert compute_dtype(model, "cpu") == torch.bfloat16
    use_precision(model, "auto")
    assert compute_dtype(model, "cpu") is None  # auto stays as it was: a GPU's only
    use_precision(model, "native")
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert compute_dtype(model, "cpu") is None
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert compute_dtype(model, "cuda") is None  # emulated on an older GPU: not native
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert compute_dtype(model, "cuda") == torch.bfloat16


def test_the_experiment_file_accepts_exactly_the_precisions_the_trainer_knows():
    import pytest

    from petl_nas.core.precision import PRECISIONS
    from petl_nas.errors import ConfigError
    from petl_nas.study.experiment import Fidelity

    for name in PRECISIONS:
        assert Fidelity(length_buckets=0, precision=name).precision == name
    with pytest.raises(ConfigError, match="fidelity: precision"):
        Fidelity(length_buckets=0, precision="half")


def test_the_body_dtype_is_the_frozen_tensors_not_a_trained_master():
    """`body_dtype` reads the frozen tensors: a half-precision body whose first parameter trains
    (an fp32 master, as `apply_petl` keeps it) still computes in its half precision."""
    from petl_nas.core.precision import body_dtype, compute_dtype

    model = tiny_model().to(torch.bfloat16)
    for p in model.parameters():
        p.requires_grad_(False)
    first = next(model.parameters())
    first.data = first.data.float()
    first.requires_grad_(True)
    assert body_dtype(model) == torch.bfloat16 and compute_dtype(model, "cpu") == torch.bfloat16
