"""
kernels.py's tiles swept on a CUDA GPU (issue #45, item 4): each of the three autotuned kernels (forward, dq, dk/dv)
of each scorer that kernels.py runs is forced to one candidate (BLOCK_M, BLOCK_N, warps, stages) at a time, the other
two keeping the autotuner's pick (the default). A candidate's out and gradients are checked against the default's and
the float64 reference's (first batch element; skipped at large T) before it is timed: the forward without grad, the
backward alone. One that differs, fails to compile, spills or runs out of memory keeps that status, never ranked.
Prints a table and the fastest correct candidate per scorer, D and kernel; --out writes <out>.csv (rewritten per row:
a run cut short keeps its rows) and <out>.md (the winners against the default, and the lists to paste).

    python bench/tiles.py --out out-bench/tiles_d64                  # D 64: the 162M model's B 16, H 12, T 1,024
    python bench/tiles.py --D 128 --T 4096 --B 4 --H 16 --out out-bench/tiles_d128
    python bench/tiles.py --scorers softmax ssa --kernels fwd --fwd 128,64,4,3 128,128,8,2    # a part, own shapes
    python bench/tiles.py --apply out-bench/tiles_d64.csv out-bench/tiles_d128.csv   # FWD_TUNE / BWD_TUNE to paste

stickbreaking runs a kernel file of its own with fixed tiles: bench/stick_blocks.py sweeps those.
"""
import argparse
import csv
import math
import os
import sys
import time
from unittest import mock

import torch
import torch.nn.functional as F
import triton

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(BENCH), BENCH]
import kernels  # noqa: E402
import kernels_math  # noqa: E402
import model  # noqa: E402
from attention import _measure, fwd_bwd_ms  # noqa: E402  (bench/attention.py's timing: warm-up outside, median)
from scorers import SCORERS  # noqa: E402

# ----------------------------------------------------------------------------------------------------------------
# What this script reads of kernels.py, in one place (it is being reorganised: issue #48)
TUNED = {"fwd": "_attn_fwd_tuned", "dq": "_attn_bwd_dq_tuned", "dkdv": "_attn_bwd_dkdv_tuned"}  # the autotuners
LISTS = {"fwd": "FWD_TUNE", "dq": "BWD_TUNE", "dkdv": "BWD_TUNE"}  # their 16-bit shape lists


def runs_on_kernels_py(name):  # the row template's flags (kernels._prepare's test); stickbreaking has its own file
    e = SCORERS[name]
    return "triton" in e.backends and tuple(e.kernel_flags().values())[:4] in kernels_math.KERNELS


def pruned(cfg, D, kernel):  # kernels._pick drops a shape whose fp32 accumulators take > 64 registers a thread
    return not kernels.fits(kernel, cfg, D)


# Tried beside the current lists (bf16): spill-free for every scorer by ptxas for sm_90 where the grid had such shapes
# (bench/ptxas_sm90_tiles.csv; bench/README.md, "Tile sweep"). Each costs ~0.3-2 s of compiling a scorer and kernel.
NEW = {64: dict(fwd=[(128, 128, 8, 2), (64, 128, 8, 3), (128, 32, 4, 3)],
                bwd=[(32, 128, 8, 3), (64, 32, 8, 2), (128, 32, 8, 3)]),
       128: dict(fwd=[(128, 64, 8, 2), (128, 32, 8, 3), (64, 32, 4, 3)],
                 bwd=[(32, 64, 8, 2), (32, 64, 8, 3), (64, 32, 8, 3)])}
MS = {"fwd": "fwd_ms", "dq": "bwd_ms", "dkdv": "bwd_ms"}  # what ranks a kernel's candidates
TOL = 2e-2  # bf16 sums in another order differ by ~1e-3 of the largest entry
REF_FACTOR = 2.0  # a candidate's float64 error may be this many times the default's (plus TOL)
DEFAULT_S = 70  # a scorer's default row autotunes three kernels: 38-63 s on a GPU (lssar the longest)
REF_SCORES = 2**25  # H T^2 of the float64 reference (one batch element): 268 MB a temporary, else skipped
COLS = ("scorer", "D", "T", "B", "H", "kernel", "BLOCK_M", "BLOCK_N", "warps", "stages", "default", "fwd_ms",
        "bwd_ms", "fwdbwd_ms", "peak_mib", "err_default", "err_ref", "spill_bytes", "regs", "status")
MEAS = COLS[11:18]  # the measured columns (printed)


def candidates(kernel, D):
    """The current list first (the default's autotuning compiles it anyway), then NEW's; less what _pick drops."""
    new = NEW.get(D, {}).get("fwd" if kernel == "fwd" else "bwd", [])
    return [c for c in dict.fromkeys(getattr(kernels, LISTS[kernel]) + new) if not pruned(c, D, kernel)]


class _Forced:
    """An autotuner's stand-in: one config, and the compiled kernels kept (their registers, spills; GPU only)."""
    def __init__(self, tuned, cfg):
        self.fn, self.cfg, self.compiled = tuned.fn, cfg, []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            M, N, w, s = self.cfg
            self.compiled.append(self.fn[grid](*args, **kw, BLOCK_M=M, BLOCK_N=N, num_warps=w, num_stages=s))
        return launch


def _cfg(c):  # a triton.Config as (BLOCK_M, BLOCK_N, warps, stages)
    return c and (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)


def _run(fn, name, q, k, v, do, params):
    """[out, dq, dk, dv, the parameters' gradients]: parameters learn, as in a model (the exact-sigma kernels)."""
    xs = [t.detach().requires_grad_() for t in (q, k, v)]
    ps = [t.detach().requires_grad_() for t in params.values()]
    out = fn(*xs, name, **dict(zip(params, ps)))
    return [out.detach(), *torch.autograd.grad(out, xs + ps, do)]


def _err(got, want):
    """The largest max|got - want| / max|want| over the tensors; inf for NaN or Inf."""
    errs = [(a.double() - b.double()).abs().max().item() / (b.double().abs().max().item() or 1.0)
            for a, b in zip(got, want)]
    return max((e if math.isfinite(e) else math.inf for e in errs), default=0.0)


def _show(cfg):
    return ",".join(map(str, cfg)) if cfg else "?"


def _shape(row):
    return tuple(row[c] for c in COLS[6:10])


def _failed(e):
    return "oom" if isinstance(e, torch.OutOfMemoryError) else f"error: {type(e).__name__}: {str(e)[:160]}"


def sweep(names, kernel_cands, B, H, T, D, dtype=torch.bfloat16, device="cuda", out=None, ref=True,
          measure=_measure, budget=None, max_spill=0):
    """Rows of COLS (and provenance): per scorer a "default" row (the autotuner's picks), then one per kernel and
    candidate of kernel_cands {"fwd" | "dq" | "dkdv": [(BLOCK_M, BLOCK_N, warps, stages)]}. budget: seconds after
    which no candidate starts, and no scorer's default within DEFAULT_S of it (a cut run still prints its summary)."""
    cuda, rows, start = device != "cpu", [], time.time()
    info = dict(dtype=str(dtype)[6:], device=torch.cuda.get_device_name() if cuda else "cpu",
                triton=triton.__version__, torch=torch.__version__)

    def emit(row):
        rows.append(row)
        if out:
            os.makedirs(os.path.dirname(str(out)) or ".", exist_ok=True)
            with open(f"{out}.csv", "w", newline="") as fh:
                csv.writer(fh).writerows([list(rows[0]), *(r.values() for r in rows)])
        cfg = row["default"] if row["BLOCK_M"] is None else _show(_shape(row))
        print(f"{row['scorer']:<9}{row['kernel']:<8}{cfg:<16}", *(f"{row[c]:9.4g}" if row[c] is not None else
              f"{'-':>9}" for c in MEAS), "" if row["status"] == "ok" else row["status"], flush=True)

    print(f"{'scorer':<9}{'kernel':<8}{'M,N,warps,st':<16}", *(f"{c[:9]:>9}" for c in MEAS), "status")
    for name in names:
        if budget is not None and time.time() - start > budget - DEFAULT_S:  # its autotune would end past the budget
            print(f"budget of {budget:.0f} s: under {DEFAULT_S} s left for {name}'s default (its autotune): stopping")
            return rows
        t0, g = time.time(), torch.Generator(device).manual_seed(0)
        q, k, v, do = (torch.randn(B, H, T, D, generator=g, device=device, dtype=dtype) for _ in range(4))
        params = {prm.name: torch.full((H,), prm.default, device=device) for prm in SCORERS[name].params}
        if SCORERS[name].forget:  # FoX's c: forget gates near 1, as bench/attention.py
            params["c"] = F.logsigmoid(torch.randn(B, H, T, generator=g, device=device) + 3).cumsum(-1)
        run = lambda: _run(kernels.attention, name, q, k, v, do, params)  # noqa: E731
        for attr in TUNED.values():  # this scorer's own autotuning, as in a run that trains it
            getattr(getattr(kernels, attr), "cache", {}).clear()
        head = {**dict.fromkeys(COLS), **dict(scorer=name, D=D, T=T, B=B, H=H, status="ok")}
        row = {**head, "kernel": "default", "err_default": 0.0, **info}
        try:
            base = run()
            picks = {kn: _cfg(getattr(getattr(kernels, attr), "best_config", None)) for kn, attr in TUNED.items()}
            want = None  # float64, first batch element (c is per key: (B, H, T)): out, dq, dk, dv
            if ref and H * T * T <= REF_SCORES:
                want = _run(lambda *x, **kw: model.attention(*x, backend="torch", **kw), name, *(t[:1].double() for t
                            in (q, k, v, do)), {n: (t[:1] if n == "c" else t).double() for n, t in params.items()})[:4]
            row["err_ref"] = base_ref = _err([t[:1] for t in base[:4]], want) if want else None
            row["status"] = "off the float64 reference" if want and base_ref > TOL else "ok"
            row["default"] = " ".join(f"{kn}={_show(c)}" for kn, c in picks.items())
            row.update(fwd_bwd_ms(name, q, k, v, do, params, measure, cuda))
        except Exception as e:  # this scorer's default does not run: the next scorer
            emit({**row, "status": _failed(e)})
            continue
        emit(row)
        for kern, cfg in ((kern, cfg) for kern, cands in kernel_cands.items() for cfg in cands):
            if budget is not None and time.time() - start > budget:
                print(f"budget of {budget:.0f} s spent: stopping before {name} {kern} {_show(cfg)}")
                return rows
            row = {**head, "kernel": kern, "default": _show(picks[kern]), **dict(zip(COLS[6:10], cfg)), **info}
            forced = _Forced(getattr(kernels, TUNED[kern]), cfg)
            try:
                with mock.patch.object(kernels, TUNED[kern], forced):
                    got = run()
                    if not forced.compiled:  # the launch went elsewhere: nothing was forced
                        raise RuntimeError(f"kernels.{TUNED[kern]} was not called: update tiles.TUNED")
                    loaded = [c for c in forced.compiled if hasattr(c, "n_spills")]  # n_spills: 4-byte words
                    if loaded:
                        row.update(spill_bytes=4 * max(c.n_spills for c in loaded), regs=max(c.n_regs for c in loaded))
                    row["err_default"] = _err(got, base)
                    row["err_ref"] = _err([t[:1] for t in got[:4]], want) if want else None
                    off = want and base_ref > TOL  # a wrong default (dk/dv's, 2026-11-27) judges none: float64 does
                    limit = TOL + (0.0 if off else REF_FACTOR * base_ref) if want else None
                    if (row["err_default"] > TOL and not off) or (want and row["err_ref"] > limit):
                        row["status"] = "wrong"
                    else:  # a spilling candidate is timed (does the spill cost?), never ranked
                        if (row["spill_bytes"] or 0) > max_spill:
                            row["status"] = f"spills {row['spill_bytes']} B"
                        row.update(fwd_bwd_ms(name, q, k, v, do, params, measure, cuda))
            except Exception as e:  # out of memory, of shared memory, a compile error: one candidate
                row["status"] = _failed(e)
            torch.cuda.empty_cache()  # a no-op without CUDA
            emit(row)
        print(f"{name}: {time.time() - t0:.0f} s", flush=True)
    return rows


def best(rows):
    """{(scorer, D, T, kernel): the fastest correct row}: the forward by fwd ms, dq and dk/dv by bwd ms (two sweeps
    at one D and other T are ranked apart: their times are not comparable)."""
    won = {}
    for r in rows:
        key, ms = (r["scorer"], r["D"], r["T"], r["kernel"]), MS.get(r["kernel"])
        if ms and r["status"] == "ok" and (key not in won or r[ms] < won[key][ms]):
            won[key] = r
    return won


def summary(rows):
    """Markdown lines: per scorer, D and kernel, the fastest correct candidate against the autotuner's pick."""
    lines = ["| scorer | D | T | kernel | default | ms | fastest correct | ms | default / fastest |", "|" + "---|" * 9]
    defaults = {(r["scorer"], r["D"], r["T"]): r for r in rows if r["kernel"] == "default"}
    won = best(rows)
    keys = {(r["scorer"], r["D"], r["T"], r["kernel"]): r["default"] for r in rows if r["kernel"] in MS}
    for key, pick in keys.items():
        ms, d, r = MS[key[3]], defaults[key[:3]], won.get(key)
        cells = [*map(str, key), pick, f"{d[ms]:.4g}", *((_show(_shape(r)), f"{r[ms]:.4g}",
                 f"{d[ms] / r[ms]:.2f}x") if r else ("none correct", "-", "-"))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _read(path):  # sweep's CSV rows, numbers as numbers ("": None)
    rows = list(csv.DictReader(open(path)))
    for r in rows:
        r.update({c: (int if c in COLS[:10] else float)(r[c]) if r[c] else None for c in ("D", *COLS[6:10], *MEAS)})
    return rows


def apply(rows, within=0.03):
    """Paste-ready FWD_TUNE / BWD_TUNE: greedily the fewest shapes that give every (scorer, D, kernel) a time within
    `within` of its fastest correct one (each shape in the lists is compiled and timed per T bucket, D and scorer)."""
    lines, won = [], best(rows)
    for lst, kerns in (("FWD_TUNE", ("fwd",)), ("BWD_TUNE", ("dq", "dkdv"))):
        near = {key: {_shape(r) for r in rows if (r["scorer"], r["D"], r["T"], r["kernel"]) == key
                      and r["status"] == "ok" and r[MS[key[3]]] <= (1 + within) * b[MS[key[3]]]}
                for key, b in won.items() if key[3] in kerns}
        chosen, left = [], set(near)
        while left:
            shape = max(sorted({s for k in left for s in near[k]}), key=lambda s: sum(s in near[k] for k in left))
            chosen.append(shape)
            left = {k for k in left if shape not in near[k]}
        lines.append(f"{lst} = {chosen}")
        for s in chosen:
            covers = sorted(f"{k[0]} D{k[1]} T{k[2]} {k[3]}" for k in near if s in near[k])
            Ds = sorted({k[1] for k in near if s in near[k] and pruned(s, k[1], k[3])})
            lines.append(f"#   {s}: {', '.join(covers)}" + (f"  (kernels._pick prunes it at D = {Ds})" if Ds else ""))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description="Sweep kernels.py's Triton tiles on a CUDA GPU (see the docstring)")
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--H", type=int, default=12)
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--D", type=int, default=64, choices=(16, 32, 64, 128))
    ap.add_argument("--scorers", nargs="+", help="default: every scorer kernels.py runs")
    ap.add_argument("--kernels", nargs="+", default=list(TUNED), choices=list(TUNED))
    ap.add_argument("--fwd", nargs="+", help="forward candidates M,N,warps,stages (default: the list for D)")
    ap.add_argument("--bwd", nargs="+", help="dq and dk/dv candidates M,N,warps,stages (default: the list for D)")
    ap.add_argument("--max-spill", type=int, default=0, help="spill bytes a thread still ranked (default 0)")
    ap.add_argument("--budget", type=float, help="seconds after which no candidate starts")
    ap.add_argument("--out", help="writes <out>.csv and <out>.md; default: print only")
    ap.add_argument("--apply", nargs="+", metavar="CSV", help="print FWD_TUNE / BWD_TUNE from these sweeps' rows")
    a = ap.parse_args(argv)
    if a.apply:
        if not all(os.path.isfile(p) for p in a.apply):
            raise SystemExit(f"error: no such CSV: {', '.join(p for p in a.apply if not os.path.isfile(p))}")
        print("\n".join(apply([r for p in a.apply for r in _read(p)])))
        return
    names = a.scorers or [n for n in SCORERS if runs_on_kernels_py(n)]
    bad = [n for n in names if n not in SCORERS or not runs_on_kernels_py(n)]
    if bad:
        raise SystemExit(f"error: kernels.py runs no scorer {', '.join(bad)} (stickbreaking: bench/stick_blocks.py); "
                         f"it runs {', '.join(n for n in SCORERS if runs_on_kernels_py(n))}")
    cands = {}
    for kern in a.kernels:
        given = a.fwd if kern == "fwd" else a.bwd
        cands[kern] = [tuple(int(x) for x in c.split(",") if x.isdigit()) for c in given or []] or candidates(kern, a.D)
        if not cands[kern] or any(len(c) != 4 or 0 in c for c in cands[kern]):
            raise SystemExit(f"error: candidates are BLOCK_M,BLOCK_N,warps,stages, got {' '.join(given or [])}")
    if not (torch.cuda.is_available() or kernels_math.INTERPRET):
        raise SystemExit("error: bench/tiles.py times Triton kernels on a CUDA GPU and found none "
                         "(or TRITON_INTERPRET=1)")
    rows = sweep(names, cands, a.B, a.H, a.T, a.D, device="cuda" if torch.cuda.is_available() else "cpu",
                 out=a.out, budget=a.budget, max_spill=a.max_spill)
    r, lines = rows[0], summary(rows)
    print("\n".join(lines))
    if a.out:
        head = f"Tile sweep: {r['device']}, triton {r['triton']}, torch {r['torch']}, {r['dtype']}, B {a.B}, H {a.H}"
        open(f"{a.out}.md", "w").write("\n".join([f"{head}, T {a.T}, D {a.D} (dq, dk/dv: the backward's ms)", "",
                                                 *lines, "", "To paste (or "
                                                 "`python bench/tiles.py --apply <csv>...`):", "", *apply(rows), ""]))
        print(f"wrote {a.out}.csv, {a.out}.md")


if __name__ == "__main__":
    main()
