"""
Evaluation of the synthetic task runs (tasks.py, trained with train.py): accuracy, or MSE for linear, at many test
lengths with 95% intervals, and what the attention does as n grows.

    python eval_tasks.py out-first-*/ckpt.pt --lengths 32 64 128 256 512 --out_dir out-first-eval
    python eval_tasks.py out-recall-ssmax/ckpt.pt --lengths 32 128 512 --out_dir out-recall-eval --diagnose 32

accuracy.csv: a row per checkpoint x length x test condition x RoPE evaluation, with the final answer's accuracy,
its 95% Wilson interval and its loss in nats (linear: eq. 2's squared error averaged over the scored points k >= 3,
normal interval; eq. 2 divides by N_p, N_p / (N_p - 2) times less). attention.csv (--diagnose K):
per layer and head, the final row's attention mass on the target, its entropy (normalised to sum 1), its mass, the
uniform mass 1/L and the learned s (SSMax Figs. 1, 7, 8 without an LM's floor effect). Checkpoints, lengths and
memory are checked before the first evaluation; the files reach --out_dir when all are done, never over an earlier
evaluation's.
"""
import argparse
import math
import os
import sys
from types import SimpleNamespace  # a checkpoint's config as attributes

import numpy as np
import torch
import torch.nn.functional as F

from kernels_cpu import CHUNK
from lib import folders, rescale, tracking
from lib.checkpoint import model_of, pick_device, read_checkpoint, run_info
from lib.compare import rescaled, setting, unique_labels, wilson, write_csv
from model import SCORERS, auto_backend
from tasks import TARGETS, TASKS, get_batch, min_length, target_positions

# ----------------------------------------------------------------------------------------------------------------
# Loading and scoring: accuracy (or MSE) vs length

def load(path, device="cpu", **overrides):
    """(model, checkpoint) of a task run on device (None: where the run trained, train.py's "auto" as cuda when
    there is one); overrides change model fields (e.g. backend)."""
    ckpt = read_checkpoint(path)
    try:
        device = pick_device(device or ckpt["config"].get("device", "cpu"))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return model_of(ckpt, path, **overrides).to(device).eval(), ckpt


def bytes_per_token(cfg):
    """Rough bytes per token of a CPU fp32 forward: activations, logits and, off SDPA, kernels_cpu's CHUNK-row
    blocks."""
    width = max(cfg.n_embd, cfg.n_head * cfg.head_size)  # heads of their own width (head_dim): q, k, v, y that wide
    per_token = 4 * (6 * width + 2 * cfg.ffn_hidden + 2 * cfg.vocab_size) + 64
    blocks = auto_backend(cfg.scorer, cfg.p, "cpu") == "cpu" or SCORERS[cfg.scorer].forget  # fox: mask rows
    return per_token + (16 * CHUNK * cfg.n_head if blocks else 0)


BATCH = 16  # test sequences scored at once


@torch.no_grad()
def score(model, c, L, n, stream, batch=BATCH):
    """Per sequence: (1/0 for a right/wrong final answer (its last scored position), its loss in nats), or eq. 2's
    squared error averaged over the scored points (linear; eq. 2 divides its sum by N_p, not N_p - 2)."""
    task, out, dev = TASKS[c.task], [], model.lm_head.weight.device
    for i in range(0, n, batch):
        x, y = (t.to(dev) for t in get_batch(c, stream, torch.arange(i, min(n, i + batch)), L, test=True))
        scored = torch.isnan(y).logical_not() if task.n_in else y != -1
        if not scored.any(1).all():  # nothing to grade: the final answer's position would be read as 0
            empty = i + int(scored.any(1).int().argmin())
            raise ValueError(f"task {c.task!r} at length {L}: test sequence {empty} has no scored position; "
                             f"tasks.min_length (here {min_length(c)}) must exclude this length")
        logits, _ = model(x, y)
        if task.loss == "mse":
            out += (((logits.squeeze(-1) - y.nan_to_num()) ** 2 * scored).sum(1) / scored.sum(1)).tolist()
            continue
        last = (scored * torch.arange(L, device=dev)).argmax(1)  # the final answer's position
        at, want = logits[torch.arange(len(x)), last].float(), y[torch.arange(len(x)), last]
        pred = (at.squeeze(-1) > 0).float() if task.loss == "bce" else at.argmax(-1)
        nll = (F.binary_cross_entropy_with_logits(at.squeeze(-1), want, reduction="none") if task.loss == "bce"
               else F.cross_entropy(at, want, reduction="none"))  # the answer's loss: confidence, not just argmax
        out += zip((pred == want).float().tolist(), nll.tolist())
    return np.array(out)


# ----------------------------------------------------------------------------------------------------------------
# Attention diagnostics: mass on the target, entropy

@torch.no_grad()
def diagnose(model, c, L, n, stream):
    """Per layer and head, over n test sequences: the final row's attention mass on the target token, its entropy
    (of the row normalised to sum 1), its mass (1 unless the scorer's rows need not sum to 1) and the uniform mass
    1/n for comparison (the SSMax paper's Figs. 1, 7, 8, without an LM's floor effect)."""
    x, _ = get_batch(c, stream, torch.arange(n), L, test=True)
    P = model.attention_rows(x.to(model.lm_head.weight.device), rows=(-1,))[:, :, :, 0].cpu()  # (layer, B, nh, L)
    tgt = target_positions(c, x) if c.task in TARGETS else torch.full((len(x),), -1)  # evaluate says so
    ok = tgt >= 0
    mass = P[:, ok, :, :].gather(-1, tgt[ok].view(1, -1, 1, 1).expand(P.size(0), -1, P.size(2), 1))[..., 0]
    row = P.sum(-1)  # (n_layer, B, nh): 1, or sigmoid's, softpick's, stick-breaking's own mass
    Pn = P / torch.where(row > 0, row, 1).unsqueeze(-1)  # normalised to sum 1 at any mass, 1e-36 too (as eval_rows)
    entropy = torch.where(row > 0, -torch.special.xlogy(Pn, Pn).sum(-1), math.nan)  # an empty row has none
    s = [blk.attn.scorer_params().get("s") for blk in model.transformer.h]
    return [dict(layer=l, head=h, target_mass=float(mass[l, :, h].mean()) if ok.any() else float("nan"),
                 entropy=float(entropy[l, :, h].nanmean()), uniform=1 / L,
                 s=float(s[l][h]) if s[l] is not None else float("nan"), row_mass=float(row[l, :, h].mean()))
            for l in range(P.size(0)) for h in range(P.size(2))]


# ----------------------------------------------------------------------------------------------------------------
# Evaluation, written as each checkpoint finishes

ACC_COLUMNS = ("task", "model", "checkpoint", "iter", "scorer", "seed", "length", "accuracy", "ci_low", "ci_high", "n",
               "mse", "loss", "condition", "rope", "train_length")
# prompt_id: one seed's settings see the same prompts
# linear: correct is empty, answer_loss is the MSE
PROMPT_COLUMNS = ("run", "checkpoint", "iter", "task", "setting", "seed", "length", "condition", "rope", "prompt_id",
                  "correct", "answer_loss")


# settings.json: this command's options (a rescaling's floor is in no row's name), run_info; per_prompt.csv last: done
OUTPUTS = ("settings.json", "accuracy.csv", "attention.csv", "per_prompt.csv")


def check(runs, lengths, n, diag_n, ropes=("plain",)):
    """Every checkpoint a task run, every length one its task has, the longest within this machine's memory, a
    diagnosis at the trained RoPE."""
    batch = max(min(BATCH, n), diag_n)  # score's batch, or diagnose's
    for path, model, ckpt in runs:
        if diag_n and "plain" not in ropes and model.config.pos != "nope":  # attention.csv names no RoPE evaluation
            raise ValueError(f"--diagnose {diag_n}: the attention is diagnosed at the trained RoPE θ (--rope plain), "
                             f"which --rope {' '.join(ropes)} leaves out ({path}); add plain")
        dev = model.lm_head.weight.device
        free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else tracking.memory_available()
        c = SimpleNamespace(**ckpt["config"])
        if getattr(c, "task", None) not in TASKS:
            raise ValueError(f"{path} is a language model, not a task run (its config names no task of tasks.py)")
        if lengths[0] < min_length(c):
            short = " ".join(str(L) for L in lengths if L < min_length(c))
            raise ValueError(f"--lengths {short}: shorter than task {c.task!r} allows ({path}); give lengths >= "
                             f"{min_length(c)}")
        per = batch * bytes_per_token(model.config)
        if free is not None and lengths[-1] * per > free:
            big = " ".join(str(L) for L in lengths if L * per > free)
            raise ValueError(f"--lengths {big}: {batch} sequences of {lengths[-1]:,} tokens need about "
                             f"{lengths[-1] * per / 1e9:,.1f} GB of memory ({path}), more than the {free / 1e9:.1f} GB "
                             f"available; lengths up to {free // per:,} fit")


def evaluate(paths, lengths, n, out_dir, ropes=("plain",), diag_n=0, logit_scale=None, floor=rescale.LLAMA4_FLOOR,
             device="cpu"):
    """accuracy.csv, per_prompt.csv (and attention.csv with diag_n > 0) for every checkpoint, written after each
    one (main writes them to a folder that becomes --out_dir when all are done); lengths sorted. logit_scale: a
    training-free rescaling of softmax's logits (lib/rescale.py), its name appended to the setting; device: load's."""
    runs = [(p, *load(p, device)) for p in paths]  # check every input before the first evaluation
    check(runs, lengths, n, diag_n, ropes)
    rescale.check([model.config.scorer for _, model, _ in runs], logit_scale, floor=floor,
                  scalings=[model.config.rope_scaling for _, model, _ in runs])
    os.makedirs(out_dir, exist_ok=True)
    acc, att, prompts = [], [], []
    labels = unique_labels([os.path.basename(os.path.dirname(os.path.abspath(p))) for p in paths], paths)
    for (path, model, ckpt), label in zip(runs, labels):
        c = SimpleNamespace(**ckpt["config"])
        N, task = c.block_size, TASKS[c.task]
        which = dict(checkpoint=os.path.abspath(path), iter=ckpt.get("iter_num"))  # every row names its model
        name = rescaled(setting(ckpt["config"]), logit_scale)
        if diag_n and c.task not in TARGETS:
            print(f"{label}: task {c.task!r} has no target position (tasks.target_positions knows "
                  f"{', '.join(TARGETS)}): attention.csv's target_mass is NaN, its other columns hold")
        for rope in (["nope"] if c.pos == "nope" else ropes):
            for L in lengths:
                rescale.apply(model, logit_scale, L, floor)
                if rope != "nope":
                    scale = max(1.0, L / N) if rope == "theta" else 1.0  # no shrinking below N: the trained θ
                    model.extend_rope("none" if rope == "plain" else rope, scale, L)
                for ci, (cond, over) in enumerate(task.conditions):
                    cc = SimpleNamespace(**{**ckpt["config"], **over})
                    r = score(model, cc, L, n, stream=2 + ci)
                    mse = task.loss == "mse"
                    half = 1.96 * r.std(ddof=1) / math.sqrt(n)  # the mse's normal 95% interval
                    lo, hi = (r.mean() - half, r.mean() + half) if mse else wilson(r[:, 0].sum(), n)
                    acc.append(dict(task=c.task, model=label, **which, scorer=name, seed=c.seed, length=L,
                                    accuracy="" if mse else r[:, 0].mean(), ci_low=lo, ci_high=hi, n=n,
                                    mse=r.mean() if mse else "", loss="" if mse else r[:, 1].mean(), condition=cond,
                                    rope=rope, train_length=N))
                    prompts += [dict(run=label, **which, task=c.task, setting=name, seed=c.seed, length=L,
                                     condition=cond, rope=rope, prompt_id=i, correct="" if mse else int(x[0]),
                                     answer_loss=x if mse else x[1]) for i, x in enumerate(r.tolist())]
                    if diag_n and ci == 0 and rope in ("nope", "plain"):
                        att += [dict(task=c.task, model=label, **which, scorer=name, seed=c.seed,
                                     length=L, **d) for d in diagnose(model, cc, L, diag_n, stream=2)]
        write_csv(os.path.join(out_dir, "accuracy.csv"), acc, list(acc[0]))
        if att:
            write_csv(os.path.join(out_dir, "attention.csv"), att, list(att[0]))
        write_csv(os.path.join(out_dir, "per_prompt.csv"), prompts, list(prompts[0]))
        print(f"{label}: " + ", ".join(f"L={r['length']} {r['condition']} {r['rope']}: "
                                       + (f"mse {r['mse']:.3g}" if r["mse"] != "" else f"acc {r['accuracy']:.3f}")
                                       for r in acc if r["model"] == label))
    return acc, att


def main(argv=None):
    ap = argparse.ArgumentParser(description="Evaluate task runs at many lengths: accuracy.csv (95% Wilson "
                                             "intervals; MSE with a normal interval for linear), attention.csv.")
    ap.error = lambda message: sys.exit(f"error: {message}")  # one line, no usage dump
    ap.add_argument("ckpt", nargs="+", help="ckpt.pt or best.pt of task runs (train.py task=...)")
    ap.add_argument("--lengths", type=int, nargs="+", required=True, help="test lengths L (tokens)")
    ap.add_argument("--n", type=int, default=256, help="test sequences per length and condition")
    ap.add_argument("--out_dir", required=True)
    ap.add_argument("--rope", nargs="+", default=["plain"], choices=["plain", "theta", "dynamic_ntk"],
                    help="RoPE models: plain theta, theta x max(1, L/N), or Dynamic NTK (NoPE models ignore it)")
    ap.add_argument("--diagnose", type=int, default=0, help="sequences for the attention diagnostics (0: none)")
    ap.add_argument("--logit_scale", type=rescale.kind, metavar="KIND",
                   help=f"rescale a softmax model's logits, training-free: {', '.join(rescale.KINDS)} or a factor c")
    ap.add_argument("--llama4_floor", type=int, default=rescale.LLAMA4_FLOOR, help="llama4's floor scale F")
    ap.add_argument("--device", help="cpu, cuda, ... (default: where each run trained; auto: cuda if there is one)")
    tracking.add_args(ap)
    a = ap.parse_args(argv)
    if a.n < 2 or a.diagnose < 0 or min(a.lengths) < 1 or a.llama4_floor < 1:
        sys.exit(f"error: need --n >= 2, --diagnose >= 0, lengths >= 1 and --llama4_floor >= 1; got {a.n}, "
                 f"{a.diagnose}, {a.lengths}, {a.llama4_floor}")
    unread = tracking.unread_options(ap, a)  # never recorded in settings.json as applied
    if unread:
        ap.error("; ".join(unread))
    a.rope, a.lengths = list(dict.fromkeys(a.rope)), sorted(set(a.lengths))  # each once (a repeat wrote its rows
    try:  # twice), and settings.json says what ran
        with folders.results_dir(a.out_dir, OUTPUTS) as out:
            folders.write_json(os.path.join(out, "settings.json"), dict(args=vars(a), run_info=run_info()), indent=1)
            acc, _ = evaluate(a.ckpt, a.lengths, a.n, out, a.rope, a.diagnose, a.logit_scale, a.llama4_floor,
                              a.device)
        if a.wandb:
            tracking.log_table(a.wandb_project, f"tasks {os.path.basename(os.path.abspath(a.out_dir))}", acc, a.out_dir)
    except (ValueError, OSError, tracking.TrackingError, folders.FolderError) as e:  # CheckpointError is a ValueError
        sys.exit(f"error: {tracking.error_text(e)}")  # OSError: a full disk, an unwritable folder


if __name__ == "__main__":
    main()
