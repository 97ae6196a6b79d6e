"""The kernels' autotune lists (kernels.FWD_TUNE, BWD_TUNE and their fp32 lists): the pruning keeps the shapes of the
inputs' dtype and drops tiles whose accumulators would spill, and every block shape a GPU may pick matches the float64
reference, each pinned in turn under Triton's interpreter (one config a launch) at T = 257, a ragged last block."""
import pytest
import torch

import kernels
from test_kernels import CASES, _check


class _Pinned:
    """An autotuned launcher pinned to one block shape (the interpreter can run only one config)."""
    def __init__(self, kernel, block_m, block_n):
        self.kernel, self.meta = kernel, dict(BLOCK_M=block_m, BLOCK_N=block_n)

    def __getitem__(self, grid):
        return lambda *args, **kw: self.kernel[grid(self.meta)](*args, **kw, **self.meta)


def test_autotune_keeps_the_shapes_of_the_inputs_dtype_and_drops_tiles_whose_accumulator_would_spill():
    import triton
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
               for m, n, w, s in kernels.FWD_TUNE + kernels.FWD_TUNE_FP32]
    prune = kernels._pick(kernels.FWD_TUNE, kernels.FWD_TUNE_FP32, "fwd")
    kept = lambda dtype, D: [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)  # noqa: E731
                             for c in prune(configs, {"Q": torch.empty(0, dtype=dtype)}, HEAD_DIM=D)]
    assert kept(torch.bfloat16, 64) == kernels.FWD_TUNE  # 128 x 64 fp32 over 128 threads: 64 registers, fits
    assert kept(torch.bfloat16, 128) == [t for t in kernels.FWD_TUNE if t[:3] != (128, 64, 4)]
    assert kept(torch.float32, 128) == kernels.FWD_TUNE_FP32  # tf32x3 shapes that fit sm_90's shared memory


def test_dkdv_autotune_drops_tiles_whose_dk_and_dv_accumulators_exceed_64_registers_a_thread():
    # (32, 64) on 4 warps at D = 128 holds 2 x 64 x 128 fp32 over 128 threads: on an H100 its dk came out wrong,
    # differently each run, where every other config was right (bench/README.md, 2026-11-27)
    import triton
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
               for m, n, w, s in dict.fromkeys(kernels.BWD_TUNE + kernels.BWD_TUNE_FP32)]  # as kernels._configs
    kept = lambda kernel, dtype, D: [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)  # noqa
                                     for c in kernels._pick(kernels.BWD_TUNE, kernels.BWD_TUNE_FP32, kernel)(
                                         configs, {"Q": torch.empty(0, dtype=dtype)}, HEAD_DIM=D)]
    assert kept("dkdv", torch.bfloat16, 128) == [t for t in kernels.BWD_TUNE if t != (32, 64, 4, 2)]
    assert (32, 64, 4, 2) in kept("dq", torch.bfloat16, 128)  # dq accumulates BLOCK_M x D only
    assert kept("dkdv", torch.bfloat16, 64) == kept("dq", torch.bfloat16, 64) == kernels.BWD_TUNE
    assert kept("dkdv", torch.float32, 128) == [(64, 32, 8, 2), (32, 32, 4, 2)]


GPU_SHAPES = list(zip(kernels.FWD_TUNE + kernels.FWD_TUNE_FP32, kernels.BWD_TUNE + kernels.BWD_TUNE_FP32))


@pytest.mark.parametrize("i", range(len(GPU_SHAPES)),
                         ids=[f"fwd{f[0]}x{f[1]}-bwd{b[0]}x{b[1]}" for f, b in GPU_SHAPES])
def test_every_gpu_block_shape_matches_reference(monkeypatch, i):
    # the GPU autotunes over these shapes; T = 257 leaves a ragged last block for every one of them. The tiling is
    # the same code for every scorer (each runs every path at the default shape above): a shape runs three cases in
    # turn, so every case runs at two shapes or more
    fwd, bwd = GPU_SHAPES[i]
    monkeypatch.setattr(kernels, "_attn_fwd_tuned", _Pinned(kernels._attn_fwd, *fwd[:2]))
    monkeypatch.setattr(kernels, "_attn_bwd_dq_tuned", _Pinned(kernels._attn_bwd_dq, *bwd[:2]))
    monkeypatch.setattr(kernels, "_attn_bwd_dkdv_tuned", _Pinned(kernels._attn_bwd_dkdv, *bwd[:2]))
    for scorer, kw in {j % len(CASES): CASES[j % len(CASES)] for j in range(3 * i, 3 * i + 3)}.values():
        _check(scorer, kw, 257, 0, 32, B=1)
