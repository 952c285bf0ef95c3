"""GPU A/B of the small operations that the kernel breakdown (`step_time.py --kernels`) blames.

Each case is one operation of a BERT-base training step at batch 32 x 128 (N = 4,096 rows), in two
or more formulations that compute the same thing: forward and backward recorded as one CUDA graph
and replayed (the host's share out, as in a graphed trial), microseconds per replay from CUDA
events, median of 5 rounds of 50 replays. Every alternative is checked against the first (outputs
and gradients) before it is timed. The cases:

- bias gradient of a linear layer, grad [N, n] -> [n]: ``sum(0)`` (what autograd runs) against a
  product with a ones row;
- prefix keys joined to the token keys: cat along the head-major layout [B, H, L, D] (what SDPA's
  callers hand over, the token keys a transposed view) against cat along [B, L, H, D] and a
  transposed view of the result, and against writing the prefix and the token keys into one empty
  buffer (two copies); each with SDPA forward and backward after it;
- a projection of x [N, 768] to a width that is not a multiple of 8 (19: UniPELT's shared read at
  the attention) against the same padded with zero rows to 24;
- the multi-head adapter's relu attention at 30 positions against 32 (two zero key/value rows);
- a scaled adapter's output s·(a·Wᵀ + b), a = f(h) [N, 48] (scaled parallel adapter, MAM):
  multiplying the 768-wide output by s (now) against s applied to a and b, (s·a)·Wᵀ + s·b, and
  against ``addmm``'s own alpha and beta (a fixed s only);
- a UniPELT-gated adapter's output g·(a·Wᵀ + b), g one number per example: multiplying the 768-wide
  output by g (now) against g·b joined to the product as one more column, [g·a, g]·[W, b]ᵀ (no
  768-wide product, reduction or bias gradient beside the matmul; 49 columns, or padded to 56),
  and against (g·a)·Wᵀ + g·b.
- fp32 master weights cast to bf16 for a step (Houlsby's 24 adapters: 96 weights, through a chain
  of 24 adapters on x [N, 768]): one cast per weight and one cast of each gradient back, the
  kernels autocast runs for them (now; cast explicitly here), against the weights as views of one flat fp32 buffer, cast once and
  split (its gradient: one join and one cast back);
- LoRA's update added onto its frozen linear's output, x [N, 768] -> 3,072 (FFN LoRA's W1, r = 8):
  ``h + u·Bᵀ`` (now) against ``addmm_`` into the 2-D output in place (no add, no copy; the
  out-of-place ``addmm`` copies h first: `gpu_h100_mps_lora_addmm.md`).
- a joined read: LoRA's A beside its frozen linear's weight, both reading x (FFN LoRA's W2, x [N,
  3,072] -> 768, and W1, x [N, 768] -> 3,072; r = 8): two products of x and, in backward, x's two
  gradients added (now) against one product x·[W; A]ᵀ whose backward takes x's gradient from one
  product [g_W, g_A]·[W; A] (no second read of x, no 3,072-wide add; A's gradient from g_Aᵀ·x).

    python bench/gpu_kernels_ab.py [--only "adapter output,prefix of 30"] [--out results.md]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch import nn

N, B, L, H, D, HID = 4096, 32, 128, 12, 64, 768


def timed_us(fn, params, device) -> float:
    """µs per replay of ``fn``'s forward + backward recorded as a CUDA graph (eager on a CPU)."""

    def step():
        for p in params:
            p.grad = None
        out = fn()
        out.float().square().mean().backward()

    if device.type != "cuda":
        import time

        step()
        t = time.perf_counter()
        for _ in range(5):
            step()
        return (time.perf_counter() - t) / 5 * 1e6
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    for p in params:
        p.grad = None
    with torch.cuda.graph(graph):
        step()
    rounds = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        rounds.append(start.elapsed_time(end) * 1000 / 50)
    return statistics.median(rounds)


def grads_of(fn, params):
    """``fn``'s output and its parameters' gradients, flattened and joined in order (so that weights
    kept apart and the same weights as one flat buffer compare)."""
    for p in params:
        p.grad = None
    out = fn()
    out.float().square().mean().backward()
    return out.detach().float(), torch.cat([p.grad.detach().float().flatten() for p in params])


def same(a, a_params, b, b_params) -> str:
    (oa, ga), (ob, gb) = grads_of(a, a_params), grads_of(b, b_params)
    worst = max((oa - ob).abs().max().item(), (ga - gb).abs().max().item())
    scale = max(oa.abs().max().item(), ga.abs().max().item())
    return f"{worst / max(scale, 1e-12):.1e}"


def bias_grad_case(device, n):
    g_src = torch.randn(N, n, device=device, dtype=torch.bfloat16, requires_grad=True)
    ones = torch.ones(1, N, device=device, dtype=torch.bfloat16)

    # The reduction as a forward op (its backward, an expand, is the same for both)
    def reduce_sum():
        return g_src.sum(0)

    def ones_product():
        return (ones @ g_src).view(-1)

    return f"bias gradient, [{N}, {n}] -> [{n}]", [("sum(0)", reduce_sum), ("ones[1,N] @ g", ones_product)], [g_src]


class OnesBiasLinear(torch.autograd.Function):
    """x·Wᵀ + b whose backward takes b's gradient as ones[1, N]·g instead of a reduction."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return nn.functional.linear(x, w, b)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        g2 = g.reshape(-1, g.shape[-1])
        ones = torch.ones(1, g2.shape[0], dtype=g2.dtype, device=g2.device)
        return (g2 @ w).view(x.shape), g2.t() @ x.reshape(-1, x.shape[-1]), (ones @ g2).view(-1)


def linear_case(device, fan_in, fan_out):
    dt = torch.bfloat16
    x = torch.randn(B, L, fan_in, device=device, dtype=dt, requires_grad=True)
    w = (torch.randn(fan_out, fan_in, device=device, dtype=dt) * fan_in**-0.5).requires_grad_()
    b = torch.randn(fan_out, device=device, dtype=dt, requires_grad=True)

    def plain():
        return nn.functional.linear(x, w, b)

    def ones_bias():
        return OnesBiasLinear.apply(x, w, b)

    return (
        f"linear {fan_in} -> {fan_out} with bias, x [{B}, {L}, {fan_in}]",
        [("F.linear (bias grad: sum)", plain), ("bias grad: ones @ g", ones_bias)],
        [x, w, b],
    )


def prefix_cat_case(device, p_len=30):
    dt = torch.bfloat16
    q_lin = torch.randn(B, L, H * D, device=device, dtype=dt, requires_grad=True)
    k_lin = torch.randn(B, L, H * D, device=device, dtype=dt, requires_grad=True)
    v_lin = torch.randn(B, L, H * D, device=device, dtype=dt, requires_grad=True)
    pk = torch.randn(H, p_len, D, device=device, dtype=dt, requires_grad=True)
    pv = torch.randn(H, p_len, D, device=device, dtype=dt, requires_grad=True)
    sdpa = nn.functional.scaled_dot_product_attention

    def heads(t):
        return t.view(B, L, H, D).transpose(1, 2)

    def head_major():
        k = torch.cat([pk.expand(B, -1, -1, -1), heads(k_lin)], dim=2)
        v = torch.cat([pv.expand(B, -1, -1, -1), heads(v_lin)], dim=2)
        return sdpa(heads(q_lin), k, v)

    def token_major():
        k = torch.cat([pk.transpose(0, 1).expand(B, -1, -1, -1), k_lin.view(B, L, H, D)], dim=1).transpose(1, 2)
        v = torch.cat([pv.transpose(0, 1).expand(B, -1, -1, -1), v_lin.view(B, L, H, D)], dim=1).transpose(1, 2)
        return sdpa(heads(q_lin), k, v)

    def joined(prefix, tokens):
        out = prefix.new_empty(B, H, p_len + L, D)
        out[:, :, :p_len] = prefix
        out[:, :, p_len:] = heads(tokens)
        return out

    def buffer():
        return sdpa(heads(q_lin), joined(pk, k_lin), joined(pv, v_lin))

    def no_prefix():
        return sdpa(heads(q_lin), heads(k_lin), heads(v_lin))

    return (
        f"prefix of {p_len} joined to the keys and values, then SDPA (one layer)",
        [
            ("cat [B,H,L,D] (now)", head_major),
            ("cat [B,L,H,D], transposed view", token_major),
            ("empty [B,H,P+L,D], two copies", buffer),
            ("no prefix (the floor's attention)", no_prefix),
        ],
        [q_lin, k_lin, v_lin, pk, pv],
    )


def scaled_output_case(device, r=48, s=4.0):
    dt = torch.bfloat16
    a = torch.randn(B, L, r, device=device, dtype=dt, requires_grad=True)
    w = (torch.randn(HID, r, device=device, dtype=dt) * r**-0.5).requires_grad_()
    b = torch.randn(HID, device=device, dtype=dt, requires_grad=True)

    def after():
        return nn.functional.linear(a, w, b) * s

    def folded():
        return nn.functional.linear(a * s, w, b * s)

    def alpha_beta():
        return torch.addmm(b, a.view(-1, r), w.t(), beta=s, alpha=s).view(B, L, HID)

    return (
        f"scaled adapter output, s = {s:g}, a [{B}, {L}, {r}] -> {HID}",
        [("s times the output (now)", after), ("(s·a)·Wᵀ + s·b", folded), ("addmm alpha = beta = s", alpha_beta)],
        [a, w, b],
    )


def gated_output_case(device, r=48):
    dt = torch.bfloat16
    a = torch.randn(B, L, r, device=device, dtype=dt, requires_grad=True)
    w = (torch.randn(HID, r, device=device, dtype=dt) * r**-0.5).requires_grad_()
    b = torch.randn(HID, device=device, dtype=dt, requires_grad=True)
    g = torch.rand(B, 1, 1, device=device, dtype=dt, requires_grad=True)

    def after():
        return nn.functional.linear(a, w, b) * g

    def column(pad=0):
        cols = [a * g, g.expand(B, L, 1)] + ([a.new_zeros(B, L, pad)] if pad else [])
        rows = [w, b[:, None]] + ([w.new_zeros(HID, pad)] if pad else [])
        return nn.functional.linear(torch.cat(cols, -1), torch.cat(rows, 1))

    def bias_apart():
        return nn.functional.linear(a * g, w) + g * b

    return (
        f"gated adapter output, g per example, a [{B}, {L}, {r}] -> {HID}",
        [
            ("g times the output (now)", after),
            (f"[g·a, g]·[W, b]ᵀ ({r + 1} columns)", column),
            (f"the same padded to {r + 1 + (-(r + 1) % 8)}", lambda: column(-(r + 1) % 8)),
            ("(g·a)·Wᵀ + g·b", bias_apart),
        ],
        [a, w, b, g],
    )


def odd_width_case(device, width=19, padded=24):
    dt = torch.bfloat16
    x = torch.randn(N, HID, device=device, dtype=dt, requires_grad=True)
    w = torch.randn(width, HID, device=device, dtype=dt, requires_grad=True)
    zeros = torch.zeros(padded - width, HID, device=device, dtype=dt)

    def odd():
        return x @ w.t()

    def pad():
        return (x @ torch.cat([w, zeros]).t())[:, :width]

    return (
        f"x [{N}, {HID}] projected to {width} columns",
        [(f"width {width} (now)", odd), (f"padded to {padded}, sliced", pad)],
        [x, w],
    )


def mh_case(device, size=30, padded=32):
    dt = torch.bfloat16
    q = torch.randn(B, H, L, D, device=device, dtype=dt, requires_grad=True)
    keys = torch.randn(H, size, D, device=device, dtype=dt, requires_grad=True)
    values = torch.randn(H, size, D, device=device, dtype=dt, requires_grad=True)
    zeros = torch.zeros(H, padded - size, D, device=device, dtype=dt)

    def plain():
        return torch.relu(q @ keys.transpose(-1, -2)) @ values

    def pad():
        return torch.relu(q @ torch.cat([keys, zeros], 1).transpose(-1, -2)) @ torch.cat([values, zeros], 1)

    return (
        f"multi-head adapter, {size} positions",
        [(f"{size} (now)", plain), (f"padded to {padded}", pad)],
        [q, keys, values],
    )


def master_casts_case(device, adapters=24, r=48):
    """Sequential adapters x + up(relu(down(x))) whose fp32 weights are cast to bf16 for the step."""
    shapes = [(r, HID), (r,), (HID, r), (HID,)] * adapters
    sizes = [torch.Size(s).numel() for s in shapes]
    flat = torch.cat([torch.randn(n, device=device) * 0.02 for n in sizes]).requires_grad_()
    apart = [t.detach().clone().view(shape).requires_grad_() for t, shape in zip(flat.split(sizes), shapes)]
    x = torch.randn(N, HID, device=device, dtype=torch.bfloat16, requires_grad=True)

    def chain(weights):
        h = x
        for down_w, down_b, up_w, up_b in zip(*[iter(weights)] * 4):
            h = h + nn.functional.linear(torch.relu(nn.functional.linear(h, down_w, down_b)), up_w, up_b)
        return h

    def one_by_one():
        return chain([w.to(torch.bfloat16) for w in apart])

    def flat_once():
        return chain([w.view(shape) for w, shape in zip(flat.to(torch.bfloat16).split(sizes), shapes)])

    return (
        f"{len(shapes)} fp32 weights cast to bf16, {adapters} sequential adapters on x [{N}, {HID}]",
        [
            ("a cast per weight and per gradient (now)", one_by_one, apart),
            ("one flat buffer: one cast, one split; one join and cast back", flat_once, [flat]),
        ],
        apart,
    )


def lora_add_case(device, fan_out=3072, r=8):
    dt = torch.bfloat16
    x = torch.randn(N, HID, device=device, dtype=dt, requires_grad=True)
    w = torch.randn(fan_out, HID, device=device, dtype=dt) * HID**-0.5  # frozen
    a = (torch.randn(r, HID, device=device, dtype=dt) * HID**-0.5).requires_grad_()
    b = (torch.randn(fan_out, r, device=device, dtype=dt) * 0.02).requires_grad_()

    def added():
        return nn.functional.linear(x, w) + (x @ a.t()) @ b.t()

    def in_place():
        return nn.functional.linear(x, w).addmm_(x @ a.t(), b.t())

    return (
        f"LoRA update onto its linear's output, x [{N}, {HID}] -> {fan_out}, r = {r}",
        [("h + u·Bᵀ (now)", added), ("h.addmm_(u, Bᵀ), 2-D, in place", in_place)],
        [a, b],
    )


class JoinedRead(torch.autograd.Function):
    """(x·Wᵀ, x·Aᵀ) from one product x·[W; A]ᵀ, W frozen. Backward: x's gradient from one product
    [g_W, g_A]·[W; A], A's from g_Aᵀ·x; none for W."""

    @staticmethod
    def forward(ctx, x, w, a):
        joined = torch.cat([w, a.to(w.dtype)])
        ctx.save_for_backward(x, joined)
        ctx.rows = w.shape[0]
        return (x @ joined.t()).split([w.shape[0], a.shape[0]], dim=-1)

    @staticmethod
    def backward(ctx, g_w, g_a):
        x, joined = ctx.saved_tensors
        g_x = torch.cat([g_w, g_a], dim=-1) @ joined
        g_a_rows = g_a.reshape(-1, g_a.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        return g_x, None, g_a_rows


def joined_read_case(device, fan_in=3072, fan_out=HID, r=8):
    dt = torch.bfloat16
    x = torch.randn(N, fan_in, device=device, dtype=dt, requires_grad=True)
    w = torch.randn(fan_out, fan_in, device=device, dtype=dt) * fan_in**-0.5  # frozen
    a = (torch.randn(r, fan_in, device=device, dtype=dt) * fan_in**-0.5).requires_grad_()
    b = (torch.randn(fan_out, r, device=device, dtype=dt) * 0.02).requires_grad_()

    def apart():
        return nn.functional.linear(x, w) + (x @ a.t()) @ b.t()

    def joined():
        h, u = JoinedRead.apply(x, w, a)
        return h + u @ b.t()

    return (
        f"joined read: LoRA's A beside its frozen weight, x [{N}, {fan_in}] -> {fan_out}, r = {r}",
        [("two products, x's gradients added (now)", apart), (f"one product of {fan_out + r} columns", joined)],
        [x, a, b],
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--only", help="comma-separated words: only the cases whose title holds one")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (eager, not graphed)"
    cases = [bias_grad_case(device, n) for n in (768, 64, 512, 3072)]
    cases += [linear_case(device, i, o) for i, o in ((768, 64), (64, 768), (768, 512), (512, 768))]
    cases += [prefix_cat_case(device, 30), prefix_cat_case(device, 10), odd_width_case(device), mh_case(device)]
    cases += [
        scaled_output_case(device),
        gated_output_case(device),
        master_casts_case(device),
        lora_add_case(device),
        joined_read_case(device, 3072, HID),
        joined_read_case(device, HID, 3072),
    ]
    if args.only:
        cases = [c for c in cases if any(word in c[0] for word in args.only.split(","))]
    lines = [
        f"# Small GPU operations, A/B\n\n{name} | torch {torch.__version__}\n",
        "| case | formulation | µs per forward + backward | × first | max difference (relative) |",
        "|---|---|---:|---:|---:|",
    ]
    for title, variants, params in cases:
        first = None
        variants = [
            (label, fn, *(own or [params])) for label, fn, *own in variants
        ]  # each its own leaves, or the case's
        for label, fn, leaves in variants:
            try:
                diff = (
                    "-"
                    if first is None
                    else (same(variants[0][1], variants[0][2], fn, leaves) if "no prefix" not in label else "n/a")
                )
                us = timed_us(fn, leaves, device)
            except Exception as e:  # one failing formulation is reported, not fatal
                lines.append(f"| {title} | {label} | failed: {type(e).__name__}: {str(e)[:80]} | - | - |")
                continue
            first = first or us
            lines.append(f"| {title} | {label} | {us:,.1f} | {us / first:.2f} | {diff} |")
            print(lines[-1], flush=True)
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main()
