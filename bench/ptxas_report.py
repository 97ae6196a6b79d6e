"""Registers, spills, shared memory and static PTX counts of f32 arithmetic and special-function instructions of
every fused kernel and autotune shape, compiled for sm_90 (H100/H200) on a machine without a GPU:

    python bench/ptxas_report.py                       # prints the table, writes bench/ptxas_sm90.csv
    python bench/ptxas_report.py --extra 64,128,8,2    # also these (BLOCK_M, BLOCK_N, warps, stages) shapes
    python bench/ptxas_report.py --scorers softmax --kernels fwd --out /tmp/p.csv   # a part of it: its own --out

Triton compiles for any target ahead of time, and its wheel ships NVIDIA's ptxas, whose -v output gives registers
and spill bytes per thread. A tile shape that spills is slow on any GPU; which of the rest is fastest is still for
the autotuner to time there.
"""
import argparse
import csv
import itertools
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor

if __name__ == "__main__":  # interpreted kernels can't compile; importers keep theirs
    os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import torch  # noqa: E402

import kernels  # noqa: E402
import kernels_stick  # noqa: E402
from scorers import SCORERS  # noqa: E402

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
# (kernel, name, constexprs) of each scorer as the model calls it:
# learned parameters need exact sigma; re-weighting runs two passes
VARIANTS = []
for name, entry in ((n, e) for n, e in SCORERS.items() if "triton" in e.backends):
    if entry.logit is None:  # no row template (stickbreaking): a kernel file of its own, no flags
        VARIANTS += [("stick_fwd", name, {}), ("stick_bwd", name, {})]
        continue
    flags, rw = entry.kernel_flags(), entry.p is not None
    VARIANTS += [("fwd", f"{name}_pass1", dict(**flags, STAGE=0)),
                 ("fwd", f"{name}_pass2", dict(**flags, STAGE=2, P_INT=int(entry.p)))] if rw else \
        [("fwd", name, dict(**flags, STAGE=1))]
    VARIANTS += [("dq", name, dict(**flags, REWEIGHT=rw, EXACT_SIGMA=(rw or bool(entry.params)) and entry.row_sum)),
                 ("dkdv", name, dict(**flags, REWEIGHT=rw))]
KERNELS = {"fwd": kernels._attn_fwd, "dq": kernels._attn_bwd_dq, "dkdv": kernels._attn_bwd_dkdv,
           "stick_fwd": kernels_stick._stick_fwd, "stick_bwd": kernels_stick._stick_bwd}
INTS = {"H", "Tq", "Tk", "offset", "split_size", "T_BUCKET"}  # all but offset divisible by 16, as the JIT would see
# static PTX instruction counts: f32 arithmetic (the FMA pipe) and the special-function unit's ops
OPS = {"f32_arith": r"(?:add|sub|mul|fma)(?:\.\w+)*\.f32", "ex2": r"ex2\.\S+", "lg2": r"lg2\.\S+",
       "tanh": r"tanh\.\S+", "div": r"div(?:\.\w+)*\.f32", "rcp": r"rcp\.\S+"}


def compile_one(kernel, scorer, consts, D, cfg, dtype="bf16", prec=None):
    """One kernel as kernels.py launches it for `dtype` inputs (prec: another dot precision for fp32)."""
    fn = KERNELS[kernel]
    BLOCK_M, BLOCK_N, warps, stages = cfg
    DT, PREC = kernels._dot_types(torch.float32 if dtype == "fp32" else torch.bfloat16)
    consts = {**(dict(P_INT=0) if kernel == "fwd" else {}), **consts}
    consts.update(HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, DT=DT, PREC=prec or PREC)
    sig, attrs = {}, {}
    for i, a in enumerate(fn.arg_names):
        if a in consts:
            sig[a] = "constexpr"
        elif a in INTS:
            sig[a] = "i32"
            if a != "offset":
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif a in ("sm_scale", "p", "eps"):
            sig[a] = "fp32"
        else:  # pointers: I/O in dtype, fallback rows int8, stats fp32
            io = a in ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV")
            sig[a] = f"*{dtype}" if io else "*i8" if a == "FB" else "*fp32"
            attrs[(i,)] = [["tt.divisibility", 16]]
    compiled = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=warps, num_stages=stages))
    ptx = compiled.asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        info = subprocess.run([PTXAS, "-v", "--gpu-name=sm_90a", f.name, "-o", os.devnull], capture_output=True,
                              text=True, check=True).stderr
    stores, loads = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info).groups()
    return dict(kernel=kernel, scorer=scorer, dtype=dtype, prec=prec or PREC, D=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                warps=warps, stages=stages, registers=int(re.search(r"Used (\d+) registers", info).group(1)),
                spill_stores=int(stores), spill_loads=int(loads), shared_bytes=compiled.metadata.shared,
                wgmma=ptx.count("wgmma.mma_async"), mma_sync=ptx.count("mma.sync"),
                **{k: len(re.findall(rf"^\s*(?:@!?%p\d+\s+)?{op}\s", ptx, re.M)) for k, op in OPS.items()})


def _job(args):
    return compile_one(*args)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--D", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--extra", nargs="*", default=[], help="more shapes: BLOCK_M,BLOCK_N,warps,stages")
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    ap.add_argument("--scorers", nargs="+", help="only these variants (e.g. softmax lssar_pass2)")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"), help="of q, k, v (fp32: tf32x3 dots)")
    ap.add_argument("--prec", choices=("tf32x3", "ieee"), help="fp32 only: another dot precision, to compare")
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--out", help="the CSV (default: bench/ptxas_sm90.csv for the whole bf16 table, else needed)")
    a = ap.parse_args(argv)
    part = [f"--{k}" for k, v in (("scorers", a.scorers), ("kernels", set(a.kernels) != set(KERNELS)),
                                  ("D", set(a.D) != {64, 128}), ("dtype fp32", a.dtype == "fp32"),
                                  ("prec", a.prec)) if v]
    if part and not a.out:  # it once replaced the committed table of every kernel with these few rows
        ap.error(f"{', '.join(part)}: a part of the table; name its CSV with --out (bench/ptxas_sm90.csv, the default, "
                 f"holds the whole bf16 table)")
    a.out = a.out or "bench/ptxas_sm90.csv"
    extra = [tuple(int(x) for x in e.split(",")) for e in a.extra]
    fp32 = a.dtype == "fp32"  # each dtype has its own autotune lists
    fwd, bwd = (kernels.FWD_TUNE_FP32, kernels.BWD_TUNE_FP32) if fp32 else (kernels.FWD_TUNE, kernels.BWD_TUNE)
    shapes = {k: list(dict.fromkeys(tune + extra)) for k, tune in (("fwd", fwd), ("dq", bwd), ("dkdv", bwd))}
    stick = kernels_stick.blocks(torch.float32 if fp32 else torch.bfloat16)  # fixed, as kernels_stick launches
    shapes["stick_fwd"] = shapes["stick_bwd"] = list(dict.fromkeys([stick] + extra))
    assert a.prec is None or a.dtype == "fp32", "--prec applies to fp32 inputs only"
    jobs = [(k, name, consts, D, cfg, a.dtype, a.prec) for (k, name, consts), D in itertools.product(VARIANTS, a.D)
            if k in a.kernels and (not a.scorers or name in a.scorers) for cfg in shapes[k]]
    assert jobs, "nothing to compile: check --kernels and --scorers"
    print(f"compiling {len(jobs)} kernels for sm_90 (triton {triton.__version__}) ...", flush=True)
    with ProcessPoolExecutor(a.jobs) as pool:
        rows = list(pool.map(_job, jobs))
    cols = list(rows[0])
    print("".join(f"{c[:12]:>13}" for c in cols))
    for r in rows:
        print("".join(f"{r[c]:>13}" for c in cols))
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, cols)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {a.out}")
    return rows


if __name__ == "__main__":
    main()
