"""Re-weighting's backward in the fused kernels (kernels.py, _attn_bwd_dq): the renormalisations that keep its
recomputed weights those of the forward, where p n / y amplifies P's rounding: lf (the recomputed sum of Pf) folded
into M2 for dq and dk/dv, and 16-bit inputs' single walk dividing sigma by the recomputed sum of stage-1 P. Each is
invisible against the float64 reference at ordinary logits; these pin them where they matter. CPU, the interpreter."""
import pytest
import torch

from test_kernels import _check, _err, _inputs, _run, triton_attention


def test_reweighted_backward_weights_sum_to_one_per_row_as_the_forwards_do():
    # do = identity puts row i's backward weights in column i of dv: sum_j dv_j = sum_j Pf_ij. ssa's backward
    # recomputes P as F (1 + b|z|), not bit-equal to the forward's, and at small logits (y = n P - 1 ~ 1e-3) p = 15
    # amplifies that; only the renormalisation by lf keeps the rows at one (without it: off by 3e-3)
    q, k, v, _ = _inputs(20, 5, 32, B=1)
    do = torch.eye(20, 32).expand(1, 2, 20, 32).contiguous()
    out, dq, dk, dv, db = _run(triton_attention, "ssa", dict(b=[0.5, 2.0], p=15.0), q * 1e-3, k, v, do,
                               torch.float32, 5)
    assert torch.isfinite(dq).all() and torch.isfinite(db).all()
    row_sums = dv.double().sum(2)[..., :20]
    assert (row_sums - 1).abs().max() < 1e-4, (row_sums - 1).abs().max()


def test_16_bit_single_walk_reweighted_gradients_equal_the_fp32_walks_where_rounded_rows_do_not_sum_to_one():
    # a common component of q and k adds 2.5e5 to every logit (rows not one-hot): fp32 rounds them by ~0.03, so the
    # recomputed stage-1 P of a row sums to 1 +- 1e-2. fp32 inputs walk for sigma and divide it by that sum; 16-bit
    # ones sum sigma in the re-weighting walk and must divide by it too (without: dq off by 0.4). The interpreter runs
    # bf16 in fp32, so the two paths differ only by the walks and bf16's output rounding
    q, k, v, do = _inputs(20, 5, 16, B=1)
    q[..., 0], k[..., 0] = 1000.0, 1000.0
    q, k, v = (x.to(torch.bfloat16).float() for x in (q, k, v))  # both runs see the same inputs
    kw = dict(p=3.0)
    bf16 = _run(triton_attention, "softmax", kw, q, k, v, do, torch.bfloat16, 5)
    fp32 = _run(triton_attention, "softmax", kw, q, k, v, do, torch.float32, 5)
    for name, a, b in zip(["out", "dq", "dk", "dv"], bf16, fp32):
        assert torch.isfinite(a).all() and _err(a, b.double()) < 3e-2, (name, _err(a, b.double()))


@pytest.mark.parametrize("scorer,kw", [("softmax", {}), ("ssa", dict(b=[0.5, 2.0]))])
def test_reweighted_backward_keeps_fp32_accuracy_at_the_largest_p_accepted(scorer, kw):
    # p log2 y against one stored p log2 y_max + log2 l: fp32's spacing grows with p (dv off by 7.6e-5 at p = 1e3,
    # 2.3e-3 at 1e4, 0.25 at 1e6), so p is accepted up to 100 (GPTConfig, scorers.get), where it holds
    _check(scorer, dict(kw, p=100.0), 1, 500, 16, B=1, scale=2.0)
