"""Stick-breaking attention's Triton kernels (kernels_stick.py) on what tests/test_kernels.py's shared cases leave
out: hand-computed weights, strided inputs as the model passes them, and the inputs it refuses. Tiny shapes: on CPU
the kernels run in Triton's interpreter."""
import math

import pytest
import torch

import kernels_stick
import model


def _ref64(q, k, v, offset=0):  # scorers.py's float64 reference
    return model.attention(q.double(), k.double(), v.double(), "stickbreaking", offset=offset, backend="torch")


def test_weights_are_beta_times_the_sticks_left_by_the_nearer_keys_by_hand():
    # z_ij = z_j (q = 4 e_0, k_j = z_j e_0, sqrt(D) = 4), v_j = e_j: out_i[j] = A_ij. beta: 1/2, 3/4, 1/4, 1/2
    D, z = 16, [0.0, math.log(3), -math.log(3), 0.0]
    q = torch.zeros(1, 1, 4, D)
    q[..., 0] = 4.0
    k = torch.zeros(1, 1, 4, D)
    k[0, 0, :, 0] = torch.tensor(z)
    v = torch.eye(4, D)[None, None]
    want = torch.tensor([[0, 0, 0, 0],  # row 0 has no key
                         [1 / 2, 0, 0, 0],
                         [1 / 2 * 1 / 4, 3 / 4, 0, 0],  # key 0 keeps what key 1 (beta 3/4) leaves
                         [1 / 2 * 1 / 4 * 3 / 4, 3 / 4 * 3 / 4, 1 / 4, 0]])
    got = kernels_stick.attention(q, k, v)[0, 0, :, :4]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("Tq,offset", [(33, 0), (65, 0), (1, 64)])  # a block's last row at 32, 64: hi % 32 == 0
def test_the_first_key_behind_keys_of_tiny_beta_keeps_half_the_stick_at_a_block_multiple(Tq, offset):
    # beta_i0 = 1/2, every other beta ~ 2e-9: each row keeps ~1/2 of key 0, however far (the walk's last tile)
    D, T = 16, offset + Tq
    q = torch.zeros(1, 1, Tq, D)
    q[..., 0] = 4.0
    k = torch.zeros(1, 1, T, D)
    k[0, 0, 1:, 0] = -20.0
    v = torch.randn(1, 1, T, D, generator=torch.Generator().manual_seed(0))
    v[0, 0, 0] = 1.0
    do = torch.randn(1, 1, Tq, D, generator=torch.Generator().manual_seed(1))
    xs = [x.requires_grad_() for x in (q, k, v)]
    out = kernels_stick.attention(*xs, offset=offset)
    rows = torch.arange(offset, T)
    want0 = torch.where(rows > 0, 0.5 * torch.sigmoid(torch.tensor(20.0, dtype=torch.float64)) ** (rows - 1), 0.0)
    assert (out[0, 0, :, 0].double() - want0).abs().max() < 1e-6  # the other keys add ~2e-9 |v| each
    fused = [out, *torch.autograd.grad(out, xs, do)]
    xs64 = [x.detach().double().requires_grad_() for x in xs]
    out64 = _ref64(*xs64, offset=offset)
    for name, a, r in zip(["out", "dq", "dk", "dv"], fused, [out64, *torch.autograd.grad(out64, xs64, do.double())]):
        assert (a.double() - r).abs().max().item() / max(r.abs().max().item(), 1.0) < 1e-4, name


@pytest.mark.parametrize("T", [1, 33, 70])  # one row; one past a 32-key block; two blocks and a partial one
def test_strided_views_as_the_model_passes_them_match_the_float64_reference_forward_and_grads(T):
    B, H, D = 2, 2, 16
    g = torch.Generator().manual_seed(T)
    qkv = torch.randn(B, T, 3 * H * D, generator=g)
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(H * D, dim=2))
    assert not q.is_contiguous()
    do = torch.randn(B, H, T, D, generator=g)
    xs = [x.detach().requires_grad_() for x in (q, k, v)]
    fused = [kernels_stick.attention(q, k, v), *torch.autograd.grad(kernels_stick.attention(*xs), xs, do)]
    xs64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
    out64 = _ref64(*xs64)
    ref = [out64, *torch.autograd.grad(out64, xs64, do.double())]
    for name, a, r in zip(["out", "dq", "dk", "dv"], fused, ref):
        scale = max(r.abs().max().item(), 1.0)
        assert (a.double() - r).abs().max().item() / scale < 1e-4, name


@pytest.mark.parametrize("D,dtypes,words", [
    (8, (torch.float32,) * 3, "head dim 8 not supported (16, 32, 64, 128)"),
    (16, (torch.float64,) * 3, "must share one of fp32/fp16/bf16"),
    (16, (torch.float32, torch.float16, torch.float32), "must share one of fp32/fp16/bf16"),
])
def test_head_dims_and_dtypes_without_a_kernel_are_refused_with_a_clear_error(D, dtypes, words):
    q, k, v = (torch.randn(1, 1, 5, D, dtype=dt) for dt in dtypes)
    with pytest.raises(AssertionError, match=words.replace("(", r"\(").replace(")", r"\)")):
        kernels_stick.attention(q, k, v)
