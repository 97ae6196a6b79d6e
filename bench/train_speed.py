"""
Training throughput per scorer: tokens/s, MFU, peak memory, and the attention path that ran (for SDPA, the kernel
torch chose). train.py's step (AdamW, bf16 autocast on CUDA, fp32 on CPU, gradient clip 1) on one fixed batch of
random tokens: no data, no checkpoint, nothing written. Each timed step is one micro-batch's forward and backward,
then the optimizer's update, timed apart; tokens/s is that of the config's gradient_accumulation_steps g (one update
per g micro-batches, as train.py: g x micro + update), from their medians (--accum replaces g).

    python bench/train_speed.py                           # GPU: the 162M model (configs/ssmax.py), 30 steps a scorer
    python bench/train_speed.py --config configs/cpu_quick.py --block_size 1024 --batch_size 2 --steps 3   # CPU
    python bench/train_speed.py --compile     # each scorer eager, then torch.compile'd ("<scorer> compiled" rows)

The model fields of the config file apply (a scorer's own options only to that scorer); --scorers replaces its scorer.
"""
import argparse
import os
import statistics
import sys
import time
from contextlib import nullcontext
from dataclasses import fields

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from lib import tracking  # noqa: E402
from lib.config import OWN_OPTIONS, run_config  # noqa: E402
from model import GPT, GPTConfig, SCORERS, auto_backend  # noqa: E402


def model_config(path, scorer, **overrides):
    """GPTConfig from a config file's assignments as train.py reads them (its `base` first), for `scorer`: the file's
    scorer options (s, b, n inits, reweight_p, the forget gate's) only for the file's own scorer."""
    assigned = run_config(path)
    own = scorer == assigned.get("scorer", "softmax")  # else e.g. lssar's p = 15 re-weighted the softmax baseline
    kw = {f.name: assigned[f.name] for f in fields(GPTConfig)
          if f.name in assigned and (own or f.name not in (*OWN_OPTIONS, "reweight_p"))}
    return GPTConfig(**{**kw, "scorer": scorer, **{k: v for k, v in overrides.items() if v is not None}}), assigned


def attention_path(cfg, device, step):
    """auto's choice, and for sdpa the kernel behind it: the aten op a profiled step ran."""
    backend = auto_backend(cfg.scorer, cfg.p, device, cfg.head_size) if cfg.backend == "auto" else cfg.backend
    if backend != "sdpa":
        return backend
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    ops = {e.key.removeprefix("aten::_scaled_dot_product_").removesuffix("_backward") for e in prof.key_averages()
           if e.key.startswith("aten::_scaled_dot_product_")}  # flash_attention, cudnn_attention, ..._for_cpu
    return "sdpa:" + ("+".join(sorted(ops)) or "?")


def make_step(cfg, batch_size, device, compile=False):
    torch.manual_seed(0)
    model = GPT(cfg).to(device).train()
    # compiled in the warm-up steps (their time: warm-up s); every scorer is one more graph of GPT.forward, and past
    # dynamo's default limit of 8 the 9th (fox) silently ran eager under its "compiled" label
    torch._dynamo.config.recompile_limit = 64
    forward = torch.compile(model) if compile else model
    device_type = torch.device(device).type
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device_type)
    ctx = torch.autocast(device_type, torch.bfloat16) if device_type == "cuda" else nullcontext()
    x = torch.randint(0, cfg.vocab_size, (batch_size, cfg.block_size + 1), device=device)

    sync = torch.cuda.synchronize if device_type == "cuda" else lambda: None

    def micro():  # one micro-batch: forward and backward
        with ctx:
            _, loss = forward(x[:, :-1], x[:, 1:])
        loss.backward()
        sync()

    def update():  # the optimizer's step, once per g micro-batches in train.py
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
    return model, micro, update


def measure(config, scorers, steps, warmup, batch_size, device, interleave=False, compile=False, accum=None,
            **overrides):
    """{scorer: dict(tokens_per_s, mfu, peak_gib, path, ms, update_ms, accum)}: ms a micro-batch, update_ms the
    optimizer's step, tokens/s at `accum` micro-batches an update (None: the config's gradient_accumulation_steps).
    interleave: the scorers take turns step by step (a shared CPU's load then weighs on all alike); else one after
    the other, each with its own peak memory.
    compile: each scorer also torch.compile'd, as "<scorer> compiled"."""
    scorers = [s + c for s in scorers for c in ("", " compiled")[:1 + compile]]
    cuda = torch.device(device).type == "cuda"
    runs, results = {}, {}

    def start(scorer):
        cfg, assigned = model_config(config, scorer.split()[0], **overrides)
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        model, micro, update = make_step(cfg, batch_size or assigned.get("batch_size", 16), device,
                                         scorer.endswith("compiled"))
        t0 = time.perf_counter()
        for _ in range(warmup):  # Triton autotuning, allocator warm-up
            micro()
            update()
        runs[scorer] = dict(cfg=cfg, model=model, micro=micro, update=update, times=[], update_times=[],
                            warmup_s=time.perf_counter() - t0, B=batch_size or assigned.get("batch_size", 16),
                            g=accum or assigned.get("gradient_accumulation_steps", 1))

    def finish(scorer):
        r = runs.pop(scorer)
        dt, du = statistics.median(r["times"]), statistics.median(r["update_times"])
        tok = r["g"] * r["B"] * r["cfg"].block_size / (r["g"] * dt + du)
        mfu = tracking.mfu(r["model"], tok, r["cfg"].block_size, device)
        results[scorer] = dict(tokens_per_s=tok, ms=1e3 * dt, update_ms=1e3 * du, accum=r["g"], mfu=mfu,
                               peak_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda and not interleave else None,
                               path=attention_path(r["cfg"], device, r["micro"]), warmup_s=r["warmup_s"])
        return results[scorer]

    def timed(scorer):
        r, t0 = runs[scorer], time.perf_counter()
        r["micro"]()
        t1 = time.perf_counter()
        r["update"]()
        r["times"].append(t1 - t0)
        r["update_times"].append(time.perf_counter() - t1)

    if interleave:
        for scorer in scorers:
            start(scorer)
        for _ in range(steps):
            for scorer in scorers:
                timed(scorer)
        for scorer in scorers:
            yield scorer, finish(scorer)
    else:
        for scorer in scorers:
            start(scorer)
            for _ in range(steps):
                timed(scorer)
            yield scorer, finish(scorer)


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "ssmax.py"))
    ap.add_argument("--scorers", nargs="+", default=list(SCORERS), choices=SCORERS)
    ap.add_argument("--steps", type=int, default=30, help="timed steps per scorer (median)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch_size", type=int, help="default: the config's, else train.py's 16")
    ap.add_argument("--accum", type=int, help="micro-batches an optimizer step (default: the config's "
                    "gradient_accumulation_steps, else 1)")
    ap.add_argument("--block_size", type=int)
    ap.add_argument("--backend", choices=("auto", "torch", "sdpa", "cpu", "triton"), default="auto")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--interleave", action="store_true", help="scorers take turns each step (shared CPUs)")
    ap.add_argument("--compile", action="store_true", help="also time each scorer torch.compile'd")
    args = ap.parse_args()
    dev = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu, {torch.get_num_threads()} threads"
    print(f"# {os.path.relpath(args.config, ROOT)} on {dev}, torch {torch.__version__}, "
          f"batch {args.batch_size or 'config'}, block_size {args.block_size or 'config'}, {args.steps} timed steps "
          f"after {args.warmup}, {'bf16 autocast' if args.device.startswith('cuda') else 'fp32'}; tokens/s at "
          f"{args.accum or 'the config'}'s micro-batches an optimizer step", flush=True)
    print("| scorer | attention path | tokens/s | vs softmax | ms/micro-batch | ms/update (g) | MFU | peak GiB | "
          "warm-up s |\n|---|---|---|---|---|---|---|---|---|", flush=True)
    base = {}  # "" and " compiled": each row against softmax run the same way (compiled rows had eager softmax's)
    for scorer, r in measure(args.config, args.scorers, args.steps, args.warmup, args.batch_size, args.device,
                             args.interleave, args.compile, args.accum, block_size=args.block_size,
                             backend=args.backend):
        name, _, how = scorer.partition(" ")
        if name == "softmax":
            base[how] = r["tokens_per_s"]
        ratio = base.get(how) and r["tokens_per_s"] / base[how]
        print(f"| {scorer} | {r['path']} | {r['tokens_per_s']:,.0f} | {fmt(ratio, '.3f')} "
              f"| {r['ms']:.1f} | {r['update_ms']:.1f} ({r['accum']}) | "
              f"{fmt(r['mfu'] and 100 * r['mfu'], '.1f')}{'%' if r['mfu'] else ''} | "
              f"{fmt(r['peak_gib'], '.2f')} | {r['warmup_s']:.1f} |", flush=True)
