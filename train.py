"""
Training for any scorer on a CPU, a GPU or many (DDP): the SSMax paper's recipe (Nakanishi 2025, App. B), language
modelling or a synthetic task of tasks.py. No run is overwritten unasked; checkpoints load with weights_only.

    python train.py configs/cpu_quick.py [scorer=ssmax out_dir=out-quick-ssmax]   # ~3 min on 2 CPU cores
    python train.py configs/ssmax.py                                              # one H100, ~45 min: the 162M model
    torchrun --standalone --nproc_per_node=8 train.py configs/paper/ssmax.py      # the paper's full recipe
    python train.py configs/tasks/recall.py scorer=ssmax                          # a synthetic task (tasks.py)
    python train.py configs/ssmax_swap.py                                         # softmax -> SSMax, a new leg
    python train.py configs/sft.py init_from=out-ssmax/ckpt.pt                    # SFT on {"prompt", "answer"} lines
    python train.py --compare out-softmax out-ssmax [--out compare.png]           # runs' log.jsonl in one figure

Resuming (init_from="resume"; resume=True: if the checkpoint exists) restores weights, optimizer, RNG states and the
data position, so the losses are those of a run never stopped; under DDP, K processes see the batches and masks of one.
A resume may switch the scorer (scorer= and its ssmax_*/ssa_* options), the SSMax paper's variant (f): same batches
as the unswitched run, AdamW's state kept for every kept weight, the new s (and b) fresh at s0 (or ssmax_s_init); a
new scorer, θ or block_size is evaluated first and starts its own best.pt; on a finished run only with overwrite=True:
    mkdir -p out-ssmax-f && cp out-softmax/ckpt_3325.pt out-ssmax-f/ckpt.pt                 # the run at the switch
    python train.py init_from=resume out_dir=out-ssmax-f scorer=ssmax max_iters=3800 overwrite=True  # from 3,325
"""
import math, os, sys, time, types
from dataclasses import asdict, replace

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import tasks
from lib import cost, dataset, figures, folders, longrange, provenance, sft, tracking, vocab
from lib.checkpoint import (CheckpointError, best_of, build_model, check_out_dir, clear_out_dir, read_checkpoint,
                            rng_state, run_info, save_checkpoint, set_rng_state)
from lib.config import (TrainConfig, TrainError, changed_from, model_config, new_val_loss, parse_args, resolve,
                        switch_text, usage)
from lib.corpora import EMBEDDED
from model import GPTConfig, convert_scorer

# best.pt: no optimizer
RESUME_KEYS = ("optimizer", "rng", "data_state")  # what a resume needs beyond the weights


# ----------------------------------------------------------------------------------------------------------------
# Setup: a run that cannot start stops before any download

def setup(explicit):
    """-> cfg resolved with the checkpoint, the checkpoint (None from scratch), run: the processes, device and paths."""
    cfg = TrainConfig(**explicit)
    ddp = int(os.environ.get("RANK", -1)) != -1  # launched by torchrun
    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    try:
        torch.device(device)
    except RuntimeError:
        raise TrainError(f"device={device!r} is not a torch device; allowed: auto, cpu, cuda, cuda:N, mps")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise TrainError(f"device={device!r}, but this torch build ({torch.__version__}) sees no CUDA GPU: use "
                         f"device=cpu (or auto)")
    if ddp:
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
        if device.startswith("cuda"):
            device = f"cuda:{os.environ['LOCAL_RANK']}"
            torch.cuda.set_device(device)
    rank, world = (dist.get_rank(), dist.get_world_size()) if ddp else (0, 1)
    device_type = torch.device(device).type
    if device_type == "cpu":
        cost.reuse_freed_memory()  # no page faults on freed logits (lib/cost.py)
    ctx = torch.autocast(device_type, torch.bfloat16, enabled=device_type == "cuda")
    run = types.SimpleNamespace(ddp=ddp, rank=rank, world=world, master=rank == 0,  # only the master prints and writes
                                device=device, device_type=device_type, ctx=ctx,
                                ckpt_path=os.path.join(cfg.out_dir, "ckpt.pt"),
                                best_path=os.path.join(cfg.out_dir, "best.pt"))
    run.resuming = cfg.init_from == "resume" or (cfg.resume and os.path.isfile(run.ckpt_path))
    path = run.ckpt_path if run.resuming else cfg.init_from
    if path != "scratch" and not os.path.exists(path):  # a folder: read_checkpoint says so
        raise TrainError(f"init_from={cfg.init_from!r}: checkpoint {path!r} does not exist")
    try:  # a new run never destroys an old one unasked; weights_only: a shared checkpoint cannot run code
        check_out_dir(cfg.out_dir, run.resuming, cfg.resume, cfg.overwrite)
        ckpt = None if path == "scratch" else read_checkpoint(path, need=RESUME_KEYS * run.resuming)
    except CheckpointError as e:
        raise TrainError(str(e))
    run.source = path
    cfg = resolve(cfg, explicit, ckpt, run.resuming, world)
    if ckpt is not None:  # its architecture and task before data or the cost check: no estimate of a refused model
        model_config(cfg, explicit, ckpt, run.resuming)
    if not (cfg.task or cfg.sft_data):  # the dataset's vocabulary sizes the model; an embedded one is made here (local)
        if run.master and cfg.dataset in EMBEDDED:
            dataset.fetch(cfg.dataset, cfg.data_dir)
        cfg = vocab.data_vocab(cfg, explicit, ckpt, os.path.join(cfg.data_dir, cfg.dataset))
    sft.check_sft_path(cfg.sft_data)  # its size sets max_iters: missing, the cost check counted 200,000 ("356 hours")
    cost.cpu_cost_check(cfg, device_type, ckpt["iter_num"] if run.resuming else 0)  # before any download or model
    torch.manual_seed(cfg.seed)  # same on every rank: one saved RNG state fits all
    return cfg, ckpt, run


# ----------------------------------------------------------------------------------------------------------------
# Data: train.bin windows, task samples or SFT examples

def load_data(cfg, run, explicit, ckpt):
    """-> cfg (SFT in epochs sets its schedule; a dataset's vocabulary), data: what get_batch reads and the generator
    whose state is the data position."""
    T, data = cfg.block_size, types.SimpleNamespace(sft=None, dir=None, unigram=None, codec=None,
                                                  state={"sha256": None})
    data.g = torch.Generator().manual_seed(cfg.seed)  # same on every rank: each slices one global batch
    if cfg.task:  # endless seeded streams: offsets are sample indices
        data.size = {"train": 2 ** 62, "val": 2 ** 62}
    elif cfg.sft_data:  # a resume: the file it trained on (data.state's sft_sha256)
        data.sft, data.codec, data.state = sft.sft_data(cfg, ckpt, run.resuming)
        data.size = dict(zip(dataset.SPLITS, map(len, data.sft)))
        cfg = sft.sft_schedule(cfg, data.size["train"])  # (train, val) examples
    else:  # checked against meta.json: never train on a truncated split; an embedded one is made (up to date) in setup
        data.dir = dataset.fetch(cfg.dataset, cfg.data_dir, make=run.master and cfg.dataset not in EMBEDDED)
        if run.ddp:  # the other ranks wait for it
            dist.barrier()
        cfg = vocab.data_vocab(cfg, explicit, ckpt, data.dir)  # made now, if setup could not
        data.codec = vocab.data_record(data.dir)
        if ckpt is not None:  # the same symbols, not only as many
            vocab.language_model(run.source, ckpt, data.dir)
        data.state = provenance.data_state(data.dir, ckpt, run.source, run.resuming, run.master)  # a resume: its splits
        data.size = {s: len(dataset.load_split(data.dir, s)) - T for s in dataset.SPLITS}
        data.inode = {s: os.stat(os.path.join(data.dir, f"{s}.bin")).st_ino for s in dataset.SPLITS}  # get_batch's
        if min(data.size.values()) < 1:
            raise TrainError(f"{data.dir}: a split has fewer than block_size + 1 = {T + 1} tokens")
        for s in dataset.SPLITS:  # an id past the embedding would fail deep inside, mid-run
            dataset.check_ids(data.dir, s, cfg.vocab_size)
        data.unigram = dataset.unigram_entropy(data.dir)
    return cfg, data


def get_batch(cfg, data, split, ix, device):  # ix: window offsets, sample or example indices
    T = cfg.block_size
    if cfg.task:
        x, y = tasks.get_batch(cfg, tasks.TRAIN if split == "train" else tasks.VAL, ix, T)
    elif cfg.sft_data:
        x, y = sft.sft_batch(data.sft[dataset.SPLITS.index(split)], ix, T)
    else:
        tokens = dataset.load_split(data.dir, split, data.inode[split])  # a new memmap a batch avoids a leak (nanoGPT)
        w = np.stack([tokens[i:i + T + 1] for i in ix.tolist()]).astype(np.int64)
        if split == "train" and cfg.copy_frac > 0:  # val stays plain text; eval_copy.py measures the copying
            longrange.insert_copies(w, ix.tolist(), cfg.copy_frac, cfg.copy_span, cfg.seed, cfg.copy_kind)
        x, y = torch.from_numpy(w[:, :-1]), torch.from_numpy(w[:, 1:])
    return x.to(device), y.to(device)


def next_indices(cfg, data, it, n):  # n indices: the global batch of step `it`
    if not cfg.sft_data:
        return torch.randint(data.size["train"], (n,), generator=data.g)
    return sft.sft_order(cfg.seed, it, n, data.size["train"])


def batch_loss(cfg, ctx, model, x, y):  # SFT: the paper's answer-span loss sum per sequence
    with ctx:
        _, loss = model(x, y, reduction="sum" if cfg.sft_data else "mean")
    return loss / len(x) if cfg.sft_data else loss


@torch.no_grad()
def estimate_loss(cfg, data, run, model):
    """Mean loss over the same eval_iters batches per split at every eval (a fresh generator); on every rank."""
    out = {}
    model.eval()
    for split in ("train", "val"):
        ix = torch.randint(data.size[split], (cfg.eval_iters, cfg.batch_size),
                           generator=torch.Generator().manual_seed(cfg.seed + 1))
        out[split] = float(np.mean([batch_loss(cfg, run.ctx, model, *get_batch(cfg, data, split, i, run.device)).item()
                                    for i in ix]))
    model.train()
    return out


# ----------------------------------------------------------------------------------------------------------------
# Model and optimizer

def build(cfg, explicit, ckpt, run):
    """The model (the checkpoint's weights; this command may change its scorer, θ, block_size, dropout...) and AdamW
    (a resume's state) -> cfg showing the model actually trained, the model, the optimizer, what this command changed
    in the checkpoint's model: {field: [old, new]} (θ, block_size, the scorer and its options...), or {}."""
    model_args, switch = model_config(cfg, explicit, ckpt, run.resuming)
    model = old = build_model(GPTConfig(**(model_args if ckpt is None else ckpt["model_args"])), cfg.task)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        if model_args != ckpt["model_args"]:
            model = convert_scorer(model, lambda c: build_model(c, cfg.task), **model_args)  # the rest kept; ssmax: s0
    model.to(run.device)
    cfg = replace(cfg, **asdict(model.config))  # the stored config shows the model actually trained
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2),
                                           run.device_type)
    if run.resuming:
        state = ckpt["optimizer"]
        if model is not old:  # AdamW's state is positional: remap kept weights
            before = old.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), "cpu")
            where = {name: i for i, name in enumerate(old.param_names(before))}  # the checkpoint's order
            state = {"state": {i: state["state"][where[name]] for i, name in enumerate(model.param_names(optimizer))
                               if where.get(name) in state["state"]},  # a new scorer parameter starts fresh
                     "param_groups": [{**group, "params": new["params"]} for group, new
                                      in zip(state["param_groups"], optimizer.state_dict()["param_groups"])]}
        optimizer.load_state_dict(state)
    return cfg, model, optimizer, switch


def get_lr(cfg, it):
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if cfg.lr_schedule == "constant":
        return cfg.learning_rate
    ratio = min(1.0, (it - cfg.warmup_iters) / max(1, cfg.lr_decay_iters - cfg.warmup_iters))
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - cfg.min_lr)


# ----------------------------------------------------------------------------------------------------------------
# Training loop: eval and checkpoint, then one step

def train(explicit):
    cfg, ckpt, run = setup(explicit)
    cfg, data = load_data(cfg, run, explicit, ckpt)
    cfg, raw_model, optimizer, switch = build(cfg, explicit, ckpt, run)
    iter_num, best_val_loss, resuming, master, fresh = 0, float("inf"), run.resuming, run.master, new_val_loss(switch)
    if resuming:  # fresh: a new scorer, θ or block_size, its val loss another quantity: its own best.pt
        iter_num, best_val_loss = ckpt["iter_num"], float("inf") if fresh else ckpt["best_val_loss"]
        set_rng_state(ckpt["rng"], run.device_type)
        data.g.set_state(ckpt["data_state"]["generator"])
    pending_eval = ckpt if resuming and not fresh and "eval" in ckpt else None  # its eval may lack its log line
    # hf: an imported model's source (config, BOS), its fine-tunes export with it; changed: {field: [trained, now]}
    lineage = {"hf": ckpt and ckpt.get("hf"), "changed": changed_from(ckpt, switch)}
    ckpt, T, accum = None, cfg.block_size, cfg.gradient_accumulation_steps // run.world
    eval_model = model = torch.compile(raw_model) if cfg.compile else raw_model
    if run.ddp:
        model = DDP(model, device_ids=[torch.cuda.current_device()] if run.device_type == "cuda" else None)
    info, tokens_per_iter = run_info(cfg.seed), cfg.gradient_accumulation_steps * cfg.batch_size * T
    if master:
        tracking.announce(cfg, raw_model, run, tokens_per_iter, data, info)  # may fail: before out_dir is touched

    def save(path, state):
        try:
            save_checkpoint(state, path)
        except OSError as e:  # e.g. a full disk: the old file is intact
            raise TrainError(f"{e}; {diverged('stops')}")

    def diverged(what="diverged and stops"):
        return f"the run {what}; " + (f"the last good checkpoint {run.ckpt_path} is kept"
                                      if os.path.isfile(run.ckpt_path) else "no checkpoint was written yet")

    def finish_eval(state):  # best.pt first (an older state has no hf), then the eval's log line
        best = lambda: save(run.best_path, best_of(state))  # noqa: E731
        return tracking.record_eval(state, cfg, info, raw_model, best, drawn)

    losses, drawn = None, {}  # drawn: when this run last drew loss.png (finish_eval's)
    if master:
        clear_out_dir(cfg.out_dir, resuming, iter_num)
        done = resuming and not fresh and tracking.eval_logged(  # this very eval: not the old model's at iter_num
            cfg.out_dir, iter_num, (pending_eval or {}).get("eval"))
        if resuming and not done and pending_eval is not None:
            losses = finish_eval(pending_eval)  # killed between ckpt.pt and the eval's log line
        elif done and iter_num >= cfg.max_iters:
            print(f"already done: {cfg.out_dir} finished at iter {iter_num} of max_iters={cfg.max_iters} (best val "
                  f"loss {best_val_loss:.4f}); set a larger max_iters to train on")
            return
        tracking.log({"config": asdict(cfg), "run_info": info, "unigram_entropy": data.unigram, "start_iter": iter_num,
                      **({"switch": switch} if switch else {})}, cfg, info, raw_model)  # switch: {field: [old, new]}
        if switch:  # θ too: the weights were trained at the old value
            print(switch_text(switch, iter_num))
    t_start, dt_avg, start_iter = time.time(), None, iter_num
    while True:  # a resume's eval is done, unless fresh (a new scorer, θ or block_size: evaluated first)
        due = iter_num % cfg.eval_interval == 0 or iter_num == cfg.max_iters
        if (due and (not resuming or iter_num > start_iter)) or (fresh and iter_num == start_iter):
            losses = estimate_loss(cfg, data, run, eval_model)
            if not all(map(math.isfinite, losses.values())):
                raise TrainError(f"eval loss {losses} at iter {iter_num}: {diverged()}")
            if master:
                is_best, best_val_loss = losses["val"] < best_val_loss, min(best_val_loss, losses["val"])
                state = {"model": raw_model.state_dict(), "model_args": asdict(raw_model.config), "config": asdict(cfg),
                         "optimizer": optimizer.state_dict(), "iter_num": iter_num, "best_val_loss": best_val_loss,
                         "rng": rng_state(run.device_type), "run_info": info, "codec": data.codec, **lineage,
                         "data_state": {"generator": data.g.get_state(), **data.state},  # its data's sha256
                         "eval": {"iter": iter_num, "train_loss": losses["train"], "val_loss": losses["val"],
                                  "elapsed": time.time() - t_start, "is_best": is_best}}
                save(run.ckpt_path, state)
                finish_eval(state)
        if iter_num >= cfg.max_iters:
            break

        lr = get_lr(cfg, iter_num)
        for group in optimizer.param_groups:
            group["lr"] = lr
        ix = next_indices(cfg, data, iter_num, cfg.gradient_accumulation_steps * cfg.batch_size)
        ix = ix.view(run.world, accum, -1)[run.rank]
        t0, loss_sum = time.time(), torch.zeros((), device=run.device)
        for micro_step in range(accum):
            if run.ddp:  # all-reduce the gradients once, at the last micro-step
                model.require_backward_grad_sync = micro_step == accum - 1
            if cfg.dropout:  # masks of (seed, step, the micro-batch's place in the global batch), not of the rank
                torch.manual_seed(hash((cfg.seed, iter_num, run.rank * accum + micro_step)) % 2 ** 63)
            loss = batch_loss(cfg, run.ctx, model, *get_batch(cfg, data, "train", ix[micro_step], run.device)) / accum
            loss.backward()
            loss_sum += loss.detach()
        if run.ddp:
            dist.all_reduce(loss_sum)
            loss_sum /= run.world
        loss_value = loss_sum.item()
        if not math.isfinite(loss_value):  # before the update: the weights stay good
            raise TrainError(f"loss is {loss_value} at iter {iter_num} (lr {lr:.3g}): {diverged()}")
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        dt = time.time() - t0
        if master and cfg.compile and iter_num == start_iter:  # the compiling happens in this step, once
            print(f"compile: the first step took {dt:.1f} s (torch.compile traces and compiles the model once)")
        dt_avg = dt if dt_avg is None or iter_num == start_iter + 1 else 0.9 * dt_avg + 0.1 * dt  # first step: out
        mfu = tracking.mfu(raw_model, tokens_per_iter / dt / run.world, T, run.device)  # per GPU
        eta = (cfg.max_iters - iter_num - 1) * dt_avg  # s, evals out; a compile in the first step weighed ~60 steps
        if master:  # log.jsonl every step, print every log_interval
            tracking.progress({"iter": iter_num, "loss": loss_value, "lr": lr, "tokens_per_s": tokens_per_iter / dt,
                               "mfu": mfu, "eta_s": eta, "elapsed": time.time() - t_start}, cfg, info, raw_model)
        iter_num += 1

    if master and losses is not None:
        print(f"done: val loss {losses['val']:.4f}, best {best_val_loss:.4f}"
              + (f"; unigram baseline {data.unigram:.4f} nats" if data.unigram else ""))
    enc = vocab.from_record(data.codec) if master and data.dir else None  # a language model: a sample in its codec
    if enc is not None and vocab.fits(raw_model.config.vocab_size, enc.n_vocab, True):  # padded: the codec's ids
        with run.ctx:
            idx = raw_model.eval().generate(torch.tensor([[enc.eot_token]], device=run.device), 100, 0.8, top_k=200,
                                            vocab=enc.n_vocab)
        print("sample:\n" + enc.decode(idx[0, 1:].tolist()))
    if run.ddp:
        dist.destroy_process_group()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if {"-h", "--help"} & set(argv) and argv[:1] != ["--compare"]:
        return print(usage(__doc__))
    try:
        if argv[:1] == ["--compare"]:  # runs' curves in one PNG, no wandb (lib/figures.py)
            return figures.compare_main(argv[1:])
        explicit = parse_args(argv)
        with folders.held(explicit.get("out_dir", TrainConfig.out_dir), "a training run",  # rank 0 writes
                       active=int(os.environ.get("RANK", 0)) == 0):
            train(explicit)
        tracking.finish()  # an in-process caller's next run is a new wandb run
    except (TrainError, dataset.DataError, tasks.TaskError, tracking.TrackingError, folders.FolderError,
            OSError) as e:  # OSError: a full disk or an unwritable folder
        every_rank = isinstance(e, (TrainError, dataset.DataError, tasks.TaskError)) and int(os.environ.get("RANK", 0))
        sys.exit(1 if every_rank else f"error: {tracking.error_text(e)}")  # every rank raised it: rank 0 says it
    finally:  # on error, an open wandb run ends as failed
        tracking.finish(failed=True)


if __name__ == "__main__":
    main()
