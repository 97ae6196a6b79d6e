"""The Llama family's model fields (issue #46, item 1): grouped-query attention on every backend against the float64
reference (forward and backward, after a KV cache too), RMSNorm's eps, tied embeddings, and checkpoints written
before these fields load as before. CPU; Triton through the interpreter."""
import math
from dataclasses import asdict

import pytest
import torch

from lib.checkpoint import read_checkpoint, save_checkpoint
from model import GPT, GPTConfig, SCORERS

# every scorer x every backend that runs it on a CPU (flex: forward only on a CPU)
CASES = [(s, b) for s, e in SCORERS.items() for b in e.backends if b != "torch"]


def tiny(scorer="softmax", backend="torch", **kw):
    cfg = dict(vocab_size=40, block_size=24, n_layer=1, n_head=4, n_kv_head=2, n_embd=64, ffn_hidden=64,
               scorer=scorer, backend=backend, pos="nope" if SCORERS[scorer].forget or scorer == "stickbreaking"
               else "rope")
    return GPT(GPTConfig(**{**cfg, **kw}))


@pytest.mark.parametrize("scorer,backend", CASES, ids=[f"{s}-{b}" for s, b in CASES])
def test_grouped_query_attention_equals_the_float64_reference_forward_and_backward(scorer, backend):
    torch.manual_seed(0)
    ref = tiny(scorer).double()
    model = tiny(scorer, backend)
    model.load_state_dict(ref.state_dict())
    x = torch.randint(0, 40, (2, 21))  # not a multiple of any block
    want, _ = ref(x, x)
    with torch.set_grad_enabled(backend != "flex"):  # a CPU refuses flex's backward
        got, _ = model(x, x)
    assert (got.double() - want).abs().max() < 1e-4, (got.double() - want).abs().max()
    if backend == "flex":
        return
    want.square().mean().backward()
    got.square().mean().backward()
    w = "transformer.h.0.attn.c_attn.weight"  # q, k and v's rows: the KV heads' gradients sum their groups
    g_ref, g = dict(ref.named_parameters())[w].grad, dict(model.named_parameters())[w].grad
    assert (g.double() - g_ref).abs().max() < 1e-4 * g_ref.abs().max()


@pytest.mark.parametrize("backend", ["torch", "sdpa"])
def test_grouped_query_attention_cache_keeps_only_the_kv_heads_and_decodes_as_without_it(backend):
    torch.manual_seed(1)
    model = tiny("ssmax", backend).eval()
    x = torch.randint(0, 40, (1, 6))
    cache = [{}]
    model(x, cache=cache)
    assert cache[0]["k"].shape == (1, 2, 6, 16)  # n_kv_head = 2: half the memory of 4 heads
    assert torch.equal(model.generate(x, 8, temperature=0), model.generate(x, 8, temperature=0, use_cache=False))


def test_norm_eps_and_tied_embeddings_are_the_models():
    model = tiny(norm_eps=1e-5, tie_embeddings=True)
    assert all(m.eps == 1e-5 for m in model.modules() if hasattr(m, "eps"))
    assert model.lm_head.weight is model.transformer.wte.weight  # one matrix: trained once
    assert model.get_num_params() == tiny().get_num_params() - 40 * 64
    x = torch.randn(3, 64)  # RMSNorm: x / sqrt(mean x^2 + eps) * w
    want = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    assert torch.allclose(model.transformer.ln_f(x), want, atol=1e-6)
    with pytest.raises(ValueError, match=r"n_kv_head=3 must divide n_head=4"):
        GPTConfig(n_head=4, n_kv_head=3, n_embd=64)


def test_a_checkpoint_written_before_these_fields_loads_as_before(tmp_path):
    torch.manual_seed(2)
    model = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=1, n_head=2, n_embd=32, ffn_hidden=64))
    old_args = {k: v for k, v in asdict(model.config).items() if k not in ("n_kv_head", "norm_eps", "tie_embeddings")}
    path = str(tmp_path / "old.pt")
    save_checkpoint({"model": model.state_dict(), "model_args": old_args}, path)
    ckpt = read_checkpoint(path)
    assert ckpt["model_args"]["n_kv_head"] is None and ckpt["model_args"]["norm_eps"] == 1e-6
    again = GPT(GPTConfig(**ckpt["model_args"]))
    again.load_state_dict(ckpt["model"])
    x = torch.randint(0, 40, (1, 16))
    assert torch.equal(again(x, x)[0], model(x, x)[0])
    assert math.isclose(again.transformer.ln_f.eps, 1e-6)


def test_rmsnorm_adds_eps_inside_the_root_of_the_mean_over_the_last_dim_in_float64():
    # inputs ~1e-3: mean x^2 ~1e-6 < eps = 1e-5, where eps inside or outside the root differ threefold
    norm = tiny(norm_eps=1e-5).transformer.ln_f.double()
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 64))
    x = 1e-3 * torch.randn(2, 3, 64, dtype=torch.float64)
    want = x / torch.sqrt((x ** 2).sum(-1, keepdim=True) / 64 + 1e-5) * norm.weight
    torch.testing.assert_close(norm(x), want, rtol=1e-6, atol=0)
