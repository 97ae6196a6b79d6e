"""hf_scorers.attention called as transformers calls it, against float64: a bf16 model's weights scored in fp32 and
rounded once, ssmax's q scaled in fp32 and rounded once; a scaling other than 1/sqrt(head_dim) and a scorer it does
not run (re-weighted, forget-gated, no row template, unknown) refused, never scored as another. Skipped without
requirements-hf.txt."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")
import hf_scorers  # noqa: E402
from scorers import SCORERS, score_softmax, special_case  # noqa: E402

B, H, T, D = 1, 2, 300, 16  # n_i past 256: bf16 holds every integer only up to 256
BF16_U = 2.0 ** -8  # bf16's unit roundoff: a value rounded once is within it, relative


def layer(scorer, params):
    """A stand-in for transformers' attention module: its config's nanoscorer block, layer 0."""
    return SimpleNamespace(config=SimpleNamespace(nanoscorer={"scorer": scorer, "params": params}, num_hidden_layers=1),
                           layer_idx=0, training=False)


def qkv(dtype=torch.bfloat16):
    torch.manual_seed(0)  # |z| up to ~20: peaked rows, where rounding the logits shows
    q, k, v = torch.randn(3, B, H, T, D).mul(torch.tensor([2.0, 2.0, 1.0])[:, None, None, None, None])
    return q.to(dtype), k.to(dtype), v.to(dtype)


def per_head(scorer):
    """Parameters other than the registry's defaults, a different one per head: {name: [[layer 0's per head]]}."""
    return {prm.name: [[prm.default + 0.3 * (h + 1) for h in range(H)]] for prm in SCORERS[scorer].params}


def float64(scorer, params):
    """Layer 0's parameters (H, 1, 1) for the reference, with a special case's fixed values (its weights take them)."""
    fixed = {name: [[x] * H] for name, x in SCORERS[scorer].fixed}
    return {name: torch.tensor(x[0], dtype=torch.float64).view(H, 1, 1) for name, x in {**fixed, **params}.items()}


N_I = torch.arange(1, T + 1, dtype=torch.float64)[:, None]  # (T, 1): no mask, causal
CAUSAL = torch.ones(T, T, dtype=torch.bool).tril()


@pytest.mark.parametrize("scorer", [s for s in hf_scorers.RUNS if s not in ("softmax", "ssmax")])
def test_a_bf16_models_weights_are_scored_in_fp32_and_rounded_once(scorer):
    # in bf16 they were 2-3 roundings off float64's (n_i = 257 read as 256, P and P @ v rounded)
    q, k, v = qkv()
    params = per_head(scorer)
    got = hf_scorers.attention(layer(scorer, params), q, k, v, None, scaling=D ** -0.5)[0].transpose(1, 2)
    want = SCORERS[scorer].weights(q.double(), k.double(), N_I, CAUSAL, **float64(scorer, params)) @ v.double()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, rtol=BF16_U * 1.01, atol=1e-6)  # + fp32's own rounding


@pytest.mark.parametrize("parent,fixed", [("ssa", dict(n=2.0)), ("ssmax", dict(s=0.5))])
def test_a_special_case_is_checked_against_the_reference_at_its_fixed_values(monkeypatch, parent, fixed):
    # the reference was called without the entry's fixed values: a special case's check failed (missing argument)
    monkeypatch.setitem(SCORERS, "case", special_case(SCORERS[parent], **fixed))
    monkeypatch.setattr(hf_scorers, "RUNS", (*hf_scorers.RUNS, "case"))
    test_a_bf16_models_weights_are_scored_in_fp32_and_rounded_once("case")


@pytest.mark.parametrize("scorer", ["ssmax", "softmax"])
def test_a_bf16_ssmax_scales_q_in_fp32_and_rounds_it_once_before_sdpa(scorer):
    q, k, v = qkv()
    params = per_head(scorer)
    got = hf_scorers.attention(layer(scorer, params), q, k, v, None, scaling=D ** -0.5)[0].transpose(1, 2)
    prm = float64(scorer, params)
    scaled = (q.double() * (prm["s"] * N_I.log() + prm["b"] if prm else 1)).to(torch.bfloat16)  # s log n_i + b
    assert torch.equal(got, F.scaled_dot_product_attention(scaled, k, v, is_causal=True))
    want = score_softmax(scaled.double(), k.double(), N_I, CAUSAL) @ v.double()  # SDPA's bf16 within a rounding
    assert (got.double() - want).abs().max() < 2 * BF16_U * v.abs().max()


def test_a_scaling_other_than_1_over_sqrt_head_dim_is_refused_never_scored_at_it():
    q, k, v = qkv(torch.float32)
    spec = layer("ssa", per_head("ssa"))
    ok = hf_scorers.attention(spec, q, k, v, None, scaling=D ** -0.5)[0].transpose(1, 2)  # as Llama passes it
    want = SCORERS["ssa"].weights(q.double(), k.double(), N_I, CAUSAL, **float64("ssa", per_head("ssa"))) @ v.double()
    torch.testing.assert_close(ok.double(), want, rtol=1e-5, atol=1e-6)
    for scaling in (1.0, 2 * D ** -0.5):  # Granite's attention_multiplier, Gemma's query_pre_attn_scalar
        with pytest.raises(ValueError, match=rf"the scorers scale q.k by 1/sqrt\(head_dim\), not {scaling}$"):
            hf_scorers.attention(spec, q, k, v, None, scaling=scaling)


def test_a_granite_model_with_an_attention_multiplier_is_refused_by_the_scorers():
    from transformers import GraniteConfig, GraniteForCausalLM
    cfg = GraniteConfig(vocab_size=32, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=2, attention_multiplier=0.5, nanoscorer={"scorer": "ssa", "params": {}})
    model = GraniteForCausalLM(cfg).eval()
    model.set_attn_implementation(hf_scorers.NAME)
    with pytest.raises(ValueError, match=r"scale q.k by 1/sqrt\(head_dim\), not 0.5"):  # 1/sqrt(16) = 0.25
        model(torch.tensor([[1, 2, 3]]))


REFUSED = [name for name, e in SCORERS.items() if e.p is not None or e.forget or e.logit is None] + ["nosuch"]


@pytest.mark.parametrize("scorer", REFUSED)
def test_a_scorer_hf_scorers_does_not_run_is_refused_never_run_as_another(scorer):
    # lssar (re-weighted) had run as plain lssa: its weights function is lssa's, re-weighting is applied elsewhere
    q, k, v = qkv(torch.float32)
    assert scorer not in hf_scorers.RUNS
    with pytest.raises(ValueError, match=f"hf_scorers runs {', '.join(hf_scorers.RUNS)}, not scorer '{scorer}'$"):
        hf_scorers.attention(layer(scorer, {}), q, k, v, None, scaling=D ** -0.5)


BLOCKS = [({"scorer": "ssa", "params": {"b": [[1.0] * H], "n": [[0.5] * H]}}, "'n': scorer 'ssa' takes b, n, each 1 "
           "layers x 2 heads of finite values > 1"),  # n = 0.5 ran, though SSA needs n > 1
          ({"scorer": "ssmax", "params": {"z": [[1.0] * H]}}, "'z': scorer 'ssmax' takes s, b"),  # ran at s = 1
          ({"scorer": "ssa", "params": {"b": [[1.0] * H] * 2}}, "'b': scorer 'ssa'"),  # 2 layers of 1: IndexError
          ({"scorer": "ssa", "params": {"b": [[1.0] * 3]}}, "'b': scorer 'ssa'"),  # 3 heads of 2: deep RuntimeError
          ({"scorer": "ssa"}, "has no params dict")]  # KeyError


@pytest.mark.parametrize("spec,words", BLOCKS, ids=["n_low", "unknown", "layers", "heads", "no_params"])
def test_a_config_block_convert_hf_would_refuse_is_refused_here_too_never_run(spec, words):
    q, k, v = qkv(torch.float32)
    module = layer("ssa", {})
    module.config.nanoscorer = spec
    with pytest.raises(ValueError, match=words):
        hf_scorers.attention(module, q, k, v, None, scaling=D ** -0.5)


@pytest.mark.parametrize("extra", [dict(softcap=2.0), dict(s_aux=torch.zeros(H)), dict(dropout=0.5)])
def test_softcap_sinks_and_training_dropout_are_refused_never_dropped(extra):
    q, k, v = qkv(torch.float32)  # Gemma 2's softcap ran 0.55 off, gpt-oss's sinks 0.38, dropout never applied
    module = layer("ssa", per_head("ssa"))
    module.training = "dropout" in extra
    with pytest.raises(ValueError, match="hf_scorers runs no attention (softcap|s_aux|dropout)"):
        hf_scorers.attention(module, q, k, v, None, scaling=D ** -0.5, **extra)
    module.training = False  # eval: dropout is off anyway
    hf_scorers.attention(module, q, k, v, None, scaling=D ** -0.5, dropout=0.5)
