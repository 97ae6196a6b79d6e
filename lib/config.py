"""
The training config: one dataclass, TrainConfig (the run's fields below, GPTConfig's model fields and tasks.TaskConfig's
task fields, with their defaults), set by Python config files and key=value overrides (train.py's command line):

    python train.py configs/cpu_quick.py scorer=ssmax max_iters=2e3

A config file is run (runpy) and its lowercase names are the fields it sets; an override's value is a Python literal
or, for a string field, the text as is. Every value is coerced to its field's type and checked against RANGES: an
unknown key, a wrong type or a value out of range is one TrainError line, never a traceback.
"""
import ast, difflib, math, os, runpy, textwrap, types
from dataclasses import dataclass, field, fields, make_dataclass, replace
from typing import get_args

import tasks
from lib import longrange
from lib.checkpoint import CheckpointError, check_task, loaded_inits, saved_config
from model import GPTConfig, ssmax_s_for_switch
from scorers import SCORERS

# ----------------------------------------------------------------------------------------------------------------
# Config: defaults are the paper's 162M recipe

@dataclass
class _TrainFields:
    out_dir: str = "out"
    overwrite: bool = False  # may replace out_dir's run; else refused
    init_from: str = "scratch"  # scratch | resume | a ckpt path (new optimizer)
    resume: bool = False  # relaunch-safe: resume ckpt.pt if it exists
    eval_interval: int = 1000
    eval_iters: int = 50  # batches per split at each eval
    log_interval: int = 10
    data_dir: str = "data"
    dataset: str = "shakespeare"  # embedded corpora are prepared on demand; NAME_char: in characters
    copy_frac: float = 0.0  # share of training windows that repeat a span of their own text (longrange.py)
    copy_span: int = 32  # the repeated span's length, in tokens
    copy_kind: str = "text"  # text: a span of the window; random: tokens drawn from it (a code only a copy predicts)
    sft_data: str = ""  # .jsonl of {"prompt", "answer"}
    sft_epochs: int = 0  # > 0: schedule in epochs (sft.sft_schedule)
    sft_val_frac: float = 0.05  # SFT examples held out (seeded) for the val loss; 0: val is the training examples
    batch_size: int = 16  # micro-batch; ~2.1M tokens a step
    gradient_accumulation_steps: int = 128  # global: split across DDP ranks
    learning_rate: float = 6e-4
    max_iters: int = 200_000  # ~419B tokens
    weight_decay: float = 0.1  # matrices only
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0: off
    lr_schedule: str = "constant"  # after warmup: constant (the paper) | cosine
    warmup_iters: int = 1000
    lr_decay_iters: int = 200_000
    min_lr: float = 6e-5
    device: str = "auto"  # auto: cuda if available
    compile: bool = False
    allow_slow: bool = False  # run past CPU_LIMIT_HOURS on a CPU
    seed: int = 1337
    wandb_log: bool = False  # rank 0; WANDB_MODE=offline works
    wandb_project: str = "nanoscorer"
    wandb_run_name: str = ""  # "": out_dir's name


TrainConfig = make_dataclass("TrainConfig", [(f.name, f.type, field(default=f.default))
                                             for f in fields(GPTConfig) + fields(tasks.TaskConfig)],
                             bases=(_TrainFields,))
MODEL_FIELDS = [f.name for f in fields(GPTConfig)]
SCORER_OPTIONS = list(dict.fromkeys(f for e in SCORERS.values() for prm in e.params for f in prm.fields()))
OWN_OPTIONS = (*SCORER_OPTIONS, "fgate_bias_init")  # a scorer's own: a switch resets them, a resume keeps them
# what a resume or init_from may change; every other model field is the checkpoint's architecture, which cannot (a
# field added to GPTConfig is one unless listed here: never changed under a checkpoint without a word)
CHANGEABLE = ("block_size", "dropout", "rope_theta", "backend", "scorer", *OWN_OPTIONS)
ARCH_FIELDS = tuple(f for f in MODEL_FIELDS if f not in CHANGEABLE)
LR_SCHEDULES = ("constant", "cosine")
# checked in coerce(): a bad value is one error line
RANGES = {**dict.fromkeys(("batch_size", "gradient_accumulation_steps", "eval_interval", "eval_iters", "log_interval",
                           "n_layer", "n_head", "n_embd", "ffn_hidden", "vocab_size", "block_size", "rope_theta",
                           "ssa_b_init", "copy_span"), ("> 0", lambda v: v > 0)),
          **dict.fromkeys(("max_iters", "warmup_iters", "lr_decay_iters", "weight_decay", "grad_clip", "sft_epochs"),
                          (">= 0", lambda v: v >= 0)),
          **dict.fromkeys(("learning_rate", "min_lr"), (">= 0 and <= 1e30 (more overflows AdamW's float32 step)",
                                                        lambda v: 0 <= v <= 1e30)),
          "seed": ("in [0, 2**63)", lambda v: 0 <= v < 2 ** 63),  # torch's and numpy's generators both take it
          **dict.fromkeys(("out_dir", "dataset"), ("a folder name, not empty", lambda v: v.strip() != "")),
          "norm_eps": ("> 0", lambda v: v > 0), "lr_schedule": (f"one of {LR_SCHEDULES}", lambda v: v in LR_SCHEDULES),
          **dict.fromkeys(("dropout", "beta1", "beta2", "sft_val_frac"), ("in [0, 1)", lambda v: 0 <= v < 1)),
          "copy_frac": ("in [0, 1]", lambda v: 0 <= v <= 1)}


class TrainError(Exception):
    """Bad input or a failed run: main prints it as one line."""


def coerce(key, value, where, raw=None):
    """value as field key's type, or one clear error; raw: an override's text, taken as is by a string field."""
    names = TrainConfig.__dataclass_fields__
    if key not in names:
        close = difflib.get_close_matches(key, names, 1)
        raise TrainError(f"unknown config key {key!r} in {where}" + (f" (did you mean {close[0]!r}?)" if close
                         else "") + "; the keys are the fields of TrainConfig (config.py) and GPTConfig")
    typ = names[key].type
    base = next((t for t in get_args(typ) if t is not type(None)), typ)  # Optional[float] -> float
    if value is None and typ is not base:
        return None
    if base is str and raw is not None:
        value = value if isinstance(value, str) else raw  # dataset=kjv, out_dir=123
    if base is float and type(value) in (int, float):
        value = float(value)
    if base is int and type(value) is float and value.is_integer():
        value = int(value)  # max_iters=2e5
    if type(value) is not base:
        raise TrainError(f"{key}={value!r} has the wrong type: {key} is {base.__name__}"
                         + " or None" * (typ is not base))
    if base is float and not math.isfinite(value):  # nan, inf: no field takes them
        raise TrainError(f"{key}={value!r} is not a finite number: {key} must be finite")
    allowed, ok = RANGES.get(key, (None, lambda v: True))
    if not ok(value):  # also refuses nan
        raise TrainError(f"{key}={value!r} is out of range: {key} must be {allowed}")
    return value


def run_config(path, seen=()):
    """A config file's assignments. `base = "softmax.py"` (a file beside it) is applied first, so a config that
    shares a recipe sets only what differs; the base's overwrite=True not where the file names an out_dir of its own."""
    try:
        assigned = runpy.run_path(path)
    except Exception as e:
        raise TrainError(f"config file {path}: {type(e).__name__}: {e}")
    base = assigned.pop("base", None)
    if base is None:
        return assigned
    base_path = os.path.join(os.path.dirname(path), str(base))
    if not (isinstance(base, str) and base.endswith(".py") and os.path.isfile(base_path)) or base_path in seen:
        why = ("leads back to it" if base_path in seen else "is not a .py file" if not str(base).endswith(".py")
               else f"is no such file in {os.path.dirname(path) or '.'}")
        raise TrainError(f"config file {path}: base={base!r} must name another config file (.py) in its folder; "
                         f"this one {why}")
    inherited = run_config(base_path, (*seen, path))  # its overwrite=True covers its own out_dir, never the child's
    return {**{k: v for k, v in inherited.items() if k != "overwrite" or "out_dir" not in assigned}, **assigned}


def parse_args(argv):
    """CONFIG.py files and key=value overrides -> {field: value} of what they set, applied in order (a file never
    after a key=value it sets). A config file's
    overwrite=True applies only to the out_dir that file names (`out-quick` and `./out-quick` are one):
    `configs/cpu_quick.py out_dir=<another trained run>` is refused, and so is a file that names none."""
    explicit, own_dir, typed = {}, None, set()  # own_dir: where a file's overwrite=True applies; typed: key=value's
    for arg in argv:
        if "=" in arg:
            key, raw = arg.removeprefix("--").split("=", 1)
            try:
                value = ast.literal_eval(raw)
            except (ValueError, SyntaxError):  # nan, inf: floats, refused by coerce as such
                value = float(raw) if raw.strip().lower().lstrip("+-") in ("nan", "inf", "infinity") else raw
            explicit[key], typed = coerce(key, value, "the overrides", raw), typed | {key}
            own_dir = None if key == "overwrite" else own_dir  # from the command line: any out_dir
        elif arg.endswith(".py") and os.path.isfile(arg):
            assigned = run_config(arg)
            if typed & set(assigned):  # it would replace them without a word
                raise TrainError(f"{arg} comes after {', '.join(f'{k}=' for k in sorted(typed & set(assigned)))}, "
                                 f"which it sets too: put config files first, then key=value")
            for key, value in assigned.items():
                if not (key.startswith("_") or key.isupper() or isinstance(value, types.ModuleType) or callable(value)):
                    explicit[key] = coerce(key, value, arg)
            if "overwrite" in assigned:  # "": names no out_dir, so overwrites none (never a valid out_dir)
                own_dir = assigned.get("out_dir", "")
        else:
            raise TrainError(f"argument {arg!r} is neither an existing config file (.py) nor key=value")
    same = lambda a, b: os.path.realpath(str(a)) == os.path.realpath(str(b))  # one folder however spelled
    if own_dir is not None and not (own_dir and same(explicit.get("out_dir", _TrainFields.out_dir), own_dir)):
        explicit.pop("overwrite")
    return explicit


# ----------------------------------------------------------------------------------------------------------------
# Resolution: the config, once the checkpoint is known

def unread(cfg, explicit):
    """TrainError for an option this command sets that the run would not read (recorded as if it ran): SFT's schedule
    without sft_data, or its epochs beside the iterations they set; a dataset beside sft_data; copy_* with copy_frac
    unset; RoPE's base with pos=nope. (A task's options: tasks.check_config; a scorer's: scorers.check_options.)"""
    why = {k: "sft_epochs sets it, in epochs" for k in ("max_iters", "warmup_iters", "lr_decay_iters")
           if cfg.sft_epochs}
    why.update({k: "no sft_data" for k in ("sft_epochs", "sft_val_frac") if not cfg.sft_data})
    why.update({k: "SFT trains on sft_data; it records its checkpoint's dataset" for k in ("dataset", "data_dir")
                if cfg.sft_data})
    why.update({k: "no copy_frac" for k in ("copy_span", "copy_kind")  # a copy run's resume reads them
                if not cfg.copy_frac and "copy_frac" not in explicit})
    why.update({k: "pos='nope' has no RoPE" for k in ("rope_theta", "rope_scaling") if cfg.pos == "nope"})
    set_unread = [k for k in why if k in explicit]
    if set_unread:
        raise TrainError(", ".join(f"{k}={explicit[k]!r}" for k in set_unread) + f": not read by this run ("
                         f"{'; '.join(dict.fromkeys(why[k] for k in set_unread))}), so it would be recorded, not run")


def resolve(cfg, explicit, ckpt, resuming, world):
    """A resume: the run's stored config, then what this command sets; init_from: the checkpoint's model fields unless
    this command sets them; then the checks across fields, and a task's vocabulary (tasks.py) as the model's."""
    if resuming:  # in the folder it resumes from, wherever the run was first written
        cfg = TrainConfig(**{**{k: v for k, v in saved_config(ckpt).items() if hasattr(cfg, k)}, **explicit,
                             "out_dir": cfg.out_dir})
    elif ckpt is not None:  # block_size too
        cfg = replace(cfg, **{k: v for k, v in ckpt["model_args"].items() if k in MODEL_FIELDS and k not in explicit})
    if cfg.sft_data and not resuming:  # it trains on sft_data: it records its model's dataset (the evals' --data)
        held = (ckpt or {}).get("config") or {}
        cfg = replace(cfg, dataset=held.get("dataset", ""), data_dir=held.get("data_dir", _TrainFields.data_dir))
    unread(cfg, explicit)
    if cfg.gradient_accumulation_steps % world:  # each process runs an equal share (lr_schedule: coerce() checks it)
        raise TrainError(f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} (global) does not split "
                         f"evenly among {world} processes: set a multiple of {world} (or use fewer processes)")
    if cfg.lr_schedule == "cosine" and cfg.lr_decay_iters < cfg.warmup_iters and not cfg.sft_epochs:  # SFT sets both
        raise TrainError(f"lr_decay_iters={cfg.lr_decay_iters} is below warmup_iters={cfg.warmup_iters}: cosine would "
                         f"drop to min_lr a step after warmup; need lr_decay_iters >= warmup_iters (the decay's end)")
    try:
        longrange.check_config(cfg)
        tasks.check_config(cfg)  # a task's options; with no task, none of them set
    except ValueError as e:
        raise TrainError(str(e))
    if cfg.task:
        size = tasks.TASKS[cfg.task].vocab(cfg)
        if explicit.get("vocab_size", size) != size:
            raise TrainError(f"vocab_size={cfg.vocab_size} does not match task {cfg.task!r}, whose vocabulary is "
                             f"{size}")
        cfg = replace(cfg, vocab_size=size)
        if cfg.block_size < tasks.min_length(cfg):
            raise TrainError(f"block_size={cfg.block_size} is too short for task {cfg.task!r}: at least "
                             f"{tasks.min_length(cfg)}")
    return cfg


def model_config(cfg, explicit, ckpt, resuming):
    """The model's GPTConfig fields: the checkpoint's, with what this command may change (its scorer, θ, block_size,
    dropout...), or one TrainError; and what it changes ({field: [old, new]} of CHANGEABLE's, or {}; a scorer
    switch when it holds "scorer")."""
    model_args, switch = {k: getattr(cfg, k) for k in MODEL_FIELDS}, {}
    if ckpt is not None:
        src = ckpt["model_args"]
        try:
            check_task(cfg.task, cfg.vocab_size, ckpt)
        except CheckpointError as e:
            raise TrainError(str(e))
        model_args = {**src, **{k: v for k, v in explicit.items() if k in MODEL_FIELDS}}
        switched = model_args["scorer"] != src["scorer"]
        # same scorer: a resume keeps its trained s, b, n; init_from loads them over a new init
        kept = () if switched else OWN_OPTIONS if resuming else loaded_inits(ckpt)
        for k in ARCH_FIELDS + kept:
            if model_args[k] != src[k]:
                why = ("when resuming" if resuming else "(a different architecture)") if k in ARCH_FIELDS else (
                    "when resuming with the same scorer" if resuming else "from a checkpoint of the same scorer: a new "
                    "init would not apply (its trained weights load over it); train from scratch or switch the scorer")
                raise TrainError(f"{k}={model_args[k]!r} differs from the checkpoint's {src[k]!r}: it cannot change "
                                 f"{why}")
        if switched:  # old scorer's options don't apply
            model_args.update({k: getattr(GPTConfig, k) for k in OWN_OPTIONS if k not in explicit})
            if model_args["scorer"] == "ssmax" and "ssmax_s_init" not in explicit:
                model_args["ssmax_s_init"] = ssmax_s_for_switch(src["block_size"])  # the paper's s0 (variants e, f)
        # every change the checkpoint's weights did not train with (θ, block_size...): recorded, not only a switch;
        # not the backend, which computes the same attention
        switch = {k: [src[k], model_args[k]] for k in CHANGEABLE if k != "backend" and model_args[k] != src[k]}
        done, goal = ckpt["iter_num"], ckpt.get("config", {}).get("max_iters", math.inf)
        if new_val_loss(switch) and resuming and done >= goal and not explicit.get("overwrite"):  # keep a finished run
            what = ", ".join(f"{k}={model_args[k]!r}" for k in switch if k in explicit and new_val_loss([k]))
            raise TrainError(f"{what} would change the finished {src['scorer']} run in out_dir={cfg.out_dir!r} (iter "
                             f"{done} of max_iters={goal}) and replace its best.pt by a model of another val loss: "
                             f"run the new setting in another out_dir with init_from=<its ckpt.pt>, or overwrite=True")
    try:
        GPTConfig(**model_args)
    except ValueError as e:
        raise TrainError(str(e))
    except TypeError as e:  # a field this model.py lacks (a checkpoint of another version or branch)
        raise TrainError(f"the checkpoint's model does not fit this model.py: {e}")
    return model_args, switch


def new_val_loss(switch):
    """Whether model_config's switch makes the val loss another quantity (a resume then starts its own best.pt and is
    evaluated first, as a scorer switch is): the scorer, its options, θ and block_size do; dropout does not (eval runs
    without it), nor the backend (the same attention)."""
    return any(k not in ("dropout", "backend") for k in switch)


def changed_from(ckpt, switch):
    """What the weights trained with differently from the model they now build ({field: [trained, now]}, a
    checkpoint's "changed"): the source checkpoint's own (kept across resumes; older ones lack it) composed with this
    command's switch, the oldest trained value with the newest; a field changed back to its trained value drops."""
    chain = dict((ckpt or {}).get("changed") or {})
    for k, (old, new) in switch.items():
        chain[k] = [chain.get(k, [old])[0], new]
    return {k: v for k, v in chain.items() if v[0] != v[1]}


def switch_text(switch, iter_num):
    """train.py's line of what this command changed from its checkpoint (the weights trained at the old values)."""
    what = "scorer switch" if "scorer" in switch else "changed from the checkpoint"
    return f"{what} at iter {iter_num}: " + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in switch.items())


def usage(doc):
    """train.py's --help: its docstring, the command line and every config field with its default."""
    fields_text = ", ".join(f"{f.name}={f.default!r}" for f in fields(TrainConfig))
    return (doc.strip() + "\n\nusage: python train.py [CONFIG.py ...] [key=value ...]\nconfig fields (defaults): "
            + textwrap.fill(fields_text, 116, subsequent_indent="  "))
