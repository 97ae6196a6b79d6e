"""Decode backward on a GPU, one dk/dv tile config at a time: is dk's error (1 query after 8,191 cached keys, bf16,
D = 128; bench/README.md) tied to a config, or does it change from run to run under one config?

    python bench/decode_bwd.py --scorers softmax lssa --repeats 3
"""
import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "bench"), os.path.join(ROOT, "tests")]
import kernels  # noqa: E402
import model  # noqa: E402
from tiles import NEW, _Forced, _cfg, _err  # noqa: E402


def run(scorer, q, k, v, do, offset, dtype, backend="triton"):
    xs = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    out = model.attention(*xs, scorer, offset=offset, backend=backend)
    return [out.detach(), *torch.autograd.grad(out, xs, do.to(dtype))]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--scorers", nargs="+", default=["softmax", "lssa"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--offset", type=int, default=8191)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--H", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)
    if not (a.device == "cuda" and torch.cuda.is_available() or a.device == "cpu" and kernels.INTERPRET):
        raise SystemExit(f"error: --device {a.device}: bench/decode_bwd.py runs the Triton kernels on a CUDA GPU, or "
                         f"on the cpu under TRITON_INTERPRET=1 (tiny shapes); this machine has "
                         f"{'a' if torch.cuda.is_available() else 'no'} CUDA GPU")
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, a.H, t, a.D, generator=g) for t in (1, a.offset + 1, a.offset + 1, 1))
    q, k, v, do = (x.to(a.device, torch.bfloat16) for x in (q, k, v, do))
    tuned = kernels._attn_bwd_dkdv_tuned
    print("| scorer | dk/dv config | run | out | dq | dk | dv | bf16 torch dk |")
    print("|---|---|---|---|---|---|---|---|")
    try:
        table(a, q, k, v, do)
    finally:
        kernels._attn_bwd_dkdv_tuned = tuned


def table(a, q, k, v, do):
    """The autotuner's pick, then every shape of BWD_TUNE and the tile sweep's, those the autotuner prunes too."""
    tuned = kernels._attn_bwd_dkdv_tuned
    shapes = dict.fromkeys(kernels.BWD_TUNE + NEW.get(a.D, {}).get("bwd", []))
    shapes = shapes if a.device == "cuda" else [(32, 32, 4, 1)]  # the interpreter's one config
    for scorer in a.scorers:
        ref = run(scorer, q, k, v, do, a.offset, torch.float64, "torch")
        own = _err([run(scorer, q, k, v, do, a.offset, torch.bfloat16, "torch")[2]], [ref[2]])  # rounding's own
        for cfg in [None, *shapes]:  # dq at its autotuned pick throughout
            kernels._attn_bwd_dkdv_tuned = tuned if cfg is None else _Forced(tuned, cfg)
            for r in range(a.repeats):  # the autotuned row 0 includes the autotuning
                try:
                    got = run(scorer, q, k, v, do, a.offset, torch.bfloat16)
                    errs = " | ".join(f"{_err([x], [y]):.2e}" for x, y in zip(got, ref))
                except Exception as e:  # noqa: BLE001 (a config that does not compile: shown, the rest go on)
                    errs = f"error: {str(e).splitlines()[0][:80]} | | |"
                name = (f"autotuned {_cfg(getattr(tuned, 'best_config', None))}" if cfg is None else
                        str(cfg) + ("" if kernels.fits("dkdv", cfg, a.D) else " (pruned)"))
                print(f"| {scorer} | {name} | {r} | {errs} | {own:.2e} |", flush=True)


if __name__ == "__main__":
    main()
