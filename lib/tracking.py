"""
Experiment tracking, what a run records and reports: its log.jsonl and loss.png, its progress lines and their MFU,
optional Weights & Biases logging (the figure that overlays several runs, train.py --compare, is lib/figures.py's).

    WANDB_MODE=offline python train.py configs/cpu_quick.py wandb_log=True   # no network; `wandb sync` uploads later

wandb is imported only when asked (wandb_log=True, log_table): a run without it never pays for it. A run's wandb
folder is in its out_dir: `wandb sync out-quick/wandb/offline-run-*` uploads an offline one.
"""
import contextlib, json, os, re, sys, textwrap, time
from dataclasses import asdict
from datetime import timedelta

from lib import folders

class TrackingError(Exception):
    """Bad input to tracking (no wandb package, a folder without log.jsonl): train.main prints it as one line."""

def error_text(e, lower=None):
    """An exception as the one line after "error: "; an OSError (a full disk, an unwritable folder) with its path;
    given `lower`, a RuntimeError or MemoryError is an allocation failure (memory_error: any other is raised again)."""
    if lower and isinstance(e, (RuntimeError, MemoryError)):
        return memory_error(e, lower)
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    return str(e)

def memory_error(e, lower):
    """An allocation failure (torch's CPU allocator, CUDA out of memory, numpy's MemoryError) as the one line after
    "error: ", naming the options to lower; any other error is raised again, its traceback kept (a bug)."""
    text = str(e)
    if not (isinstance(e, MemoryError) or "can't allocate memory" in text or "out of memory" in text):
        raise e
    asked = re.search(r"allocate (\d+) bytes|allocate ([\d.]+ \w+)", text)  # torch's CPU message counts bytes
    size = "" if not asked else f" (tried to allocate {asked[2] or f'{int(asked[1]) / 2**30:.2f} GiB'})"
    return f"out of memory{size}: lower {lower}"

def import_wandb():
    try:
        import wandb
    except ImportError:
        raise TrackingError("logging to Weights & Biases needs the wandb package: `pip install wandb` (without it, "
                            "`python train.py --compare OUT_DIR ...` draws runs side by side)")
    return wandb

def add_args(parser):
    """--wandb and --wandb_project for an evaluation script: its results as a table in the project."""
    parser.add_argument("--wandb", action="store_true", help="also log the results to Weights & Biases")
    parser.add_argument("--wandb_project", default="nanoscorer")

def unread_options(parser, args):
    """add_args' options given and not read, each in words for one error line: a project without --wandb was
    recorded in the results' args as if they had been logged to it."""
    if args.wandb or args.wandb_project == parser.get_default("wandb_project"):  # a default is never refused
        return []
    return [f"--wandb_project {args.wandb_project} is not read: nothing is logged to it without --wandb"]

def start(**kwargs):
    """wandb.init(**kwargs) as a new run; its failure is one line."""
    wandb = import_wandb()
    try:
        return wandb.init(reinit="create_new", **kwargs)
    except Exception as e:  # e.g. no API key: say how to go offline
        raise TrackingError(f"wandb.init failed: {(str(e).strip() or type(e).__name__).splitlines()[0]}; with no "
                            f"account or network, set WANDB_MODE=offline (and upload later: wandb sync)")


# ----------------------------------------------------------------------------------------------------------------
# A run's own records: log.jsonl, and loss.png from it

def _records(path):
    """[(line number, record or None where the line is not a JSON object)] of log.jsonl, blank lines left out."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, 1):
            try:
                r = json.loads(line) if line.strip() else {}
            except ValueError:
                r = None
            if r != {}:
                out.append((i, r if isinstance(r, dict) else None))
    return out

def read_log(path, warn=False):
    """log.jsonl's records ([] before the first). A cut or junk line (a kill or a full disk mid-write) is left out,
    with a warning if warn; a resume removes it (repair_log)."""
    if not os.path.isfile(path):
        return []
    records = _records(path)
    bad = [i for i, r in records if r is None]
    if bad and warn:
        print(f"warning: {path}: line(s) {', '.join(map(str, bad))} are not JSON records (cut by a kill or a full "
              f"disk?), left out", file=sys.stderr)
    return [r for _, r in records if r is not None]

def read_run(out_dir):
    """(label, steps {iter: loss}, evals {iter: val_loss}) from out_dir/log.jsonl (train.py --compare's curves); a
    resumed run's entry wins."""
    path = os.path.join(out_dir, "log.jsonl")
    if not os.path.isfile(path):
        raise TrackingError(f"{out_dir!r} has no log.jsonl: not a train.py out_dir (or no step was logged yet)")
    rows = read_log(path, warn=True)
    scorer = next((r["config"].get("scorer") for r in reversed(rows) if "config" in r), None)
    label = os.path.basename(os.path.abspath(out_dir)) + (f" ({scorer})" if scorer else "")
    return (label, {r["iter"]: r["loss"] for r in rows if "loss" in r},
            {r["iter"]: r["val_loss"] for r in rows if "val_loss" in r})

def repair_log(path, start=None):
    """Before a resume from iter `start` appends: log.jsonl without its cut or junk lines (a cut last line would
    swallow the next record) and without the steps logged after the checkpoint (start and on: run again, else listed
    twice), rewritten whole; each line dropped is named once."""
    if not os.path.isfile(path):
        return
    records = _records(path)
    bad = [i for i, r in records if r is None]
    redone = [i for i, r in records if start is not None and r and "loss" in r and r.get("iter", -1) >= start]
    with open(path, "rb") as f:
        ends_clean = f.seek(0, 2) == 0 or (f.seek(-1, 2), f.read(1))[1] == b"\n"
    if not bad and not redone and ends_clean:
        return
    if redone:
        print(f"{path}: the {len(redone)} step(s) logged after the checkpoint's iter {start} are run again: their "
              f"lines are replaced")
    if bad:
        print(f"warning: {path}: dropped line(s) {', '.join(map(str, bad))}, not JSON records (cut by a kill or a "
              f"full disk?)")
    elif not ends_clean:
        print(f"warning: {path}: its last line ended without a newline; one added")
    records = [(i, r) for i, r in records if i not in redone]
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for _, r in records if r is not None)
    folders.replace_synced([path + ".tmp"], [path])  # the run's whole log: never a name over unwritten data

def eval_logged(out_dir, it, record=None):
    """Whether log.jsonl holds the eval of iter `it`: with `record` (a checkpoint's eval), that very line (record_eval
    logs it whole), so an eval of a model switched at `it` (scorer, θ, block_size) is told from the old one's."""
    line = record and {k: v for k, v in record.items() if k != "is_best"}
    return any(r == line if line else r.get("iter") == it and "val_loss" in r
               for r in read_log(os.path.join(out_dir, "log.jsonl")))

def log(record, cfg, info, model):
    """One record to out_dir/log.jsonl and, with wandb_log, to Weights & Biases."""
    if cfg.wandb_log:  # first: a wandb error leaves no log.jsonl
        wandb_log(record, cfg, info, model)
    with open(os.path.join(cfg.out_dir, "log.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")

def announce(cfg, model, run, tokens_per_iter, data, info=None):
    """A run's first lines: its resolved config, then its size, processes, tokens per iteration and device (data:
    train.py's, for the unigram entropy, an SFT epoch, a dataset without meta.json); then the wandb run starts
    (wandb_log), before train.py touches out_dir: a failed login never costs an old run's files."""
    # break between fields only: each copies back whole
    print("config: " + textwrap.fill(", ".join(f"{k}={v!r}" for k, v in asdict(cfg).items()), 116,
                                     subsequent_indent="  ", break_long_words=False, break_on_hyphens=False))
    epoch = len(data.sft[0]) / (tokens_per_iter / cfg.block_size) if data.sft else None
    sft = data.sft and (f"; SFT examples: {len(data.sft[0]):,} to train, " + (
        "val: the same (sft_val_frac=0)" if data.sft[1] is data.sft[0] else f"{len(data.sft[1]):,} held out for val")
        + "; losses in nats summed over each example's answer, not per token")  # train.batch_loss: the paper's
    print(f"{model.get_num_params() / 1e6:.2f}M parameters, {run.world} process(es), {tokens_per_iter:,} tokens per "
          f"iteration, device {run.device}" + (f"; unigram entropy of train {data.unigram:.4f} nats" if data.unigram
                                               else "") + (f"; {epoch:.1f} iterations per epoch{sft}" if epoch else ""))
    if cfg.resume and not run.resuming:  # a mistyped out_dir would otherwise start afresh unseen
        print(f"resume=True: out_dir={cfg.out_dir!r} holds no ckpt.pt yet, so a new run starts there")
    if data.dir and not os.path.isfile(os.path.join(data.dir, "meta.json")):  # another tool's .bin files
        print(f"warning: {data.dir} has no meta.json: its ids are taken as GPT-2's (a character dataset needs the "
              f"meta.json that prepare_data.py writes)", file=sys.stderr)
    if cfg.wandb_log:
        wandb_log({}, cfg, info, model)

def progress(record, cfg, info, model):
    """A training step's record to log.jsonl (and wandb); every log_interval its progress line."""
    log(record, cfg, info, model)
    if record["iter"] % cfg.log_interval == 0:
        mfu = "n/a" if record["mfu"] is None else f"{record['mfu']:.1%}"
        print(f"iter {record['iter']}: loss {record['loss']:.4f}, lr {record['lr']:.2e}, {record['tokens_per_s']:,.0f} "
              f"tok/s, mfu {mfu}, eta {timedelta(seconds=round(record['eta_s']))}")

PLOT_EVERY_S = 30  # loss.png: redrawn at an eval this long after the run started or was last drawn, and at its end

def record_eval(state, cfg, info, model, save_best, drawn):
    """An eval after ckpt.pt holds it: best.pt (save_best), then its log line, loss.png and its printed line. ckpt.pt
    carries the record, so a resume finishes an eval that a kill cut short (no lost record, no stale best.pt).
    loss.png (0.15-0.3 s a drawing on a CPU) at the run's last eval, and at one PLOT_EVERY_S or more after the run
    started or its last drawing (drawn["at"], the run's own record): a long run's at every eval, a run of seconds'
    once, not for one dot at iter 0."""
    record, now = state["eval"], time.time()
    if record["is_best"]:
        save_best()
    log({k: v for k, v in record.items() if k != "is_best"}, cfg, info, model)  # a line means its checkpoints exist
    if record["iter"] >= cfg.max_iters or now - drawn.get("at", now - record["elapsed"]) >= PLOT_EVERY_S:
        plot_losses(cfg.out_dir, f"{cfg.scorer}, {cfg.task or cfg.sft_data or cfg.dataset}, "
                    f"{model.get_num_params() / 1e6:.1f}M params, git {str(info['git_sha'])[:7]}")
        drawn["at"] = time.time()
    print(f"iter {record['iter']}: train loss {record['train_loss']:.4f}, val loss {record['val_loss']:.4f}"
          + (" (best)" if record["is_best"] else ""))
    return {"train": record["train_loss"], "val": record["val_loss"]}

def plot_losses(out_dir, title):
    """loss.png from log.jsonl (the numbers behind it), the whole history; a resumed run's entry of an iter wins."""
    from matplotlib.figure import Figure  # not pyplot: no GUI backend, no figure to close
    log = read_log(os.path.join(out_dir, "log.jsonl"))
    rows = [r for r in log if "iter" in r]
    ax = Figure(figsize=(8, 4.5)).subplots()
    for key, label in (("loss", "train (per step)"), ("train_loss", "train (eval)"), ("val_loss", "val (eval)")):
        points = {r["iter"]: r[key] for r in rows if key in r}
        ax.plot(sorted(points), [points[k] for k in sorted(points)], "-" if key == "loss" else "o-", ms=3, label=label,
                lw=0.6 if key == "loss" else 1.5)
    for r in (r for r in log if "scorer" in r.get("switch", {})):  # mark scorer switches (not a θ change alone)
        ax.axvline(r["start_iter"], color="gray", ls=":", lw=1, label=f"scorer -> {r['switch']['scorer'][1]}")
    ax.set(xlabel="iteration", ylabel="loss (nats)", title=title)
    ax.legend()
    with folders.whole(os.path.join(out_dir, "loss.png")) as tmp:  # a kill mid-draw left an empty one
        ax.figure.savefig(tmp, format="png", dpi=120, bbox_inches="tight")


# bf16 dense peak FLOP/s by device name, the first key the name contains: the PCIe and NVL cards before "H100" (the
# SXM's "NVIDIA H100 80GB HBM3"), "GH200" before "H200", "A100" before "A10", "L40S" and "L40" before "L4"
PEAK_BF16_FLOPS = {"H100 PCIe": 756e12, "H800 PCIe": 756e12, "H100 NVL": 835e12,
                   "H100": 989e12, "GH200": 989e12, "H200": 989e12, "H800": 989e12, "B200": 2250e12,
                   "A100": 312e12, "A800": 312e12, "L40S": 362e12, "L40": 181e12, "L4": 121e12, "A10G": 125e12,
                   "A10": 125e12, "RTX 4090": 165e12, "RTX 3090": 71e12, "V100": 125e12, "T4": 65e12}

def mfu(model, tokens_per_s, T, device=None):
    """Model FLOPs utilisation against the detected device's bf16 dense peak; None when unknown (CPU)."""
    import torch
    if not torch.cuda.is_available() or (device is not None and torch.device(device).type != "cuda"):
        return None
    name = torch.cuda.get_device_name(device)
    peak = next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)
    return None if peak is None else model.flops_per_token(T) * tokens_per_s / peak

def memory_available():
    """Bytes this process can still allocate: MemAvailable, or less under a cgroup's limit; None off Linux."""
    sizes = []
    with contextlib.suppress(OSError, ValueError):
        sizes += [int(line.split()[1]) * 1024 for line in open("/proc/meminfo") if line.startswith("MemAvailable:")]
    for limit, usage in (("memory.max", "memory.current"), ("memory/memory.limit_in_bytes",
                                                             "memory/memory.usage_in_bytes")):
        with contextlib.suppress(OSError, ValueError):  # "max": no limit
            sizes.append(int(open(f"/sys/fs/cgroup/{limit}").read()) - int(open(f"/sys/fs/cgroup/{usage}").read()))
    return min(sizes, default=None)


# ----------------------------------------------------------------------------------------------------------------
# Weights & Biases: training history, eval tables

def scorer_stats(model):
    """mean, min and max over heads of each layer's learned scorer parameters (s, b, n), fetched in one transfer."""
    import torch
    stats = {}
    with torch.no_grad():  # one attention module per layer, in order
        for layer, attn in enumerate(m for m in model.modules() if hasattr(m, "scorer_params")):
            for name, v in ((k, v.float()) for k, v in attn.scorer_params().items() if v is not None):
                stats.update({f"scorer/layer{layer}/{name}_{s}": f(v) for s, f in
                              (("mean", torch.mean), ("min", torch.min), ("max", torch.max))})
    return dict(zip(stats, torch.stack(list(stats.values())).tolist())) if stats else {}

_run = None  # our own run, never one the caller opened

def wandb_log(record, cfg, info, model):
    """One log.jsonl record to wandb (rank 0). The first call starts the run: the resolved config and run_info as its
    config, its folder in out_dir. A step record (iter, loss, lr, tokens/s, MFU) gains the scorer parameters; an eval
    record (train_loss, val_loss) goes to the same step."""
    global _run
    if _run is None:
        os.makedirs(cfg.out_dir, exist_ok=True)  # wandb's folder is in it
        _run = start(project=cfg.wandb_project, name=cfg.wandb_run_name or os.path.basename(
            os.path.abspath(cfg.out_dir)), dir=cfg.out_dir, config={**asdict(cfg), "run_info": info})
    if "iter" in record:
        scalars = {k: v for k, v in record.items() if k != "iter" and type(v) in (int, float)}  # mfu None on a CPU
        _run.log({**scalars, **(scorer_stats(model) if "loss" in record else {})}, step=record["iter"])

def finish(failed=False):
    """End the training's wandb run, if one was started: an in-process caller's next training starts a new one."""
    global _run
    if _run is not None:
        _run.finish(exit_code=1 if failed else 0)
        _run = None

def log_table(project, name, rows, out_dir=None):
    """An evaluation's rows (a list of flat dicts: eval_long windows, needle/passkey accuracies, tasks.py accuracy by
    length) as the table `name` of a run named `name` (job_type "eval") in `project`; WANDB_MODE=offline works."""
    wandb = import_wandb()
    columns = list(dict.fromkeys(k for r in rows for k in r))  # every key, in first-seen order
    cell = lambda v: None if v == "" else v.item() if hasattr(v, "item") else v if isinstance(
        v, (int, float, str, bool, type(None))) else json.dumps(v)  # numpy scalars; "" = not measured
    with start(project=project, name=name, job_type="eval", dir=out_dir) as run:
        run.log({name: wandb.Table(columns=columns, data=[[cell(r.get(k)) for k in columns] for r in rows])})
