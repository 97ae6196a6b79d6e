"""Re-weighting's tie test at large logits (SCORERS.md, "Ties in the re-weighting fallback"): an exactly uniform row
(identical keys: repeated tokens without RoPE) keeps P on every backend, whatever the logits' size. P's rounding
grows with |lse| (~|lse| eps), so a tolerance of n eps alone let rounding pick the branch once |z| passed ~8 n: the
fp32 reference went one-hot, and the Triton backward blew up ~1e5x through p n / (n P - o)."""
import pytest
import torch
from triton.runtime import interpreter

import model
from scorers import SCORERS
from test_kernels import _gpu_ex2, _gpu_lg2

CPU_BACKENDS = ("torch", "cpu", "triton", "flex")  # flex: forward only on the CPU (eager)
# every normalised scorer, on every CPU backend that runs it (fox with no decay: c = 0, so equal scores tie)
TIE_CASES = [(name, backend) for name, e in SCORERS.items() if e.sums_to_one and e.p is None
             for backend in CPU_BACKENDS if backend in e.backends]


def _grads(q, k, v, do, scorer, backend, dtype, **kw):
    """[out, dq, dk, dv]; flex: [out] (the CPU refuses its backward)."""
    xs = [x.detach().to(dtype).requires_grad_(backend != "flex") for x in (q, k, v)]
    if SCORERS[scorer].forget:
        kw["c"] = torch.zeros(k.shape[:3], dtype=dtype)
    out = model.attention(*xs, scorer, backend=backend, **kw)
    return [out.detach(), *(torch.autograd.grad(out, xs, do.to(dtype)) if backend != "flex" else [])]


def _err(a, ref):  # relative to the reference's largest entry, at least 1: identical keys make dq exactly 0
    return (a.double() - ref).abs().max().item() / max(ref.abs().max().item(), 1.0)


def _identical_keys(z, T=8, D=16, seed=0):
    """Every score z (q.k / sqrt(D) = z exactly), every row a tie; v, do random."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.full((1, 1, T, D), z * D**0.5 / D), torch.ones(1, 1, T, D)
    return q, k, torch.randn(1, 1, T, D, generator=g), torch.randn(1, 1, T, D, generator=g)


@pytest.mark.parametrize("scorer,backend", TIE_CASES, ids=[f"{s}-{b}" for s, b in TIE_CASES])
def test_uniform_rows_at_large_logits_keep_P_and_match_the_float64_gradients(scorer, backend):
    # every score 300: rows i >= 3 fall back, rows i < 3 (o = 0) re-weight a uniform row to itself
    q, k, v, do = _identical_keys(300.0)
    ref = _grads(q, k, v, do, scorer, "torch", torch.float64, p=15.0)
    got = _grads(q, k, v, do, scorer, backend, torch.float32, p=15.0)
    torch.testing.assert_close(got[0].double(), v.double().cumsum(2) / torch.arange(1, 9.0).view(8, 1), rtol=1e-5,
                               atol=1e-5)  # the prefix mean of v: every row uniform
    for name, f, r in zip(["out", "dq", "dk", "dv"], got, ref):
        assert torch.isfinite(f).all() and _err(f, r) < 2e-4, (name, _err(f, r))  # was ~1e5 (triton dk)


@pytest.mark.parametrize("scorer,z", [("ssmax", 100.0), ("softmax", 300.0)])
def test_uniform_rows_keep_P_with_the_gpu_approximate_log2_and_exp2(scorer, z, monkeypatch):
    # a GPU's lg2.approx / ex2.approx (emulated as test_kernels does) add their own rounding to P: ssmax (s = 1,
    # logits z log n) failed already at z = 100
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_log2", _gpu_lg2)
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_exp2", _gpu_ex2)
    q, k, v, do = _identical_keys(z)
    ref = _grads(q, k, v, do, scorer, "torch", torch.float64, p=15.0)
    got = _grads(q, k, v, do, scorer, "triton", torch.float32, p=15.0)
    for name, f, r in zip(["out", "dq", "dk", "dv"], got, ref):
        assert torch.isfinite(f).all() and _err(f, r) < 2e-4, (name, _err(f, r))


def _rounded_keys():
    """Identical keys, |z| ~ 100 per row; the CPU matmul rounds the last column of
    row 4 differently (103.709274 vs 103.709290), P off 1/5 by 1.5e-6, above 8 n eps."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 5, 64, generator=g) * 20
    k = (torch.randn(1, 1, 1, 64, generator=g) * 20).expand(1, 1, 5, 64).contiguous()
    return q, k, torch.randn(1, 1, 5, 64, generator=g), torch.randn(1, 1, 5, 64, generator=g)


def test_reference_keeps_a_uniform_row_whose_logits_rounded_apart():
    q, k, _, _ = _rounded_keys()
    P = model.attention_weights(q, k, "softmax", p=15.0)
    torch.testing.assert_close(P[0, 0, 4], torch.full((5,), 0.2))  # was one-hot on the last key


@pytest.mark.parametrize("backend", ["torch", "cpu", "triton", "flex"])
def test_rounded_apart_uniform_rows_match_the_float64_reference_on_every_backend(backend):
    q, k, v, do = _rounded_keys()
    ref = _grads(q, k, v, do, "softmax", "torch", torch.float64, p=15.0)
    got = _grads(q, k, v, do, "softmax", backend, torch.float32, p=15.0)
    mean = v.cumsum(2) / torch.arange(1, 6.0).view(5, 1)  # every row uniform (the float64 run rounds apart too)
    torch.testing.assert_close(got[0], mean, rtol=1e-5, atol=1e-5)
    for name, f, r in zip(["out", "dq", "dk", "dv"], got, ref):
        assert torch.isfinite(f).all() and _err(f, r) < 2e-4, (name, _err(f, r))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the GPU's own lg2/ex2 rounding and bf16")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("scorer", [s for s, b in TIE_CASES if b == "triton" and not SCORERS[s].forget])
def test_cuda_uniform_rows_at_large_logits_keep_P_ties(scorer, dtype):
    # the tie tolerance from the row's lse (M1) on the GPU, where the interpreter only emulates its math
    q, k, v, do = _identical_keys(300.0)
    ref = _grads(q, k, v, do, scorer, "torch", torch.float64, p=15.0)
    got = _grads(*(t.cuda() for t in (q, k, v, do)), scorer, "triton", dtype, p=15.0)
    tol = 2e-4 if dtype == torch.float32 else 3e-2  # bf16 inputs: ~1e-2 of the largest entry
    for name, f, r in zip(["out", "dq", "dk", "dv"], got, ref):
        assert torch.isfinite(f).all() and _err(f.cpu(), r) < tol, (name, _err(f.cpu(), r))
