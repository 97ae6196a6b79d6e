"""
What the synthetic suite runs (synthetic.py runs it): the scorer settings as train.py overrides, the training-free
rescalings, the suite's entries (a task config, its overrides, test lengths, seeds and settings), the learning-rate
sweep with its committed selection rule, the GPU scale, and the quick suite.
"""
import math, os
from dataclasses import asdict, dataclass
from typing import Optional

from lib import config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, "configs", "tasks")  # the SUITE entries' config files
SETTINGS = {  # train.py overrides; {log_N}: log of training length
    "softmax": ["scorer=softmax"],
    "ssmax": ["scorer=ssmax"],
    "ssmax-fixed-s": ["scorer=ssmax", "ssmax_learn_s=False"],  # s = 1: logits times log n (Chiang & Cholak's fix)
    "ssa": ["scorer=ssa"],
    "lssa": ["scorer=lssa"],
    "lssar": ["scorer=lssar"],
    "sigmoid": ["scorer=sigmoid"],
    # controls: SSMax's scale at N without growth in n ...
    "softmax-logN": ["scorer=ssmax", "ssmax_learn_s=False", "ssmax_s_init=0.0", "ssmax_bias=True",
                     "ssmax_b_init={log_N}", "ssmax_learn_b=False"],
    # ... s below and above 1 (a threshold: Chen et al. 2025) ...
    "ssmax-s0.5": ["scorer=ssmax", "ssmax_learn_s=False", "ssmax_s_init=0.5"],
    "ssmax-s2": ["scorer=ssmax", "ssmax_learn_s=False", "ssmax_s_init=2.0"],
    # ... no weight decay: it shrinks softmax's Q, K, not s
    "softmax-wd0": ["scorer=softmax", "weight_decay=0.0"],
    "ssmax-wd0": ["scorer=ssmax", "weight_decay=0.0"],
    "softmax-p3": ["scorer=softmax", "reweight_p=3.0"],  # LSSAR's re-weighting (only via --settings)
    # the zoo: later answers to fading, each on NoPE as its paper (the tasks' default)
    "softpick": ["scorer=softpick"],
    "stickbreaking": ["scorer=stickbreaking"],
    "fox": ["scorer=fox"],
}
# training-free rescalings of each seed's softmax run: evaluated, not trained (eval_tasks.py's flags; {N}: N)
RESCALED = {"softmax-qwen": ["--logit_scale", "qwen"], "softmax-yarn": ["--logit_scale", "yarn"],
            "softmax-llama4": ["--logit_scale", "llama4", "--llama4_floor", "{N}"],
            # constant temperatures: the scale without its growth in n, not trained (first-control)
            "softmax-x2": ["--logit_scale", "2"], "softmax-x3": ["--logit_scale", "3"]}
SETTINGS.update(dict.fromkeys(RESCALED, SETTINGS["softmax"]))
CORE = ["softmax", "ssmax", "ssmax-fixed-s", "ssa", "lssa", "lssar"]
CONTROLS = ["sigmoid", "softmax-logN", "ssmax-s0.5", "ssmax-s2", "softmax-wd0", "ssmax-wd0"]
ZOO = ["softpick", "stickbreaking", "fox"]
RESCALINGS = ["softmax-qwen", "softmax-yarn", "softmax-llama4"]  # the published ones
LONG, SHORT = (1, 2, 4, 8, 16, 32, 64, 128), (1, 2, 4, 8, 16)  # test lengths L / N


@dataclass(frozen=True)
class Entry:
    config: str  # configs/tasks/<config>.py
    extra: tuple = ()  # train.py overrides
    multiples: tuple = SHORT
    ropes: tuple = ("plain",)  # RoPE evaluations (NoPE models ignore them)
    diagnose: bool = False  # attention diagnostics (attention.csv)
    seeds: int = 5
    settings: tuple = ("softmax", "ssmax")
    n_eval: Optional[int] = None  # prompts per length and condition (None: the suite's, N_EVAL)
    first_seed: int = 0  # seeds first_seed, ..., first_seed + seeds - 1
    recipes: tuple = ()  # (setting, train.py overrides) pairs: a setting's own recipe on this entry


SUITE = {
    "first": Entry("first", (), LONG, diagnose=True, seeds=10, settings=tuple(CORE + CONTROLS + ZOO + RESCALINGS)),
    # LSSAR misses recall's gate at N at this budget
    # sigmoid makes no length claim: FIRST only, for time
    "recall": Entry("recall", (), LONG, diagnose=True, seeds=10, settings=tuple(
        s for s in CORE + CONTROLS + ZOO + RESCALINGS if s not in ("lssar", "sigmoid"))),
    "recall-rope": Entry("recall", ("pos=rope",), ropes=("plain", "theta", "dynamic_ntk")),
    # the SSA paper's tasks, against softmax
    "every": Entry("every", diagnose=True, settings=("softmax", "ssa")),
    "some": Entry("some", diagnose=True, settings=("softmax", "ssa")),
    "linear": Entry("linear", (), (1, 2, 4, 8), settings=("softmax", "ssa")),
    # outside the default suite (--tasks): no verdict
    "recall-noise": Entry("recall", ("task_filler=noise",), diagnose=True, seeds=3, settings=("softmax", "ssmax")),
    "flipflop": Entry("flipflop", seeds=3, settings=("softmax", "ssmax")),  # not Liu et al.'s 512-token setup
    # recall with 4x the iterations: stick-breaking and FoX were still learning at 800 (--tasks recall-long); ssmax,
    # qwen and the constant log N added after softmax itself held longer at 4x (RESULTS.md): is it the budget?
    "recall-long": Entry("recall", ("max_iters=3200", "lr_decay_iters=3200", "eval_interval=1600"), LONG, seeds=10,
                         settings=("softmax", "stickbreaking", "fox", "ssmax", "softmax-qwen", "softmax-logN")),
    # FIRST with 4x the iterations: is its verdict the budget too? (--tasks first-long; RESULTS.md)
    "first-long": Entry("first", ("max_iters=6000", "lr_decay_iters=6000", "eval_interval=3000"), LONG, seeds=10,
                        settings=("softmax", "ssmax", "softmax-logN")),
    # the ceiling-free control (issue #47; results/synthetic-first-control/plan.md): growth in n or the scale? FIRST
    # to 1,024 N, where SSMax s = 1 and Qwen's log n sat at 1.000 up to 128 N; 32 prompts a length: 1,024 N costs
    # 68 s a run
    "first-control": Entry("first", (), (*LONG, 256, 512, 1024), seeds=20, n_eval=32, settings=(
        "softmax", "softmax-logN", "ssmax-fixed-s", "softmax-x2", "softmax-x3", "softmax-qwen")),
}
# The recipe or the scorer? (issue #47 item 5; results/synthetic-lr/plan.md) Every setting that missed a gate or came
# out below softmax in results/synthetic, and softmax itself, at half a decade either side of the suite's lr 3e-3
# (min_lr = lr / 10, as the task configs), 5 seeds each: first-lr0.001, ..., recall-lr0.01
LRS = (1e-3, 3e-3, 1e-2)
SWEPT = {"first": ("softmax", "ssa", "softpick", "fox"),
         "recall": ("softmax", "ssa", "softpick", "stickbreaking", "fox")}


def recipe(lr):
    return f"learning_rate={lr:g}", f"min_lr={lr / 10:g}"


SUITE.update({f"{t}-lr{lr:g}": Entry(t, recipe(lr), LONG, seeds=5, settings=s) for t, s in SWEPT.items()
              for lr in LRS})
# Stage 2 (results/synthetic-tuned/plan.md): each swept setting at the rate stage 1's rule chose
# (results/synthetic-lr/selected.json; tests check it against select_lr of that run's accuracy.csv), on 10 fresh
# seeds, 10-19: the verdicts, against softmax at its own chosen rate
TUNED = {"first": {"softmax": 1e-2, "ssa": 1e-3, "softpick": 1e-3, "fox": 3e-3},
         "recall": {"softmax": 3e-3, "ssa": 3e-3, "softpick": 3e-3, "stickbreaking": 3e-3, "fox": 3e-3}}
SUITE.update({f"{t}-tuned": Entry(t, (), LONG, seeds=10, first_seed=10, settings=SWEPT[t], recipes=tuple(
    (s, recipe(lr)) for s, lr in TUNED[t].items())) for t in SWEPT})

# The suite at GPU scale (issue #47 item 7; `reproduce.py --suite synthetic --scale gpu`, results/synthetic-gpu/):
# FIRST and recall with 4 layers x 4 heads x 256 wide at N = 256, to 64 N, 10 seeds; bf16 training, fp32
# evaluation, GPU["jobs"] runs side by side on the one GPU. Budgets and rate: provisional until a GPU pilot
# (bench/gpu.sh synthetic-pilot) shows every setting passing the gate at N
GPU_MODEL = ("device=cuda", "n_layer=4", "n_head=4", "n_embd=256", "ffn_hidden=768", "block_size=256",
             "batch_size=32", "learning_rate=1e-3", "min_lr=1e-4", "warmup_iters=100", "max_iters=1500",
             "lr_decay_iters=1500", "eval_interval=1500")
GPU_SETTINGS = ("softmax", "ssmax", "softmax-logN", "softmax-qwen")
SUITE.update({f"{t}-gpu": Entry(t, GPU_MODEL, LONG[:7], seeds=10, settings=GPU_SETTINGS)
              for t in ("first", "recall")})
# recall's budget is the pilot's to find (a CPU run of recall-gpu: 0.094 at N): a ladder of (batch, iterations), each
# an entry, trained on seed 0 by the pilot; select_budget picks one by the plan's rule before the 10 seeds run. A
# 4x batch costs little wall time where 8 small runs share the GPU (launch-bound), and gives 4x the queried pairs
LADDER = ((32, 1500), (32, 4000), (128, 1500), (128, 4000))
BUDGET_KEYS = ("batch_size", "max_iters", "lr_decay_iters", "eval_interval")


def budget(batch, iters):
    return (*(o for o in GPU_MODEL if o.split("=")[0] not in BUDGET_KEYS), f"batch_size={batch}",
            f"max_iters={iters}", f"lr_decay_iters={iters}", f"eval_interval={iters}")


RUNGS = {"recall-gpu" if (b, i) == LADDER[0] else f"recall-gpu-b{b}-i{i}": (b, i) for b, i in LADDER}
SUITE.update({t: Entry("recall", budget(*r), LONG[:7], seeds=10, settings=GPU_SETTINGS) for t, r in RUNGS.items()
              if t != "recall-gpu"})
GPU = dict(tasks=["first-gpu", "recall-gpu"], pilot=["first-gpu", *RUNGS], jobs=8)
DEFAULT_TASKS = ["first", "recall", "recall-rope", "every", "some", "linear"]
# the comparison a quick run can decide (issue #47): recall at 800 iterations, where every one of the full suite's
# 10 seeds differed (p = 2/1024); ~25 s a run, 20 runs on 2 workers 4.4 min. FIRST's 6 seeds could not (p >= 2/16)
QUICK = dict(tasks=["recall"], settings=["softmax", "ssmax"], seeds=10)
N_EVAL = 64  # per run, length, condition: seeds are the unit


def config_file(name):
    return os.path.join(CONFIGS, f"{name}.py")  # a path without .py names a file elsewhere


def values(name, over):
    """What config file `name` (None: none, as the lm suite's runs) and train.py's overrides resolve to now (train.py's
    fields but where it writes): a file or a default edited since a run trained changes them, where the record of
    names and overrides alone does not."""
    explicit = config.parse_args(([] if name is None else [config_file(name)]) + list(over))
    cfg = asdict(config.resolve(config.TrainConfig(**explicit), explicit, None, False, 1))
    return {k: v for k, v in cfg.items() if k not in ("out_dir", "overwrite", "resume", "init_from")}


def overrides(task, setting):
    """train.py's overrides of one run, {log_N} filled in from the task's training length."""
    e = SUITE[task]
    N = config.parse_args([config_file(e.config), *e.extra])["block_size"]
    own = "softmax" if setting in RESCALED else setting  # a rescaling evaluates the softmax run: its recipe too
    return [*e.extra, *(o.format(log_N=math.log(N)) for o in SETTINGS[setting]), *dict(e.recipes).get(own, ())]


def plan(task_names, settings=None, seeds=None):
    """[(task, setting, seed)] of the runs: each task's own settings and seed count unless given."""
    own = {t: range(SUITE[t].first_seed, SUITE[t].first_seed + SUITE[t].seeds) for t in task_names}
    return [(t, s, seed) for t in task_names for s in (settings or SUITE[t].settings) if s in SETTINGS
            for seed in (seeds if seeds is not None else own[t])]


def accuracy_cells(rows):
    """{(task, setting, L/N): [each seed's accuracy]} of accuracy.csv rows: the NoPE evaluation, no condition."""
    out = {}
    for r in rows:
        if r["condition"] == "" and r["rope"] == "nope":
            key = (r["task"], r["setting"], int(r["length"]) // int(r["train_length"]))
            out.setdefault(key, []).append(float(r["accuracy"]))
    return out


def sweep_accuracy(rows):
    """{(task, setting, lr, L/N): [each seed's accuracy]} of a sweep's accuracy.csv rows (tasks <task>-lr<rate>)."""
    return {(t.rsplit("-lr", 1)[0], s, float(t.rsplit("-lr", 1)[1]), m): v
            for (t, s, m), v in accuracy_cells(rows).items()}


def select_budget(rows, steps):
    """The GPU pilot's choice of recall's rung by its committed rule (results/synthetic-gpu/plan.md), from its
    accuracy.csv rows and steps.jsonl records: eligible, a rung where every one of its settings passes the gate at N
    (accuracy >= 0.95, mean over the pilot's seeds; a setting without rows fails); among them the least training
    time (its runs' train_s summed), then the fewest tokens. None: no rung passes (recall is not testable at this
    scale within the ladder)."""
    at_n = {(t, s): v for (t, s, m), v in accuracy_cells(rows).items() if t in RUNGS and m == 1}
    passes = lambda t, s: (t, s) in at_n and sum(at_n[t, s]) / len(at_n[t, s]) >= 0.95  # noqa: E731
    ok = [t for t in RUNGS if all(passes(t, s) for s in SUITE[t].settings)]  # a setting with no rows has not passed
    runs = {}  # a run's training time: its longest record (before log.jsonl gave it, a reused run's was ~0 s)
    for x in steps:
        key = x["task"], x["setting"], x["seed"]
        runs[key] = max(runs.get(key, 0), x["train_s"])
    train_s = lambda t: sum(v for k, v in runs.items() if k[0] == t)  # noqa: E731
    return min(ok, key=lambda t: (train_s(t), RUNGS[t][0] * RUNGS[t][1]), default=None)


def select_lr(rows):
    """The sweep's choice by its committed rule (results/synthetic-lr/plan.md), from its accuracy.csv rows: {task:
    {setting: lr}}. Eligible: the rates whose mean over seeds passes the gate at N (accuracy >= 0.95); among them the
    highest mean at the longest length; none eligible: the highest mean at N. Means are compared to 3 decimals; a tie
    goes to the suite's 3e-3, then to the lower rate."""
    mean = {k: round(sum(v) / len(v), 3) for k, v in sweep_accuracy(rows).items()}
    out = {}
    for task, setting in sorted({k[:2] for k in mean}):
        top = max(k[3] for k in mean if k[:2] == (task, setting))
        ok = [lr for lr in LRS if mean.get((task, setting, lr, 1), -1) >= 0.95]
        score = lambda lr: mean.get((task, setting, lr, top if ok else 1), -1)  # noqa: E731
        out.setdefault(task, {})[setting] = max(ok or LRS, key=lambda lr: (score(lr), lr == 3e-3, -lr))
    return out
