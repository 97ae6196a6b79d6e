"""
A run's cost on a CPU, checked before it starts (train.py): a lower bound on its hours from its FLOPs, and a stop
past CPU_LIMIT_HOURS unless allow_slow=True; and the allocator setting that keeps a CPU step from page-faulting.
"""
import ctypes, os, time
from dataclasses import fields

import torch

from lib import sft
from lib.checkpoint import build_model
from lib.config import TrainError
from model import GPTConfig, head_size


CPU_LIMIT_HOURS = 1.0  # longer runs stop unless allow_slow=True
CPU_SLOWEST_FLOPS = 1e10  # under it even at this rate: skip measuring

def cpu_hours(cfg, start_iter=0, rate=None):
    """A lower bound on the hours the rest of a run takes on this CPU, printed with its arithmetic: its FLOPs
    (model.GPT.flops_per_token: 6N + attention) at `rate` FLOP/s, measured (this CPU's matmul) only when even
    CPU_SLOWEST_FLOPS would not finish it in time. A run that would (or a bad model config) is 0, unprinted."""
    iters = sft.planned_iters(cfg)  # SFT in epochs: train.py sets max_iters from the data
    T, C = cfg.block_size, cfg.n_embd
    hs = head_size(C, cfg.n_head, cfg.head_dim)  # q is n_head heads wide, k and v n_kv_head
    q, kv = cfg.n_head * hs, (cfg.n_kv_head or cfg.n_head) * hs
    tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * T
    tokens = max(0, iters - start_iter) * tokens_per_iter
    # 2x the weights bounds it: small runs skip the meta model (attention: c_attn C x (q + 2 kv), c_proj q x C)
    weights = 2 * (2 * (cfg.vocab_size + 3) * C + cfg.n_layer * (2 * C * (q + kv) + 3 * C * cfg.ffn_hidden))
    if tokens * (6 * weights + 12 * cfg.n_layer * q * T) < CPU_SLOWEST_FLOPS * CPU_LIMIT_HOURS * 3600:
        return 0.0
    try:
        with torch.device("meta"):  # exact count, no weights allocated
            flops_per_token = build_model(GPTConfig(**{f.name: getattr(cfg, f.name) for f in fields(GPTConfig)}),
                                          cfg.task).flops_per_token
    except ValueError:  # train.py reports a bad config later
        return 0.0
    flops = tokens * flops_per_token(T)
    if flops < CPU_SLOWEST_FLOPS * CPU_LIMIT_HOURS * 3600:
        return 0.0
    how = "given"
    if rate is None:  # matmul rate: training is slower, so a lower bound
        a = torch.ones(1024, 1024)
        for _ in range(2):  # first pass warms up, second is timed
            t0 = time.perf_counter()
            torch.mm(torch.mm(a, a), a)
        rate, how = 4 * 1024 ** 3 / (time.perf_counter() - t0), "this CPU's measured fp32 matmul rate"
    hours = flops / rate / 3600
    print(f"cost on this CPU: {tokens:,} tokens ({iters - start_iter:,} iters x {tokens_per_iter:,}) x "
          f"{flops_per_token(T) / 1e9:.3g} GFLOP/token = {flops:.3g} FLOP at {rate / 1e9:.3g} GFLOP/s ({how}): "
          f"at least ~{hours:,.{0 if hours >= 10 else 1}f} hours")
    return hours


def cpu_cost_check(cfg, device_type, start_iter=0, rate=None):
    """On a CPU, a run estimated at over CPU_LIMIT_HOURS prints its cost and stops (TrainError: exit status 1), unless
    allow_slow=True. The estimate is cpu_hours: FLOPs at `rate` FLOP/s (tests pass it), else measured."""
    if device_type != "cuda" and cfg.backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":  # a traceback
        raise TrainError("backend='triton': the fused Triton kernels need a CUDA GPU; use backend=auto or torch")
    if device_type == "cpu" and cfg.backend == "flex" and (cfg.max_iters > start_iter or cfg.compile):  # a traceback
        raise TrainError("backend='flex': FlexAttention has no backward on the CPU (a forward only), and compiled, no "
                         "forward of its own either; use backend=auto, cpu or torch")
    if device_type != "cpu" or cfg.allow_slow:
        return
    hours = cpu_hours(cfg, start_iter, rate)
    if hours > CPU_LIMIT_HOURS:
        raise TrainError(f"this run would take at least ~{hours:,.0f} hours on this CPU (over "
                         f"{CPU_LIMIT_HOURS:g} h), so it stops before it starts: `python train.py "
                         f"configs/cpu_quick.py` trains a small model here in ~3 minutes; allow_slow=True runs this "
                         f"one anyway")


def reuse_freed_memory():
    """Keep the memory torch frees in the process: glibc unmaps large freed blocks, so each step page-faults its
    large buffers (the logits) back in. With mmap off and no trimming freed blocks are reused; the process keeps its
    peak memory. glibc only, else a no-op. train.py and bench/attention_cpu.py call it; importing this does nothing."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl)
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # malloc.h
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
