"""
CPU benchmark of the default paths (backend="auto"), in one run:
1. each scorer's attention forward+backward as a ratio to SDPA softmax (F.scaled_dot_product_attention, causal),
   B = 4, H = 4, D = 32, T = 256, 1024, 2048, fp32; the scorers' parameters learn (s, b), as in the model;
   --generic also times kernels_cpu's row template (its registry logits, no hand-written path: kernels_cpu.FAST);
   --p re-weights every normalised scorer (softmax and ssmax then run on kernels_cpu too); --reuse_memory keeps freed
   memory as train.py does (cost.reuse_freed_memory): else page faults make a path's time depend on the
   allocations of the paths timed before it (the template's, up to 1.5x either way);
2. training tokens/s per scorer for configs/cpu_quick.py at block_size 1024 (bench/train_speed.py), vs softmax.
Timings take turns (every scorer once, then again) and report medians, so a shared CPU's load weighs on all alike.
Prints markdown tables; writes nothing unless --out.

    python bench/attention_cpu.py [--reference] [--generic] [--p 3] [--reuse_memory] [--threads 1] [--out bench/cpu.md]
"""
import argparse
import os
import platform
import statistics
import sys
import time
from unittest import mock

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import kernels_cpu  # noqa: E402
import model  # noqa: E402
import train_speed  # noqa: E402  (bench/, this script's folder)
from lib import cost  # noqa: E402

PARAMS = {"ssmax": dict(s=1.0), "ssa": dict(b=1.0)}  # learnable per head in the model (ssa's n is fixed by default)
REPEATS = {256: 15, 1024: 7, 2048: 5}


def attention_table(Ts, scorers, reference, generic=False, p=None, B=4, H=4, D=32):
    rows = []
    for T in Ts:
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
        do = torch.randn(B, H, T, D)
        params = {sc: {name: torch.full((H,), x, requires_grad=True) for name, x in PARAMS.get(sc, {}).items()}
                  for sc in scorers}
        for sc in (sc for sc in scorers if model.SCORERS[sc].forget):  # FoX's c: forget gates near 1
            params[sc]["c"] = F.logsigmoid(torch.randn(B, H, T) + 3).cumsum(-1).requires_grad_()
        fns = {("softmax", "SDPA"): lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)}
        ps = {sc: p if p is not None and model.SCORERS[sc].sums_to_one else None for sc in scorers}
        for sc in scorers:
            for backend in ("auto", "torch") if reference else ("auto",):
                fns[(sc, backend)] = lambda sc=sc, backend=backend: model.attention(q, k, v, sc, p=ps[sc],
                                                                                    backend=backend, **params[sc])
            if generic and model.auto_backend(sc, ps[sc], "cpu") == "cpu" and model.SCORERS[sc].logit is not None:
                fns[(sc, "generic")] = lambda sc=sc: _generic(q, k, v, sc, ps[sc], params[sc])
        times = {key: [] for key in fns}
        for rep in range(REPEATS.get(T, 5) + 1):  # the first round warms up, untimed
            for key, fn in fns.items():
                t0 = time.perf_counter()
                fn().backward(do)
                if rep:
                    times[key].append(time.perf_counter() - t0)
        base = statistics.median(times[("softmax", "SDPA")])
        for (sc, backend), ts in times.items():
            path = {"auto": model.auto_backend(sc, ps[sc], "cpu"),
                    "generic": "cpu (template)"}.get(backend, backend)
            rows.append((T, sc, "F.sdpa (baseline)" if backend == "SDPA" else path, 1e3 * statistics.median(ts),
                         statistics.median(ts) / base))
        print(f"  T = {T} done", file=sys.stderr, flush=True)
    return rows


def _generic(q, k, v, scorer, p, params):  # kernels_cpu without its hand-written paths
    with mock.patch.object(kernels_cpu, "FAST", {}):
        return kernels_cpu.attention(q, k, v, scorer, p=p, **params)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.error = lambda message: sys.exit(f"error: {message}")  # one line, no usage dump
    ap.add_argument("--T", type=int, nargs="+", default=[256, 1024, 2048])
    ap.add_argument("--scorers", nargs="+", default=list(model.SCORERS), choices=model.SCORERS)
    ap.add_argument("--reference", action="store_true", help="also time backend=torch (the reference; slow)")
    ap.add_argument("--generic", action="store_true", help="also time kernels_cpu's row template (no FAST path)")
    ap.add_argument("--p", type=float, help="re-weight every normalised scorer with this p")
    ap.add_argument("--reuse_memory", action="store_true", help="keep freed memory, as train.py on the CPU")
    ap.add_argument("--train_steps", type=int, default=3, help="timed training steps per scorer (0: skip)")
    ap.add_argument("--train_batch", type=int, default=2, help="sequences per training step")
    ap.add_argument("--train_block", type=int, default=1024, help="block_size of the training steps")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's own); 1 on a CPU shared with others")
    ap.add_argument("--out", help="also write the tables (markdown) to this file")
    args = ap.parse_args(argv)
    least = {"train_batch": 1, "train_block": 1, "train_steps": 0, "threads": 1}  # threads None: torch's own
    bad = [f"--T {t}" for t in args.T if t < 1] + [f"--{k} {getattr(args, k)}" for k, m in least.items()
                                                   if getattr(args, k) is not None and getattr(args, k) < m]
    bad += [f"--p {args.p}"] * (args.p is not None and not 0 < args.p <= 100)  # as scorers.get
    if bad:  # found before the benchmark runs, not as a traceback after it
        ap.error(f"{', '.join(bad)}: sizes, --threads >= 1, --train_steps >= 0 (0: skip), --p in (0, 100]")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        ap.error(f"--out {args.out!r}: its folder does not exist (the tables are written there at the end)")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.reuse_memory:
        cost.reuse_freed_memory()
    t_start, load0 = time.time(), os.getloadavg()[0]
    lines = [f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads"
             f", torch {torch.__version__}; load average {load0:.1f} at the start", "",
             "| T | scorer | path | ms fwd+bwd | x SDPA softmax |", "|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for T, sc, path, ms, ratio in attention_table(args.T, args.scorers, args.reference, args.generic,
                                                    args.p):
        lines.append(f"| {T} | {sc} | {path} | {ms:.1f} | {ratio:.2f} |")
        print(lines[-1], flush=True)
    if args.train_steps:
        lines += ["", f"Training, configs/cpu_quick.py at block_size {args.train_block}, batch {args.train_batch}, "
                  f"fp32, median of "
                  f"{args.train_steps} steps taken in turns:", "",
                  "| scorer | path | tokens/s | x softmax |", "|---|---|---|---|"]
        print("\n".join(lines[-5:]), flush=True)
        base = None
        for sc, r in train_speed.measure(os.path.join(ROOT, "configs", "cpu_quick.py"), args.scorers,
                                         args.train_steps, 1, args.train_batch, "cpu", interleave=True,
                                         block_size=args.train_block):
            base = base or (r["tokens_per_s"] if sc == "softmax" else None)
            lines.append(f"| {sc} | {r['path']} | {r['tokens_per_s']:,.0f} | "
                         f"{train_speed.fmt(base and r['tokens_per_s'] / base, '.3f')} |")
            print(lines[-1], flush=True)
    lines += ["", f"{time.time() - t_start:.0f} s in all; load average {os.getloadavg()[0]:.1f} at the end"]
    print(lines[-1])
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
