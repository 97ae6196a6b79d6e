"""The FlexAttention peer (kernels_flex.py) against the float64 reference: its eager forward on CPU for every scorer it
runs (its backward is CUDA-only: test_kernels_cuda.py), FoX's forget bias; a scorer without a kernel on a backend is
refused there with one line, at the call and in the config; README's table of what backend=auto picks."""
import dataclasses
import os
import re

import pytest
import torch

import kernels
import kernels_flex
import model
from scorers import SCORERS
from test_kernels import FLEX, _err, _inputs, _param, _ref, triton_attention

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("Tq,offset", [(1, 0), (37, 0), (20, 30), (1, 130)])
@pytest.mark.parametrize("scorer,kw", [case for case, _ in FLEX], ids=[i for _, i in FLEX])
def test_flex_forward_matches_reference(scorer, kw, Tq, offset):
    q, k, v, _ = _inputs(Tq, offset, 16)
    params = {n: _param(x, k) for n, x in kw.items() if n != "p"}
    out = kernels_flex.flex_attention(q, k, v, scorer, p=kw.get("p"), offset=offset, **params)
    ref = _ref(q.double(), k.double(), v.double(), scorer, p=kw.get("p"), offset=offset,
               **{n: x.double() for n, x in params.items()})
    assert out.shape == q.shape and _err(out, ref) < 2e-5


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("Tq,offset", [(1, 0), (37, 0), (20, 30), (1, 130)])
def test_flex_runs_fox_with_its_forget_bias(Tq, offset):
    q, k, v, _ = _inputs(Tq, offset, 16)
    c = torch.nn.functional.logsigmoid(torch.randn(k.shape[:3]) + 1).cumsum(-1)  # c_i - c_j: down to ~ -40
    out = kernels_flex.flex_attention(q, k, v, "fox", offset=offset, c=c)
    ref = _ref(q.double(), k.double(), v.double(), "fox", offset=offset, c=c.double())
    assert _err(out, ref) < 2e-5
    assert offset + Tq == 1 or _err(out, _ref(q, k, v, "softmax", offset=offset)) > 1e-2  # the bias ran


@pytest.mark.filterwarnings("ignore")
def test_flex_adds_fox_c_i_minus_c_j_as_one_difference_not_c_i_then_c_j():
    # c grows with length (-0.69 a token with gates at their init: -2,800 at 4,096) while c_i - c_j near the diagonal
    # stays small: x + c_i - c_j rounded x + c_i at |c|, outputs 1e-4 off in fp32 (2e-7 as one difference)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, T, 16, generator=g) for T in (3, 300, 300))
    c = torch.rand(1, 2, 300, generator=g).mul(-0.05)
    c[..., 1:151] = -20.0  # gates shut on keys 1..150: c_0 near 0, the later c near -3,000, their differences small
    c = c.cumsum(-1)
    ref = _ref(q.double(), k.double(), v.double(), "fox", offset=297, c=c.double())
    assert _err(kernels_flex.flex_attention(q, k, v, "fox", offset=297, c=c), ref) < 2e-6


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("negative", [False, True])
def test_flex_lssa_normalises_bf16_q_and_k_in_fp32_as_the_other_backends(negative):
    # bf16 unit vectors rounded cos, which log(d) log(n_i) scales: outputs 2.6e-2 off (5.3e-2 with every cosine
    # negative), against 2e-3 (bf16's output rounding) for torch and cpu
    q, k, v, _ = _inputs(64, 0, 16, B=1)
    if negative:  # every cosine near -1
        k, q = k.abs() + 1.0, torch.zeros_like(q).index_fill(-1, torch.tensor([0]), -30.0)
    q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
    ref = _ref(q.double(), k.double(), v.double(), "lssa", p=15.0)
    out = kernels_flex.flex_attention(q, k, v, "lssa", p=15.0)
    own = _err(model.attention(q, k, v, "lssa", p=15.0, backend="cpu"), ref)
    assert out.dtype == torch.bfloat16 and _err(out, ref) <= 1.5 * own, (_err(out, ref), own)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("scorer,kw", [case for case, _ in FLEX], ids=[i for _, i in FLEX])
def test_flex_keeps_float64_in_log_n_the_tie_tolerance_and_fox_c(scorer, kw):
    """A float64 model's flex scores in float64: log n_i, n_i and FoX's c in float32 were 1e-8..4e-7 off."""
    q, k, v, _ = (x.double() for x in _inputs(20, 30, 16))
    params = {n: _param(x, k).double() for n, x in kw.items() if n != "p"}
    if scorer == "fox":  # c_i - c_j down to ~ -25: float32 rounds it ~1e-6
        params["c"] = torch.nn.functional.logsigmoid(torch.randn(k.shape[:3], dtype=torch.float64) + 1).cumsum(-1)
    out = kernels_flex.flex_attention(q, k, v, scorer, p=kw.get("p"), offset=30, **params)
    assert out.dtype == torch.float64
    assert _err(out, _ref(q, k, v, scorer, p=kw.get("p"), offset=30, **params)) < 1e-12


def test_a_scorer_without_a_kernel_on_a_backend_is_refused_there_with_one_line():
    q = torch.randn(1, 2, 8, 16)
    c = torch.zeros(1, 2, 8)
    with pytest.raises(ValueError, match="scorer 'stickbreaking' runs on backends .*, not 'flex' .no kernel"):
        kernels_flex.flex_attention(q, q, q, "stickbreaking")
    with pytest.raises(ValueError, match="backend='flex' does not run scorer='stickbreaking'"):
        model.GPTConfig(scorer="stickbreaking", backend="flex")
    with pytest.raises(ValueError, match="needs normalised rows; scorer='stickbreaking'"):  # its own kernel too
        triton_attention(q, q, q, "stickbreaking", p=3.0)
    with pytest.raises(ValueError, match="scorer 'fox' runs on backends torch, sdpa, triton, flex, not 'cpu'"):
        model.attention(q, q, q, "fox", backend="cpu", c=c)
    with pytest.raises(ValueError, match="scorer 'fox' needs c="):
        model.attention(q, q, q, "fox")
    with pytest.raises(AssertionError, match=r"c \(B, H, Tk\) = \(1, 2, 8\) expected, got \(1, 2, 7\)"):
        kernels.attention(q, q, q, "fox", c=c[..., 1:])


def test_reference_adds_fox_c_i_minus_c_j_as_one_difference_in_fp32():
    # the flex case above on the reference path (model.attention, backend="torch"), in fp32 against float64
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, T, 16, generator=g) for T in (3, 300, 300))
    c = torch.rand(1, 2, 300, generator=g).mul(-0.05)
    c[..., 1:151] = -20.0
    c = c.cumsum(-1)
    ref = _ref(q.double(), k.double(), v.double(), "fox", offset=297, c=c.double())
    assert _err(_ref(q, k, v, "fox", offset=297, c=c), ref) < 2e-6


def _backend_table():
    """README.md's table of what backend=auto runs, as rows (the backend it needs, its CUDA cell's, its CPU cell's);
    None: an else row, needing none, or a cell that defers to the rows below."""
    lines = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| the scorer's `backends`"))
    rows = []
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        cells = [re.match(r"(?:else )?`(\w+)`", cell.strip()) for cell in line.split("|")[1:-1]]
        rows.append(tuple(m and m.group(1) for m in cells))
    return rows


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_readmes_backend_table_says_what_auto_backend_picks(device, monkeypatch):
    # a scorer with the default backends (torch, cpu, flex) read "neither: torch" there, where auto picks cpu
    col = 1 if device == "cuda" else 2
    fits = dict(sdpa=lambda p, d: p is None, triton=lambda p, d: device == "cuda" and d in model.TRITON_HEAD_DIMS)
    default = next(f.default for f in dataclasses.fields(type(SCORERS["softmax"])) if f.name == "backends")
    for backends in {e.backends for e in SCORERS.values()} | {default, ("torch",)}:
        entry = dataclasses.replace(SCORERS["softmax"], backends=backends,  # kernel_logit goes with triton
                                    kernel_logit="linear" if "triton" in backends else None)
        monkeypatch.setitem(model.SCORERS, "x", entry)
        for p, d in ((None, 64), (3.0, 64), (None, 48)):  # re-weighted; a head size Triton's tiles do not take
            said = [row[col] for row in _backend_table() if row[col] and (
                row[0] is None or row[0] in backends and fits.get(row[0], lambda p, d: True)(p, d))]
            assert said[0] == model.auto_backend("x", p, device, d), (backends, p, d)


def test_an_entry_with_softmaxs_flags_and_a_parameter_of_its_own_never_runs_a_hand_written_softmax(monkeypatch):
    # its flags alone chose kernels_cpu.FAST's and SDPA's softmax: t never entered the weights, and never learnt
    import kernels_cpu
    import kernels_sdpa
    from scorers import Param, Scorer, _masked_softmax, _z
    temp = Scorer(lambda q, k, n_i, mask, t: _masked_softmax(t * _z(q, k), mask), lambda z, ln_n, ln_d, t: t * z,
                  kernel_logit="linear", backends=("torch", "cpu", "triton"), params=(Param("t", 1.0),))
    monkeypatch.setitem(SCORERS, "temp", temp)
    assert kernels_cpu._fast(temp) is None and kernels_cpu._fast(SCORERS["ssmax"]) == "linear"
    q, k, v = torch.randn(3, 1, 2, 8, 16).unbind(0)
    t = torch.tensor([3.0, 3.0], requires_grad=True)
    ref, out = (model.attention(q, k, v, "temp", backend=b, t=t) for b in ("torch", "cpu"))
    assert (ref - model.attention(q, k, v, "softmax", backend="torch")).abs().max() > 0.1
    torch.testing.assert_close(out, ref)
    (g_ref,), (g,) = (torch.autograd.grad(o.square().sum(), t) for o in (ref, out))
    torch.testing.assert_close(g, g_ref)
    with pytest.raises(ValueError, match=r"scorer 'temp' lists backend 'sdpa', .* with parameters \['t'\]"):
        kernels_sdpa.check("temp", dataclasses.replace(temp, backends=("torch", "sdpa", "cpu", "triton")))
    for name in ("softmax", "ssmax", "fox"):  # the published ones still run there
        kernels_sdpa.check(name, SCORERS[name])
