"""hf_scorers.attention called as transformers calls it, against float64: a bf16 model's weights scored in fp32 and
rounded once, ssmax's q scaled in fp32 and rounded once. Skipped without requirements-hf.txt."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")
import hf_scorers  # noqa: E402
from scorers import SCORERS, score_softmax  # noqa: E402

B, H, T, D = 1, 2, 300, 16  # n_i past 256: bf16 holds every integer only up to 256
BF16_U = 2.0 ** -8  # bf16's unit roundoff: a value rounded once is within it, relative


def layer(scorer, params):
    """A stand-in for transformers' attention module: its config's nanoscorer block, layer 0."""
    return SimpleNamespace(config=SimpleNamespace(nanoscorer={"scorer": scorer, "params": params}), layer_idx=0)


def qkv(dtype=torch.bfloat16):
    torch.manual_seed(0)  # |z| up to ~20: peaked rows, where rounding the logits shows
    q, k, v = torch.randn(3, B, H, T, D).mul(torch.tensor([2.0, 2.0, 1.0])[:, None, None, None, None])
    return q.to(dtype), k.to(dtype), v.to(dtype)


def per_head(scorer):
    """Parameters other than the registry's defaults, a different one per head: {name: [[layer 0's per head]]}."""
    return {prm.name: [[prm.default + 0.3 * (h + 1) for h in range(H)]] for prm in SCORERS[scorer].params}


def float64(params):
    return {name: torch.tensor(x[0], dtype=torch.float64).view(H, 1, 1) for name, x in params.items()}


N_I = torch.arange(1, T + 1, dtype=torch.float64)[:, None]  # (T, 1): no mask, causal
CAUSAL = torch.ones(T, T, dtype=torch.bool).tril()


@pytest.mark.parametrize("scorer", [s for s in hf_scorers.RUNS if s not in ("softmax", "ssmax")])
def test_a_bf16_models_weights_are_scored_in_fp32_and_rounded_once(scorer):
    # in bf16 they were 2-3 roundings off float64's (n_i = 257 read as 256, P and P @ v rounded)
    q, k, v = qkv()
    params = per_head(scorer)
    got = hf_scorers.attention(layer(scorer, params), q, k, v, None, scaling=D ** -0.5)[0].transpose(1, 2)
    want = SCORERS[scorer].weights(q.double(), k.double(), N_I, CAUSAL, **float64(params)) @ v.double()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, rtol=BF16_U * 1.01, atol=1e-6)  # + fp32's own rounding


@pytest.mark.parametrize("scorer", ["ssmax", "softmax"])
def test_a_bf16_ssmax_scales_q_in_fp32_and_rounds_it_once_before_sdpa(scorer):
    q, k, v = qkv()
    params = per_head(scorer)
    got = hf_scorers.attention(layer(scorer, params), q, k, v, None, scaling=D ** -0.5)[0].transpose(1, 2)
    prm = float64(params)
    scaled = (q.double() * (prm["s"] * N_I.log() + prm["b"] if prm else 1)).to(torch.bfloat16)  # s log n_i + b
    assert torch.equal(got, F.scaled_dot_product_attention(scaled, k, v, is_causal=True))
    want = score_softmax(scaled.double(), k.double(), N_I, CAUSAL) @ v.double()  # SDPA's bf16 within a rounding
    assert (got.double() - want).abs().max() < 2 * BF16_U * v.abs().max()

