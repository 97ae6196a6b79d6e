"""
Stick-breaking's Triton tiles (kernels_stick.blocks), swept on a CUDA GPU: each candidate (BLOCK_M, BLOCK_N, warps,
stages) times the forward and forward+backward at the given shapes and checks its out, dq, dk, dv against the
current tiles' (a tile that computes something else is reported, not ranked). Prints a table, the fastest candidate
per shape and mode, and, with --out, writes <out>.csv (rewritten per row: a run cut short keeps its rows).

    python bench/stick_blocks.py --out out-bench/stick_blocks                   # the 162M model's shape: D 64, T 1,024
    python bench/stick_blocks.py --D 128 --T 4096 --B 4 --H 16 --out out-bench/stick_blocks_d128

kernels_stick.blocks returns one tile for both kernels; the forward's and the backward's bests are printed apart,
since the backward (two walks, atomic adds) need not share the forward's.
"""
import argparse
import csv
import itertools
import os
import sys
from unittest import mock

import torch

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(BENCH), BENCH]
import kernels_stick  # noqa: E402
from attention import _measure  # noqa: E402  (bench/attention.py's timing: warm-up outside, do_bench median, MiB)

MS, NS, WARPS, STAGES = (16, 32, 64, 128), (16, 32, 64), (4, 8), (1, 2)  # 48: ~5 s each on an H100 (compiles)


def _run(q, k, v, do):
    """out, dq, dk, dv of one stick-breaking call with the tiles in force."""
    x = [t.detach().requires_grad_() for t in (q, k, v)]
    out = kernels_stick.attention(*x)
    out.backward(do)
    return [out.detach(), *(t.grad for t in x)]


def sweep(shapes, candidates, dtype=torch.bfloat16, device="cuda", out=None):
    """Rows (B, H, T, D, candidate, fwd_ms, fwdbwd_ms, bwd_ms, max_err, peak_mib, status), every shape x candidate."""
    cuda, rows = device != "cpu", []
    print(f"{'B':>3}{'H':>4}{'T':>7}{'D':>5} {'M':>4}{'N':>4}{'w':>3}{'s':>3}",
          *(f"{c:>10}" for c in ("fwd ms", "f+b ms", "bwd ms", "max err")))
    for B, H, T, D in shapes:
        g = torch.Generator(device).manual_seed(0)
        q, k, v, do = (torch.randn(B, H, T, D, generator=g, device=device, dtype=dtype) for _ in range(4))
        base = _run(q, k, v, do)  # the current tiles: what every candidate must reproduce
        scale = max(t.float().abs().max().item() for t in base)
        for M, N, w, s in candidates:
            row = dict(B=B, H=H, T=T, D=D, BLOCK_M=M, BLOCK_N=N, warps=w, stages=s, fwd_ms=None, fwdbwd_ms=None,
                       bwd_ms=None, max_err=None, peak_mib=None, status="ok",
                       device=torch.cuda.get_device_name() if cuda else "cpu", dtype=str(dtype)[6:])
            tiles = lambda dtype, Tq=None: (M, N, w, s)  # noqa: E731 (every candidate's M >= 16: decoding fits)
            try:
                with mock.patch.object(kernels_stick, "blocks", tiles):
                    got = _run(q, k, v, do)
                    row["max_err"] = max((a.float() - b.float()).abs().max().item() for a, b in zip(got, base)) / scale
                    with torch.no_grad():
                        row["fwd_ms"], _ = _measure(lambda: kernels_stick.attention(q, k, v), [], cuda)
                    row["fwdbwd_ms"], row["peak_mib"] = _measure(lambda: _run(q, k, v, do), [], cuda)
                    row["bwd_ms"] = row["fwdbwd_ms"] - row["fwd_ms"]
                if row["max_err"] > 2e-2:  # bf16 sums in another order differ by ~1e-3 of the largest value
                    row["status"] = "wrong"
            except Exception as e:  # out of shared memory or registers: one candidate, not the sweep
                row["status"] = f"error: {type(e).__name__}: {str(e)[:160]}"
            if cuda:
                torch.cuda.empty_cache()
            rows.append(row)
            if out:
                os.makedirs(os.path.dirname(str(out)) or ".", exist_ok=True)
                with open(f"{out}.csv", "w", newline="") as fh:
                    csv.writer(fh).writerows([list(rows[0]), *(r.values() for r in rows)])
            print(f"{B:>3}{H:>4}{T:>7}{D:>5} {M:>4}{N:>4}{w:>3}{s:>3}",
                  *(f"{row[c]:10.4g}" if row[c] is not None else f"{'-':>10}" for c in
                    ("fwd_ms", "fwdbwd_ms", "bwd_ms", "max_err")), "" if row["status"] == "ok" else row["status"],
                  flush=True)
    return rows


def best(rows):
    """{(B, H, T, D, mode): the row with the least ms among the correct ones}, mode fwd_ms or bwd_ms."""
    picks = {}
    for r in rows:
        for mode in ("fwd_ms", "bwd_ms"):
            key = (r["B"], r["H"], r["T"], r["D"], mode)
            if r["status"] == "ok" and (key not in picks or r[mode] < picks[key][mode]):
                picks[key] = r
    return picks


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Sweep stick-breaking's Triton tiles on a CUDA GPU")
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--H", type=int, default=12)
    ap.add_argument("--T", type=int, nargs="+", default=[1024])
    ap.add_argument("--D", type=int, nargs="+", default=[64], choices=(16, 32, 64, 128))
    ap.add_argument("--M", type=int, nargs="+", default=list(MS), help="BLOCK_M candidates")
    ap.add_argument("--N", type=int, nargs="+", default=list(NS), help="BLOCK_N candidates")
    ap.add_argument("--warps", type=int, nargs="+", default=list(WARPS))
    ap.add_argument("--stages", type=int, nargs="+", default=list(STAGES))
    ap.add_argument("--out", help="writes <out>.csv; default: print only")
    a = ap.parse_args()
    if not (torch.cuda.is_available() or kernels_stick.INTERPRET):
        raise SystemExit("error: bench/stick_blocks.py times Triton kernels on a CUDA GPU and found none "
                         "(or TRITON_INTERPRET=1)")
    rows = sweep([(a.B, a.H, T, D) for T, D in itertools.product(a.T, a.D)],
                 list(itertools.product(a.M, a.N, a.warps, a.stages)),
                 device="cuda" if torch.cuda.is_available() else "cpu", out=a.out)
    print(f"current tiles (bf16): {kernels_stick.blocks(torch.bfloat16)}")
    for (B, H, T, D, mode), r in best(rows).items():
        print(f"fastest {mode[:3]} at B={B} H={H} T={T} D={D}: BLOCK_M={r['BLOCK_M']} BLOCK_N={r['BLOCK_N']} "
              f"warps={r['warps']} stages={r['stages']}: {r[mode]:.4g} ms")
