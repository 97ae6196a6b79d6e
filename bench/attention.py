"""
The fused kernels (kernels.py) timed against the reference ("eager"), SDPA's flash backend ("sdpa"; fox:
memory-efficient), cuDNN ("cudnn") and compiled FlexAttention ("flex"), forward and forward+backward, on a CUDA GPU:
a printed table and, with --out,
<out>.csv and <out>.png (TFLOP/s against T, a panel per head dim and mode). bench/README.md holds the measured tables.

    python bench/attention.py --D 128 --T 1024 4096 16384 --out out-bench/kernels
"""
import argparse
import csv
import itertools
import os
import sys
import timeit
from unittest import mock

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import kernels  # noqa: E402
import kernels_flex  # noqa: E402
from kernels_sdpa import sdpa_attention  # noqa: E402
from model import attention as reference  # noqa: E402
from scorers import SCORERS  # noqa: E402
from lib.checkpoint import run_info  # noqa: E402

# Causal FLOPs as FlashAttention counts them: fwd 4 B H T^2 D / 2
# fwd+bwd 3.5x: backward is five matmuls, one a recompute
# one count for every scorer: TFLOP/s compares times only

PROVIDERS = ("triton", "flex", "eager", "sdpa", "cudnn")


def _sdpa(q, k, v, scorer, *, p=None, backend=SDPBackend.FLASH_ATTENTION, **params):
    """kernels_sdpa.sdpa_attention (softmax; ssmax on q times s log n_i + b; fox's bias as a mask) on one named
    backend: unpinned, recent torch builds pick cuDNN first on Hopper. Flash takes no mask: fox runs on
    memory-efficient."""
    with sdpa_kernel([backend, SDPBackend.EFFICIENT_ATTENTION] if SCORERS[scorer].forget else backend):
        return sdpa_attention(q, k, v, scorer, p=p, **params)


SLOW_MS = 500.0


def _measure(fn, grads, cuda):
    """ms (median after a warm-up that compiles and autotunes); on CUDA the peak MiB of one call above the inputs."""
    if not cuda:
        fn()
        return 1e3 * sorted(timeit.repeat(fn, number=1, repeat=3))[1], None
    fn()  # compile and autotune outside the timing
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end)  # a call over SLOW_MS is timed once, not ~100 times
    if ms < SLOW_MS:
        ms = triton.testing.do_bench(fn, grad_to_none=grads, return_mode="median")  # flushes L2 between calls
    for t in grads:
        t.grad = None
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    return ms, (torch.cuda.max_memory_allocated() - base) / 2**20


def fwd_bwd_ms(name, q, k, v, do, params, measure=_measure, cuda=True):
    """kernels.py's attention: fwd ms (no grad), bwd ms (the backward alone, on a kept graph), peak MiB of either
    above the inputs (bench/tiles.py's candidates)."""
    with torch.no_grad():
        fwd, mib1 = measure(lambda: kernels.attention(q, k, v, name, **params), [], cuda)
    xs = [t.detach().requires_grad_() for t in (q, k, v)]
    ps = {n: t.detach().requires_grad_() for n, t in params.items()}
    out = kernels.attention(*xs, name, **ps)
    bwd, mib2 = measure(lambda: out.backward(do, retain_graph=True), [*xs, *ps.values()], cuda)
    return dict(fwd_ms=fwd, bwd_ms=bwd, fwdbwd_ms=fwd + bwd, peak_mib=None if mib1 is None else max(mib1, mib2))


def plot(rows, out):
    """<out>.png: TFLOP/s vs T, a panel per (D, mode); colour: scorer, line style: provider. rows: benchmark()'s,
    or a CSV's (csv.DictReader), so a table measured elsewhere can be drawn again."""
    from matplotlib.figure import Figure
    num = lambda x: float(x) if x not in (None, "") else None  # noqa: E731 (tflops None: oom or error, a gap)
    rows = [{**r, "D": int(r["D"]), "T": int(r["T"]), "tflops": num(r["tflops"])} for r in rows]
    key = lambda *cols: list(dict.fromkeys(tuple(r[c] for c in cols) for r in rows))  # noqa: E731
    scorers, panels, r0 = key("scorer"), key("D", "mode"), rows[0]
    fig = Figure(figsize=(5 * len(panels), 4.5), layout="tight")
    for ax, (D, mode) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        for name, provider in key("scorer", "provider"):
            pts = sorted((r["T"], r["tflops"]) for r in rows if (r["scorer"], r["provider"], r["D"], r["mode"]) ==
                         (name, provider, D, mode))
            style = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)))[PROVIDERS.index(provider)]
            if pts:
                ax.plot(*zip(*pts), linestyle=style, marker="o", color=f"C{scorers.index((name,))}",
                        label=f"{name} {provider}")
        ax.set_xscale("log", base=2)
        ax.set(title=f"D={D} {mode} ({r0['dtype']}, B*T={int(r0['B']) * int(r0['T'])}, H={r0['H']})", xlabel="T",
               ylabel="TFLOP/s (causal)")
    fig.axes[0].legend(fontsize=7)  # the forward panel has every (scorer, provider)
    fig.savefig(f"{out}.png", dpi=120)


def benchmark(Ts, Ds, scorers, providers, tokens=16384, heads=16, dtype=torch.bfloat16, device="cuda", out=None):
    """Rows (D, T, scorer, provider, mode) at B = tokens // T, printed and, given out, written to <out>.csv, .png.
    A scorer "<name>_p<p>" (e.g. softmax_p3) adds re-weighting with that p."""
    import torch.nn.attention.flex_attention as fa
    H, modes, rows, inputs, masks, make_mask = heads, ("fwd", "fwd+bwd"), [], {}, {}, fa.create_block_mask
    providers_fn = {"triton": lambda *a, **kw: reference(*a, **kw, backend="triton"),  # stickbreaking: its own file
                    "flex": kernels_flex.flex_attention, "eager": reference,
                    "sdpa": _sdpa,
                    "cudnn": lambda *a, **kw: _sdpa(*a, **kw, backend=SDPBackend.CUDNN_ATTENTION)}
    info = run_info(seed=0)  # provenance columns of every row
    torch._dynamo.config.recompile_limit = 64  # flex compiles per scorer, pass, grad mode and shape

    # a model builds its block mask once per step: cache it
    # (offset is 0, so the lengths fix the mask)
    def cached_mask(mask_mod, *args, device):
        if args not in masks:
            masks[args] = make_mask(mask_mod, *args, device=device)
        return masks[args]

    print(f"{'scorer':<11}{'provider':<9}{'D':>4}{'T':>7}{'B':>5} {'mode':<8}",
          *(f"{c:>9}" for c in ("ms", "TFLOP/s", "MiB")))
    for D, T, name, provider, mode in itertools.product(Ds, Ts, scorers, providers, modes):
        scorer, _, p = name.partition("_p")
        backend = {"eager": "torch", "cudnn": "sdpa"}.get(provider, provider)
        if backend not in SCORERS[scorer].backends or (backend == "sdpa" and p):  # the registry's backends
            continue
        B = max(1, tokens // T)
        if (D, T) not in inputs:  # one shape in memory at a time
            inputs.clear()
            g = torch.Generator(device).manual_seed(0)
            inputs[D, T] = [torch.randn(B, H, T, D, generator=g, device=device, dtype=dtype) for _ in range(4)]
        q, k, v, do = inputs[D, T]
        x = [t.detach().requires_grad_(mode != "fwd") for t in (q, k, v)]
        params = {prm.name: torch.full((H,), prm.default, device=device, requires_grad=True)  # learned, as in a model
                  for prm in SCORERS[scorer].params}
        if SCORERS[scorer].forget:  # FoX's c: forget gates near 1
            params["c"] = F.logsigmoid(torch.randn(B, H, T, device=device) + 3).cumsum(-1).requires_grad_()
        f = lambda: providers_fn[provider](*x, scorer, p=float(p) if p else None, **params)
        fn = torch.no_grad()(f) if mode == "fwd" else lambda: f().backward(do)
        row = dict(scorer=name, provider=provider, D=D, T=T, B=B, H=H, mode=mode, dtype=str(dtype)[6:], ms=None,
                   tflops=None, peak_mib=None, status="ok")
        try:
            with mock.patch.object(fa, "create_block_mask", cached_mask):
                row["ms"], row["peak_mib"] = _measure(fn, [*x, *params.values()], q.is_cuda)
            row["tflops"] = 4 * B * H * T * T * D / 2 * (1 if mode == "fwd" else 3.5) / row["ms"] / 1e9
        except torch.OutOfMemoryError:
            row["status"] = "oom"
        except Exception as e:  # one failing (provider, shape) must not end a long run
            row["status"] = f"error: {type(e).__name__}: {str(e)[:200]}"
        torch.cuda.empty_cache()
        rows.append({**row, **info})
        if out:  # rewritten per row: a run cut short keeps its rows
            os.makedirs(os.path.dirname(str(out)) or ".", exist_ok=True)
            with open(f"{out}.csv", "w", newline="") as fh:
                csv.writer(fh).writerows([list(rows[0]), *(r.values() for r in rows)])
        print(f"{name:<11}{provider:<9}{D:>4}{T:>7}{B:>5} {mode:<8}", *(f"{row[c]:9.4g}" if row[c] else f"{'-':>9}"
              for c in ("ms", "tflops", "peak_mib")), "" if row["status"] == "ok" else row["status"], flush=True)
    assert rows, "nothing to run (sdpa and cudnn run the scorers whose registry backends list sdpa)"
    if out:
        plot(rows, out)
        print(f"wrote {out}.csv, {out}.png")
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Fused kernels against eager, SDPA and compiled FlexAttention")
    ap.add_argument("--T", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--D", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--scorers", nargs="+", default=[*SCORERS, "softmax_p3"])
    ap.add_argument("--providers", nargs="+", default=list(PROVIDERS), choices=PROVIDERS,
                    help="sdpa (its flash backend) and cudnn run the registry's sdpa scorers (softmax, ssmax, fox)")
    ap.add_argument("--tokens", type=int, default=16384, help="B * T")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32", "bfloat16", "float16", "float32"))
    ap.add_argument("--out", help="writes <out>.csv and <out>.png (e.g. out-bench/kernels); default: print only")
    a = ap.parse_args()
    if not (torch.cuda.is_available() or kernels.INTERPRET):  # the interpreter: tiny shapes, as the test runs
        raise SystemExit("error: bench/attention.py times the kernels on a CUDA GPU and found none "
                         "(or TRITON_INTERPRET=1)")
    dtype = getattr(torch, {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(a.dtype, a.dtype))
    benchmark(a.T, a.D, a.scorers, a.providers, a.tokens, a.heads, dtype, "cuda" if torch.cuda.is_available() else
              "cpu", a.out)
