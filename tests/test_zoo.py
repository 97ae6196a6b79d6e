"""The scorer zoo's own behaviour beyond the registry-driven checks (float64 spec, gradients, offsets, decode, every
backend: tests/test_scorers.py, test_sdpa.py, test_kernels.py, test_model.py): what each paper's mechanism does at
its limits; and the training-free rescalings of a softmax model (lib/rescale.py)."""
import copy
import math

import pytest
import torch

import model
from lib import rescale
from model import GPT, SCORERS, GPTConfig, attention, attention_weights


def _qkv(T=12, D=8, seed=0, B=2, H=2):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in range(3)]


def test_stickbreaking_gives_the_nearest_earlier_key_everything_when_every_beta_is_one():
    k = torch.ones(2, 2, 12, 8, dtype=torch.float64)
    q = k * 1000.0  # z = 2828 on every key: beta = 1
    P = attention_weights(q, k, "stickbreaking")
    T = q.size(2)
    expect = torch.diag(torch.ones(T - 1, dtype=torch.float64), -1)  # row i: all on key i - 1; row 0: nothing
    torch.testing.assert_close(P, expect.expand_as(P), rtol=0, atol=1e-12)


def test_stickbreaking_rows_sum_to_at_most_one_row_0_is_zero_and_the_rest_fades_with_small_betas():
    q, k, v = _qkv(T=30)
    P = attention_weights(q, k, "stickbreaking")
    assert (P[..., 0, :] == 0).all() and (P.diagonal(dim1=-2, dim2=-1) == 0).all()  # the current key: never
    assert (P.sum(-1) <= 1 + 1e-12).all()
    low = attention_weights(-torch.ones_like(q), torch.ones_like(k) * 50, "stickbreaking")  # z = -141: beta ~ 0
    assert low.sum(-1).max() < 1e-40  # nothing allocated
    out = attention(q, k, v, "stickbreaking", backend="cpu")
    torch.testing.assert_close(out[..., 0, :], torch.zeros_like(out[..., 0, :]))  # the unallocated rest adds 0


def test_fox_with_forget_gates_at_one_is_softmax_and_at_zero_attends_to_its_own_key():
    q, k, v = _qkv()
    T = q.size(2)
    ones = torch.zeros(2, 2, T, dtype=torch.float64)  # log f = 0
    torch.testing.assert_close(attention(q, k, v, "fox", c=ones), attention(q, k, v, "softmax"))
    closed = torch.full((2, 2, T), -200.0, dtype=torch.float64).cumsum(-1)  # log f = -200: every earlier key gone
    for backend in ("torch", "sdpa"):
        torch.testing.assert_close(attention(q, k, v, "fox", c=closed, backend=backend), v)


def test_fox_on_sdpa_by_row_blocks_after_a_cache_equals_the_reference_values_and_gradients(monkeypatch):
    import kernels_sdpa
    monkeypatch.setattr(kernels_sdpa, "MASK_ROWS", 8)  # 256 rows a block: here 8, so that 21 rows make 3 blocks
    q, k, v = (x.requires_grad_() for x in _qkv(T=26))
    c = torch.nn.functional.logsigmoid(torch.randn(2, 2, 26, dtype=torch.float64) + 1).cumsum(-1).requires_grad_()
    for offset in (0, 5):
        out = [attention(q[:, :, offset:], k, v, "fox", offset=offset, c=c, backend=b) for b in ("sdpa", "torch")]
        grads = [torch.autograd.grad(o.sum(), (q, k, v, c)) for o in out]
        for a, b in zip([out[0], *grads[0]], [out[1], *grads[1]]):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_fox_on_sdpa_takes_c_i_minus_c_j_in_fp32_so_bf16_decoding_after_a_long_cache_keeps_it():
    # c_i itself cancels in the softmax: c_j - c_0 (~600 here) rounded to bf16 moved the near keys' biases by ~4
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, T, 16, generator=g, dtype=torch.float64).bfloat16() for T in (3, 600, 600))
    c = torch.full((1, 2, 600), -1.0).cumsum(-1)  # log f = -1: c down to -600
    ref = attention(q.double(), k.double(), v.double(), "fox", offset=597, c=c.double(), backend="torch")
    assert (attention(q, k, v, "fox", offset=597, c=c, backend="sdpa").double() - ref).abs().max() < 2e-2


def test_fox_model_gate_reads_the_layer_input_and_a_gate_at_one_gives_the_softmax_model():
    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=2, n_embd=16, vocab_size=32, block_size=16, pos="nope")
    fox, soft = GPT(GPTConfig(scorer="fox", **cfg)), GPT(GPTConfig(scorer="softmax", **cfg))
    missing = soft.load_state_dict(fox.state_dict(), strict=False)
    assert sorted(missing.unexpected_keys) == sorted(f"transformer.h.{i}.attn.fgate.{w}" for i in range(2)
                                                     for w in ("weight", "bias"))
    assert all((b.attn.fgate.bias == 0).all() for b in fox.transformer.h)  # f = sigmoid(w x): 1/2 on average
    idx = torch.randint(0, 32, (2, 16))
    assert not torch.allclose(fox(idx, idx)[0], soft(idx, idx)[0])  # f = 1/2 at init: a real decay
    with torch.no_grad():
        for block in fox.transformer.h:
            block.attn.fgate.weight.zero_()
            block.attn.fgate.bias.fill_(40.0)  # log sigmoid(40) ~ -4e-18
    torch.testing.assert_close(fox(idx, idx)[0], soft(idx, idx)[0])


def test_fgate_bias_init_starts_foxs_forget_gates_near_one_and_is_refused_on_scorers_without_a_gate():
    cfg = dict(n_layer=2, n_head=2, n_embd=16, vocab_size=32, block_size=16, pos="nope")
    fox = GPT(GPTConfig(scorer="fox", fgate_bias_init=4.0, **cfg))
    assert all((b.attn.fgate.bias == 4.0).all() for b in fox.transformer.h)  # f = sigmoid(4 + w x) ~ 0.98
    for scorer, value in (("softmax", 4.0), ("fox", math.inf)):
        with pytest.raises(ValueError, match=f"option fgate_bias_init={value!r} applies only to a scorer with a "
                                             f"forget gate \\(fox\\), finite; scorer='{scorer}'"):
            GPTConfig(scorer=scorer, fgate_bias_init=value, **cfg)


def test_fox_model_on_the_triton_kernels_matches_the_reference_and_decodes_through_the_kv_cache():
    # the fused path (interpreted on CPU) reads the model's c (B, nh, offset + T), carried in the cache
    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=2, n_embd=32, vocab_size=32, block_size=24, pos="nope", scorer="fox")  # D = 16
    fused, ref = GPT(GPTConfig(**cfg, backend="triton")).eval(), GPT(GPTConfig(**cfg, backend="torch")).eval()
    ref.load_state_dict(fused.state_dict())
    idx = torch.randint(0, 32, (2, 24))
    _, loss = fused(idx, idx)
    loss.backward()
    assert all(block.attn.fgate.weight.grad.abs().sum() > 0 for block in fused.transformer.h)  # dc reaches the gate
    with torch.no_grad():
        torch.testing.assert_close(fused(idx, idx)[0], ref(idx, idx)[0], rtol=1e-4, atol=1e-4)
        cache = [{} for _ in fused.transformer.h]
        steps = [fused(idx[:, :10], cache=cache)[0]] + [fused(idx[:, t:t + 1], cache=cache)[0] for t in range(10, 24)]
        torch.testing.assert_close(torch.cat(steps, 1), ref(idx, idx)[0][:, 9:], rtol=1e-4, atol=1e-4)


def test_training_free_rescalings_have_the_published_factors():
    n = torch.arange(1, 4097, dtype=torch.float64)
    qwen = rescale.factors("qwen", 4096, 32)
    assert (qwen[:32] == 1).all() and math.isclose(qwen[1023], 2.0, rel_tol=1e-6)  # log 1024 / log 32
    torch.testing.assert_close(qwen[32:].double(), n[32:].log() / math.log(32), rtol=1e-6, atol=0)
    yarn = rescale.factors("yarn", 4096, 32)
    assert torch.allclose(yarn, torch.full_like(yarn, (0.1 * math.log(128) + 1) ** 2))
    assert (rescale.factors("yarn", 32, 32) == 1).all()  # no extension, no temperature
    assert (rescale.factors("llama4", 4096, 32) == 1).all()  # Llama 4's floor 8,192: nothing below it
    llama = rescale.factors("llama4", 100, 32, floor=32)  # n_i = 32..63: floor 1; 64..95: 2; 96..: 3
    assert (llama[:31] == 1).all() and math.isclose(llama[31], 1 + 0.1 * math.log(2), rel_tol=1e-6)
    assert math.isclose(llama[95], 1 + 0.1 * math.log(4), rel_tol=1e-6)
    assert (rescale.factors("2.5", 4096, 32) == 2.5).all()  # a constant temperature: every row, every length
    assert rescale.kind("2.50") == "2.5" and rescale.kind("qwen") == "qwen"  # --logit_scale's values, as labelled
    assert rescale.kind("1e6") == "1e+06"  # the largest factor taken
    assert rescale.kind("1e-6") == "1e-06" and rescale.kind("1.0000001") == "1.0000001"  # was "1": named as it runs
    for bad in ("ntk", "0", "-1", "inf", "nan", "1e300", "1e-300"):  # 1e300: rows nan; 1e-300: a factor 0 in fp32
        with pytest.raises(ValueError, match=f"--logit_scale '{bad}': one of qwen, yarn, llama4, or a factor c in"):
            rescale.factors(bad, 8, 4)


def test_a_bf16_query_takes_the_factor_unrounded(monkeypatch):
    # eval_long and eval_copy run bf16 on a GPU: the factor was rounded to bf16 first (qwen 1.0039 -> 1.0 past N)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=32, block_size=8, pos="nope")).to(torch.bfloat16)
    seen = []
    monkeypatch.setattr(model, "attention", lambda q, *a, **kw: seen.append(q) or q)
    idx = torch.randint(0, 32, (1, 40))
    m(idx)
    rescale.apply(m, "qwen", 40)
    m(idx)
    f = rescale.factors("qwen", 40, 8)[None, None, :, None]
    assert torch.equal(seen[1], (seen[0].float() * f).to(torch.bfloat16))


def test_a_rescaled_softmax_model_equals_one_whose_query_weights_carry_the_factor():
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=32, block_size=8, pos="nope")
    m, idx = GPT(cfg).eval(), torch.randint(0, 32, (2, 24))
    plain = m(idx, idx)[0]
    rescale.apply(m, "yarn", 24)  # one factor for every row: (0.1 ln 3 + 1)^2
    scaled = copy.deepcopy(m)
    rescale.apply(scaled, None, 24)
    with torch.no_grad():
        for block in scaled.transformer.h:
            block.attn.c_attn.weight[:16] *= (0.1 * math.log(3) + 1) ** 2
    torch.testing.assert_close(m(idx, idx)[0], scaled(idx, idx)[0])
    assert not torch.allclose(m(idx, idx)[0], plain)
    rescale.apply(m, None, 24)
    torch.testing.assert_close(m(idx, idx)[0], plain)  # None takes it off
    with pytest.raises(ValueError, match="rescales softmax models; got one with scorer='ssmax'"):
        rescale.apply(GPT(GPTConfig(**{**cfg.__dict__, "scorer": "ssmax"})), "qwen", 24)
    rescale.apply(m, "yarn", 24)
    cache = [{} for _ in m.transformer.h]
    m(idx[:1, :23], cache=cache)
    with pytest.raises(AssertionError, match="q_scale has 24 rows, not 25"):  # 2 rows after 23: row 23's factor
        m(idx[:1, 22:24], cache=cache)                                        # broadcast to both, silently


def test_a_llama4_floor_without_llama4_is_refused_not_ignored():
    rescale.check(["softmax"], "llama4", floor=64)
    for kind in (None, "qwen", "2"):  # eval_tasks, eval_long, eval_copy took it and did nothing with it
        with pytest.raises(ValueError, match=f"--llama4_floor 64 sets --logit_scale llama4's F; it does nothing with "
                                             f"--logit_scale {kind}"):
            rescale.check(["softmax"], kind, floor=64)
    rescale.check(["softmax"], "qwen", floor=rescale.LLAMA4_FLOOR)  # the default: nothing asked


def test_yarns_temperature_is_applied_once_and_only_past_the_training_length():
    with pytest.raises(ValueError, match="--logit_scale yarn with --rope_method yarn applies YaRN's temperature twice"):
        rescale.check(["softmax"], "yarn", "yarn")
    rescale.check(["softmax"], "yarn", "theta")  # the temperature on q, θ extended: one temperature
    for scale, want in ((0.5, 1.0), (1.0, 1.0), (4.0, 0.1 * math.log(4) + 1)):  # YaRN's get_mscale: 1 at scale <= 1
        assert model.rope_extension("yarn", 16, 10000.0, scale, 32, 64)[1] == pytest.approx(want)


def test_stickbreaking_backward_is_the_derivation_in_kernels_stick_docstring():
    # dL/dz_ik = G_ik sigmoid(-z_ik) - sigmoid(z_ik) sum_{j<k} G_ij, G = A * dP: what the fused backward computes
    q, k, v = _qkv(T=20)
    q.requires_grad_()
    do = torch.randn_like(q)
    dq, = torch.autograd.grad(attention(q, k, v, "stickbreaking"), q, do)
    z = (q @ k.transpose(-2, -1) / math.sqrt(8)).detach()
    A = attention_weights(q.detach(), k, "stickbreaking")
    G = A * (do @ v.transpose(-2, -1))
    dz = G * torch.sigmoid(-z) - torch.sigmoid(z) * (G.cumsum(-1) - G)  # G.cumsum - G: the farther keys j < k
    dz = dz * (A > 0)  # keys j >= i: no gradient (every A_ij > 0 at these logits)
    torch.testing.assert_close(dq, dz @ k / math.sqrt(8), rtol=1e-10, atol=1e-12)


def test_stickbreaking_fused_first_row_is_zero_and_every_beta_one_takes_the_nearest_key():
    import kernels_stick
    k = torch.rand(1, 2, 40, 16) + 0.5  # positive: every z of q = 1000 k is > 2000, beta = 1
    for q, expect in ((torch.randn(1, 2, 40, 16), None), (k * 1000.0, k)):  # beta = 1: row i reads v_{i-1}
        q, k_, v = (x.clone().requires_grad_() for x in (q, k, torch.randn(1, 2, 40, 16)))
        out = kernels_stick.attention(q, k_, v, "stickbreaking")
        assert (out[..., 0, :] == 0).all()  # row 0 has no key
        if expect is not None:
            torch.testing.assert_close(out[..., 1:, :], v[..., :-1, :].detach())
        out.backward(torch.randn_like(out))
        assert all(torch.isfinite(x.grad).all() for x in (q, k_, v)) and (q.grad[..., 0, :] == 0).all()
        assert (v.grad[..., -1, :] == 0).all()  # the last key: no row after it


@pytest.mark.parametrize("backend", [b for b in SCORERS["stickbreaking"].backends if b != "torch"])
def test_stickbreaking_stays_finite_when_a_future_keys_logit_is_past_exps_range(backend):
    # later keys score up to ~400 (fp32's exp overflows past 88): the cut future keys must not turn exp's inf into
    # inf * 0 = nan, as kernels_cpu's did (every recall run at lr 1e-2 stopped with a nan loss; the reference trained)
    q, k, v = _qkv(T=40, D=16, B=1, H=2)  # D 16: the Triton kernel's least
    k[..., 0] = torch.arange(40, dtype=torch.float64) * 4.0
    q[..., 0] = 10.0
    want = [x.requires_grad_() for x in (q, k, v)]
    ref = attention(*want, "stickbreaking")
    ref.backward(torch.ones_like(ref))
    got = [x.detach().float().requires_grad_() for x in (q, k, v)]
    out = attention(*got, "stickbreaking", backend=backend)
    out.backward(torch.ones_like(out))
    assert (q @ k.transpose(-2, -1) / 4).max() > 300
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-4, atol=1e-4)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.grad.double(), w.grad, rtol=1e-3, atol=1e-3)


def test_stickbreaking_model_on_the_triton_kernels_matches_the_reference_and_decodes_through_the_kv_cache():
    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=2, n_embd=32, vocab_size=32, block_size=24, pos="nope", scorer="stickbreaking")
    fused, ref = GPT(GPTConfig(**cfg, backend="triton")).eval(), GPT(GPTConfig(**cfg, backend="torch")).eval()
    ref.load_state_dict(fused.state_dict())
    idx = torch.randint(0, 32, (2, 24))
    fused(idx, idx)[1].backward()
    ref(idx, idx)[1].backward()
    for (name, a), b in zip(fused.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(fused(idx, idx)[0], ref(idx, idx)[0], rtol=1e-4, atol=1e-4)
        cache = [{} for _ in fused.transformer.h]
        steps = [fused(idx[:, :10], cache=cache)[0]] + [fused(idx[:, t:t + 1], cache=cache)[0] for t in range(10, 24)]
        torch.testing.assert_close(torch.cat(steps, 1), ref(idx, idx)[0][:, 9:], rtol=1e-4, atol=1e-4)


# bench/stick_blocks.py: stick-breaking's tile sweep, through the same code as on a GPU (the interpreter, tiny shapes)
@pytest.mark.filterwarnings("ignore:divide by zero")  # the interpreter's BLOCK_N = 0
def test_stick_tile_sweep_times_every_candidate_flags_one_that_computes_something_else_and_ranks_only_the_correct(
        tmp_path):
    import importlib.util
    import os
    spec = importlib.util.spec_from_file_location("stick_blocks", os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "stick_blocks.py"))
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    candidates = [(16, 16, 4, 1), (32, 16, 4, 1), (16, 0, 4, 1)]  # BLOCK_N = 0: a walk over no keys, out 0
    rows = sweep.sweep([(1, 2, 40, 16)], candidates, dtype=torch.float32, device="cpu", out=tmp_path / "s")
    assert [(r["BLOCK_M"], r["BLOCK_N"]) for r in rows] == [(16, 16), (32, 16), (16, 0)]
    for r in rows[:2]:  # T = 40: a ragged last block for both; the same numbers as the current tiles, to fp32 order
        assert r["status"] == "ok" and r["max_err"] < 1e-5 and r["fwd_ms"] > 0 and r["fwdbwd_ms"] > 0
    assert rows[2]["status"] == "wrong" and rows[2]["max_err"] > 0.5
    with open(tmp_path / "s.csv") as fh:
        assert len(fh.read().strip().splitlines()) == 1 + len(candidates)
    picks = sweep.best(rows)
    assert set(picks) == {(1, 2, 40, 16, "fwd_ms"), (1, 2, 40, 16, "bwd_ms")}
    assert picks[1, 2, 40, 16, "fwd_ms"] is min(rows[:2], key=lambda r: r["fwd_ms"])  # never the wrong one
    assert picks[1, 2, 40, 16, "bwd_ms"] is min(rows[:2], key=lambda r: r["bwd_ms"])


def test_qwen_and_yarn_refuse_a_model_whose_rope_was_already_extended():
    # an imported Llama 3.1 (131,072 positions over 8,192 trained): N = 131,072 made both factors 1 at every length
    scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=8)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=32, block_size=64, rope_scaling=scaling))
    for kind in ("qwen", "yarn"):
        with pytest.raises(ValueError, match=f"--logit_scale {kind} needs the training length N; .* llama3"):
            rescale.apply(m, kind, 128)
        with pytest.raises(ValueError, match="already extended \\(rope_scaling linear\\)"):  # all, before the 1st
            rescale.check(["softmax"] * 2, kind, scalings=[None, dict(rope_type="linear", factor=4.0)])
    rescale.apply(m, "llama4", 128)  # F, not N
    rescale.apply(m, "2", 128)
