"""The scorer zoo's own behaviour beyond the registry-driven checks (float64 spec, gradients, offsets, decode, every
backend: tests/test_scorers.py, test_sdpa.py, test_kernels.py, test_model.py): what each paper's mechanism does at
its limits."""
import torch

from model import GPT, GPTConfig, attention, attention_weights


def _qkv(T=12, D=8, seed=0, B=2, H=2):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in range(3)]


def test_stickbreaking_gives_the_nearest_earlier_key_everything_when_every_beta_is_one():
    q, k, v = _qkv()
    q, k = torch.ones_like(q) * 1000.0, torch.ones_like(k)  # z = 2828 on every key: beta = 1
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
