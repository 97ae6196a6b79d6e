"""The GPT around the scorers: size, causality, KV cache, parameters that learn, configs, RoPE, conversion."""
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

import model
from cases import VARIANTS  # every scorer and option, from the registry
from lib import checkpoint, tracking
from model import GPT, GPTConfig


def tiny(**kw):
    cfg = dict(block_size=32, vocab_size=64, n_layer=2, n_head=2, n_embd=16, ffn_hidden=32)
    return GPTConfig(**{**cfg, **kw})


def test_ssmax_paper_model_has_162m_parameters():
    with torch.device("meta"):
        n = GPT(GPTConfig(scorer="ssmax")).get_num_params()
    assert abs(n - 162e6) < 1e6
    assert n == 162_148_608 + 144  # softmax model + s per layer and head: the paper's 144 extra parameters


def test_config_rejects_unknown_scorer_and_options_of_other_scorers():
    with pytest.raises(ValueError, match="unknown scorer 'ssmx'"):
        GPTConfig(scorer="ssmx")
    with pytest.raises(ValueError, match="ssa_n=2.0 does not apply to scorer='softmax'"):
        GPTConfig(scorer="softmax", ssa_n=2.0)
    with pytest.raises(ValueError, match="ssmax_bias=True does not apply to scorer='lssa'"):
        GPTConfig(scorer="lssa", ssmax_bias=True)
    with pytest.raises(ValueError, match="ssa_n > 1"):
        GPTConfig(scorer="ssa", ssa_n=1.0)
    with pytest.raises(ValueError, match="reweight_p"):
        GPTConfig(reweight_p=0.0)
    assert GPTConfig(scorer="lssar").p == 15.0 and GPTConfig(scorer="lssa").p is None


@pytest.mark.parametrize("variant", VARIANTS)
def test_changing_a_future_token_leaves_earlier_logits_unchanged(variant):
    torch.manual_seed(0)
    m = GPT(tiny(**VARIANTS[variant])).eval()
    idx = torch.randint(0, 64, (2, 12))
    idx2 = idx.clone()
    idx2[:, 7] = (idx2[:, 7] + 1) % 64
    l1, _ = m(idx, idx)
    l2, _ = m(idx2, idx2)
    torch.testing.assert_close(l1[:, :7], l2[:, :7], rtol=0, atol=0)
    assert not torch.allclose(l1[:, 7:], l2[:, 7:])


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_generation_equals_uncached(variant):
    torch.manual_seed(0)
    m = GPT(tiny(**VARIANTS[variant])).eval()
    idx = torch.randint(0, 64, (2, 5))
    out_cached = m.generate(idx, 20, temperature=0, use_cache=True)
    out_full = m.generate(idx, 20, temperature=0, use_cache=False)
    assert torch.equal(out_cached, out_full)
    # logits of every step: cached decoding (one token at a time) against one full forward pass
    cache = [{} for _ in m.transformer.h]
    step_logits = [m(out_full[:, :5], cache=cache)[0]]
    for t in range(5, out_full.size(1)):
        step_logits.append(m(out_full[:, t:t + 1], cache=cache)[0])
    full_logits, _ = m(out_full, out_full)
    torch.testing.assert_close(torch.cat(step_logits, 1), full_logits[:, 4:], rtol=1e-5, atol=1e-5)


def test_fox_decodes_a_float64_model_exactly_its_forget_gates_in_float64():
    torch.manual_seed(0)
    m = GPT(tiny(**VARIANTS["fox"])).double().eval()
    idx, cache = torch.randint(0, 64, (2, 12)), [{} for _ in m.transformer.h]
    steps = [m(idx[:, :5], cache=cache)[0]] + [m(idx[:, t:t + 1], cache=cache)[0] for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), m(idx, idx)[0][:, 4:], rtol=1e-12, atol=1e-12)  # fp32 c: 3e-6


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_scorer_parameter_gets_a_nonzero_gradient(variant):
    torch.manual_seed(0)
    m = GPT(tiny(**VARIANTS[variant]))
    idx = torch.randint(0, 64, (2, 16))
    _, loss = m(idx, idx)
    loss.backward()
    cfg = m.config  # the registry says which parameters exist and learn
    expected = [model.param_name(cfg.scorer, prm) for prm in model.SCORERS[cfg.scorer].params
                if (not prm.only_if or getattr(cfg, prm.only_if)) and (not prm.learn or getattr(cfg, prm.learn))]
    expected += ["fgate.weight", "fgate.bias"] * model.SCORERS[cfg.scorer].forget  # FoX's forget gate
    for block in m.transformer.h:
        learnable = [name for name, _ in block.attn.named_parameters() if not name.startswith("c_")]
        assert sorted(learnable) == sorted(expected)
        for name in learnable:
            g = block.attn.get_parameter(name).grad
            assert g is not None and (g != 0).all(), f"{name} gets no gradient"


def test_ssmax_without_s_keeps_s_fixed_at_one():
    m = GPT(tiny(scorer="ssmax", ssmax_learn_s=False))
    assert all(torch.equal(b.attn.ssmax_s, torch.ones(2)) for b in m.transformer.h)
    assert "transformer.h.0.attn.ssmax_s" in m.state_dict()  # stored with the checkpoint, but not a parameter


def test_the_chosen_scorer_is_the_one_that_runs():
    torch.manual_seed(0)
    ref = GPT(tiny(scorer="softmax")).eval()
    idx = torch.randint(0, 64, (1, 16))
    base, _ = ref(idx, idx)
    for variant, kw in VARIANTS.items():
        if variant == "softmax":
            continue
        other = GPT(tiny(**kw)).eval()
        other.load_state_dict(ref.state_dict(), strict=False)  # same weights, another scorer
        logits, _ = other(idx, idx)
        assert not torch.allclose(logits, base), (f"{variant} gave softmax's logits: its default parameters must not "
                                                  f"make it softmax (SCORERS.md, Adding a scorer, step 1)")


@pytest.mark.parametrize("variant", VARIANTS)
def test_tiny_model_overfits_one_batch(variant):
    torch.manual_seed(0)
    m = GPT(tiny(**VARIANTS[variant]))
    idx = torch.randint(0, 64, (4, 17))
    x, y = idx[:, :-1], idx[:, 1:]
    opt = m.configure_optimizers(0.0, 1e-2, (0.9, 0.95), "cpu")
    first = m(x, y)[1].item()
    for _ in range(150):
        loss = m(x, y)[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 4.0 and loss.item() < 0.5, (first, loss.item())


def test_two_seeded_runs_give_identical_losses():
    def run():
        torch.manual_seed(123)
        m = GPT(tiny(scorer="ssa", ssa_learn_n=True))
        opt = m.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
        losses = []
        for _ in range(5):
            idx = torch.randint(0, 64, (2, 17))
            loss = m(idx[:, :-1], idx[:, 1:])[1]
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses
    assert run() == run()


def test_weight_decay_only_on_matrices_never_on_scorer_parameters():
    m = GPT(tiny(scorer="ssmax", ssmax_bias=True))
    opt = m.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cpu")
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"])
    ids = {id(p) for p in no_decay["params"]}
    assert all(id(b.attn.ssmax_s) in ids and id(b.attn.ssmax_b) in ids for b in m.transformer.h)


def test_convert_softmax_to_ssmax_keeps_weights_and_sets_s0():
    torch.manual_seed(0)
    src = GPT(tiny(block_size=1024))
    s0 = model.ssmax_s_for_switch(1024)
    new = model.convert_scorer(src, scorer="ssmax", ssmax_s_init=s0)
    assert new.config.scorer == "ssmax" and 0.16 < s0 < 0.175
    for b in new.transformer.h:
        torch.testing.assert_close(b.attn.ssmax_s.detach(), torch.full((2,), s0))
    sd = src.state_dict()
    for k, v in new.state_dict().items():
        if "ssmax" not in k:
            assert torch.equal(v, sd[k]), k
    idx = torch.randint(0, 64, (1, 40))
    logits, loss = new(idx, idx)
    assert torch.isfinite(logits).all() and torch.isfinite(loss)


def test_rope_theta_change_rebuilds_tables_and_keeps_weights():
    m = GPT(tiny())
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    cos = m.rope_cos.clone()
    m.set_rope(theta=500_000.0)
    assert not torch.allclose(m.rope_cos, cos) and m.rope_theta == 500_000.0
    assert all(torch.equal(v, sd[k]) for k, v in m.state_dict().items())
    assert "rope_cos" not in " ".join(sd)  # not in checkpoints: an eval script can load with another θ
    cos_ref, _ = model.precompute_rope(32, 8, theta=500_000.0)
    torch.testing.assert_close(m.rope_cos, cos_ref)


def test_rope_tables_grow_past_the_training_length_with_the_same_frequencies():
    torch.manual_seed(0)
    m = GPT(tiny(block_size=8)).eval()
    m.set_rope(theta=777.0)
    idx = torch.randint(0, 64, (1, 30))
    logits, _ = m(idx, idx)
    assert m.rope_cos.size(0) >= 30 and m.rope_theta == 777.0
    torch.testing.assert_close(m.rope_cos[:30], model.precompute_rope(30, 8, theta=777.0)[0])


def test_attention_rows_equal_the_full_weights_without_a_txt_matrix():
    torch.manual_seed(0)
    m = GPT(tiny(scorer="lssar")).eval()
    idx = torch.randint(0, 64, (1, 20))
    rows = m.attention_rows(idx, rows=(-1, 3))
    assert rows.shape == (2, 1, 2, 2, 20)
    with pytest.raises(AssertionError, match=r"rows \[25, -21\] are outside the 20 positions"):
        m.attention_rows(idx, rows=(25, 5, -21))  # row 25 was row 5's weights, without a word
    # reference: recompute layer 0's q, k and take the full weight matrix
    blk = m.transformer.h[0]
    x = blk.ln_1(m.transformer.wte(idx))
    q, k, _ = blk.attn.c_attn(x).split(16, dim=2)
    q, k = (t.view(1, 20, 2, 8).transpose(1, 2) for t in (q, k))
    q, k = model.apply_rope(q, m.rope_cos[:20], m.rope_sin[:20]), model.apply_rope(k, m.rope_cos[:20], m.rope_sin[:20])
    P = model.attention_weights(q, k, "lssar")
    torch.testing.assert_close(rows[0, :, :, 0], P[:, :, -1])
    torch.testing.assert_close(rows[0, :, :, 1], P[:, :, 3])


def test_per_token_losses_and_ignore_index():
    torch.manual_seed(0)
    m = GPT(tiny())
    idx = torch.randint(0, 64, (2, 10))
    tgt = idx.clone()
    tgt[:, :4] = -1
    _, per_tok = m(idx, tgt, reduction="none")
    _, mean = m(idx, tgt)
    assert per_tok.shape == (2, 10) and (per_tok[:, :4] == 0).all()
    torch.testing.assert_close(per_tok.sum() / 12, mean)
    # per-token losses take ~1,024 tokens' logits at a time (all B x T x vocab at once: 6.6 GB at 16k GPT-2 tokens)
    idx = torch.randint(0, 64, (350, 7))  # 1024 // 350 = 2 positions a chunk: 2, 2, 2, 1
    seen = []
    m.lm_head.register_forward_hook(lambda mod, x, out: seen.append(tuple(out.shape[:2])))
    _, per_tok = m(idx, idx, reduction="none")
    assert seen == [(350, 2)] * 3 + [(350, 1)]
    full = F.cross_entropy(m(idx, idx)[0].flatten(0, 1), idx.flatten(), reduction="none").view(350, 7)
    torch.testing.assert_close(per_tok, full, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tie,heads", [(False, {}), (True, {}), (False, dict(head_dim=48, qk_norm=True))])
def test_flops_per_token_equal_the_counted_matmuls_of_a_training_step(tie, heads):
    # an untied wte is a lookup: counting it as a matmul overstated the 162M model's MFU by 27 %; heads of their own
    # width (Qwen3's): attention's matmuls are n_head x head_dim wide, not n_embd
    from torch.utils.flop_counter import FlopCounterMode
    m = GPT(tiny(vocab_size=256, block_size=32, backend="torch", tie_embeddings=tie, **heads))
    assert tracking.mfu(m, 1000.0, 32, device="cpu") is None
    x = torch.randint(0, 256, (2, 32))
    with FlopCounterMode(display=False) as fc:
        m(x, x)[1].backward()
    assert m.flops_per_token(32) == pytest.approx(fc.get_total_flops() / x.numel(), rel=0.01)


def test_checkpoint_round_trip_is_atomic_and_restores_the_model(tmp_path):
    torch.manual_seed(0)
    m = GPT(tiny(scorer="ssa", ssa_learn_n=True))
    path = str(tmp_path / "ckpt.pt")
    checkpoint.save_checkpoint({"model": m.state_dict(), "model_args": asdict(m.config)}, path)
    assert not (tmp_path / "ckpt.pt.tmp").exists()
    m2, ckpt = checkpoint.load_checkpoint(path)
    idx = torch.randint(0, 64, (1, 9))
    torch.testing.assert_close(m(idx, idx)[0], m2(idx, idx)[0])
    with pytest.raises(checkpoint.CheckpointError, match="does not exist"):
        checkpoint.load_checkpoint(str(tmp_path / "missing.pt"))


@pytest.mark.parametrize("name, peak", [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
                                        ("NVIDIA H100 NVL", 835e12), ("NVIDIA H800 PCIe", 756e12),
                                        ("NVIDIA H200", 989e12), ("NVIDIA L40S", 362e12), ("NVIDIA L40", 181e12),
                                        ("NVIDIA L4", 121e12), ("NVIDIA A100-SXM4-80GB", 312e12)])
def test_mfu_divides_by_the_dense_bf16_peak_of_the_exact_card(monkeypatch, name, peak):
    # "H100" matched the PCIe (756 TFLOP/s) and NVL (835) cards as the SXM's 989; "L4" matched the L40 (181) as 121
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    m = GPT(tiny())
    assert tracking.mfu(m, 1e6, 32, device="cuda") == pytest.approx(m.flops_per_token(32) * 1e6 / peak)


def test_init_draws_weights_at_std_002_and_residual_projections_at_002_over_sqrt_2l():
    torch.manual_seed(0)  # GPT-2's init: 256 x 256 and wider, so each std is within ~0.5 %
    m = GPT(tiny(n_layer=3, n_embd=256, ffn_hidden=256, vocab_size=256))
    for name, p in m.named_parameters():  # the norms' weights (1-D) start at 1
        want = 0.02 / 6 ** 0.5 if name.endswith("c_proj.weight") else 0.02
        assert (p == 1).all() if p.dim() == 1 else p.std().item() == pytest.approx(want, rel=0.03), name


def test_swiglu_is_c_proj_of_silu_of_w_gate_times_w_up_in_float64():
    torch.manual_seed(0)  # Llama's gate_proj / up_proj: their names carry the weights of an import
    mlp = model.MLP(tiny()).double()
    x = torch.randn(2, 3, 16, dtype=torch.float64)
    g, u = x @ mlp.w_gate.weight.T, x @ mlp.w_up.weight.T
    torch.testing.assert_close(mlp(x), (g / (1 + torch.exp(-g)) * u) @ mlp.c_proj.weight.T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kw", [dict(scorer="ssa", ssa_b_init=0.7, ssa_n=1.3, ssa_learn_n=True),
                                dict(scorer="ssmax", ssmax_s_init=0.3, ssmax_bias=True, ssmax_b_init=0.2)])
def test_scorer_parameters_start_at_their_config_values_a_kept_above_low_one_too(kw):
    cfg = tiny(**kw)  # ssa's n > 1: stored raw, used as 1 + softplus(raw)
    attn = GPT(cfg).transformer.h[0].attn
    for prm in attn.params:
        want = torch.full((2,), getattr(cfg, prm.init))
        torch.testing.assert_close(attn.scorer_params()[prm.name].detach(), want, rtol=1e-6, atol=0)
