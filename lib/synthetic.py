"""
The synthetic suite: tasks of tasks.py x scorer settings x training seeds, trained with train.py and evaluated with
eval_tasks.py on CPU (`python reproduce.py --suite synthetic [--quick]`); synthetic_report.py turns the runs into
seed-level statistics (the training seed is the unit), verdicts, tables and figures.

Runs live in out-synthetic[-quick]/<task>-<setting>-s<seed>/, results in out-results/<name>/ (the committed
results/<name>/ with commit=True). A finished step is skipped when it was made with the settings asked now (each run
records its training in its `done` marker and its evaluation in eval_settings.json), so an interrupted suite
resumes; other settings refuse in one line unless redo=True (the run is made again).
"""
import contextlib, json, math, multiprocessing, os, runpy, sys, time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Optional

from lib import config, plans
from lib.folders import held
from lib.runs import StepError, judge, plain

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_OUT = REPO  # output root; tests point it elsewhere
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
DEFAULT_TASKS = ["first", "recall", "recall-rope", "every", "some", "linear"]
# the comparison a quick run can decide (issue #47): recall at 800 iterations, where every one of the full suite's
# 10 seeds differed (p = 2/1024); ~50 s a run, 20 runs on 2 workers ~9 min. FIRST's 6 seeds could not (p >= 2/16)
QUICK = dict(tasks=["recall"], settings=["softmax", "ssmax"], seeds=10)
N_EVAL = 64  # per run, length, condition: seeds are the unit


def overrides(task, setting):
    """train.py's overrides of one run, {log_N} filled in from the task's training length."""
    e = SUITE[task]
    N = config.parse_args([os.path.join(REPO, "configs", "tasks", f"{e.config}.py"), *e.extra])["block_size"]
    return [*e.extra, *(o.format(log_N=math.log(N)) for o in SETTINGS[setting]), *dict(e.recipes).get(setting, ())]


def _one_core():  # one core per worker, `jobs` workers at once
    import torch
    torch.set_num_threads(1)


def _run(script, argv, log):
    """`python <script> argv` in this worker via runpy (torch stays imported); its output to log, its one-line error
    as a StepError (reproduce.py prints it as one line)."""
    path = os.path.join(REPO, script)
    with open(log, "a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        saved, sys.argv = sys.argv, [path, *argv]
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as e:
            if e.code:
                raise StepError(f"{e.code} (log: {log})") from None
        finally:
            sys.argv = saved


def reuse(path, want, what, redo, clear):
    """runs.judge() of the record at `path` (a run's done marker, an evaluation's settings; empty or absent: written
    before settings were recorded)."""
    text = open(path).read() if os.path.isfile(path) else ""
    return judge(json.loads(text) if text.strip() else None, want, what, redo, [clear])


def record(path, settings):
    with open(path + ".tmp", "w") as f:
        json.dump(plain(settings), f)
    os.replace(path + ".tmp", path)


def run_one(task, setting, seed, runs, n_eval, e, over, redo=False):
    """Train (resumable) and evaluate one run in this worker process; e: its SUITE entry, over: its train.py
    overrides. A RESCALED setting evaluates the seed's softmax run (trained before, main's second round). Each step
    is reused only when made with these settings (redo: made again). Returns its wall times."""
    out = os.path.join(runs, f"{task}-{setting}-s{seed}")
    trained = os.path.join(runs, f"{task}-softmax-s{seed}") if setting in RESCALED else out
    log = os.path.join(runs, f"{os.path.basename(out)}.train.log")
    t0, ran = time.time(), False
    train = dict(config=e.config, overrides=[*over, f"seed={seed}"])  # what decides the trained model
    marker = os.path.join(trained, "done")
    if not (os.path.isfile(marker) and reuse(marker, train, f"the run {trained}", redo, trained)):
        ran = True
        _run("train.py", [os.path.join(REPO, "configs", "tasks", f"{e.config}.py"), *train["overrides"],
                           f"out_dir={trained}", "resume=True"], log)
        record(marker, train)
    t1 = time.time()
    N = _block_size(trained)
    args = ["--lengths", *[str(m * N) for m in e.multiples], "--n", str(e.n_eval or n_eval), "--rope", *e.ropes,
            "--diagnose", str(32 if e.diagnose else 0), *(x.format(N=N) for x in RESCALED.get(setting, []))]
    settings, evaluated = os.path.join(out, "eval_settings.json"), os.path.join(out, "eval", "per_prompt.csv")
    if not (os.path.isfile(evaluated) and reuse(settings, dict(train=train, eval=args), f"the evaluation {out}/eval",
                                                redo, os.path.join(out, "eval"))):
        ran = True
        os.makedirs(out, exist_ok=True)
        _run("eval_tasks.py", [os.path.join(trained, "ckpt.pt"), *args, "--out_dir", os.path.join(out, "eval")], log)
        record(settings, dict(train=train, eval=args))
    return dict(task=task, setting=setting, seed=seed, train_s=round(t1 - t0, 1), eval_s=round(time.time() - t1, 1),
                ran=ran)


def _block_size(out):
    with open(os.path.join(out, "log.jsonl")) as f:
        return json.loads(f.readline())["config"]["block_size"]


def plan(task_names, settings=None, seeds=None):
    """[(task, setting, seed)] of the runs: each task's own settings and seed count unless given."""
    own = {t: range(SUITE[t].first_seed, SUITE[t].first_seed + SUITE[t].seeds) for t in task_names}
    return [(t, s, seed) for t in task_names for s in (settings or SUITE[t].settings) if s in SETTINGS
            for seed in (seeds if seeds is not None else own[t])]


def recorded(runs, todo):
    """{"task/setting": the train.py overrides its runs' done markers record}: what was run, not what was asked (the
    same, but where a marker predates the records: such a setting is left out)."""
    out = {}
    for t, s, seed in todo:
        path = os.path.join(runs, f"{t}-{'softmax' if s in RESCALED else s}-s{seed}", "done")
        text = open(path).read().strip() if os.path.isfile(path) else ""
        if text:
            out.setdefault(f"{t}/{s}", [o for o in json.loads(text)["overrides"] if not o.startswith("seed=")])
    return out


def select_lr(rows):
    """The sweep's choice by its committed rule (results/synthetic-lr/plan.md), from its accuracy.csv rows: {task:
    {setting: lr}}. Eligible: the rates whose mean over seeds passes the gate at N (accuracy >= 0.95); among them the
    highest mean at the longest length; none eligible: the highest mean at N. Means are compared to 3 decimals; a tie
    goes to the suite's 3e-3, then to the lower rate."""
    means = {}
    for r in rows:
        task, lr = r["task"].rsplit("-lr", 1)
        if r["condition"] == "" and r["rope"] == "nope":
            key = (task, r["setting"], float(lr), int(r["length"]) // int(r["train_length"]))
            means.setdefault(key, []).append(float(r["accuracy"]))
    mean = {k: round(sum(v) / len(v), 3) for k, v in means.items()}
    out = {}
    for task, setting in sorted({k[:2] for k in mean}):
        top = max(k[3] for k in mean if k[:2] == (task, setting))
        ok = [lr for lr in LRS if mean.get((task, setting, lr, 1), -1) >= 0.95]
        score = lambda lr: mean.get((task, setting, lr, top if ok else 1), -1)  # noqa: E731
        out.setdefault(task, {})[setting] = max(ok or LRS, key=lambda lr: (score(lr), lr == 3e-3, -lr))
    return out


def main(quick=False, jobs=2, n_eval=N_EVAL, settings=None, task_names=None, name=None, seeds=None, commit=False,
         redo=False):
    from lib import synthetic_report  # heavy imports, needed only to report
    # the command as given, subsets and name included, so the report says how to rerun it
    command = " ".join(["python reproduce.py --suite synthetic", *["--quick"] * quick, *(
        f"{flag} {' '.join(map(str, v))}" for flag, v in (("--tasks", task_names), ("--settings", settings),
                                                           ("--seeds", seeds), ("--name", name and [name])) if v),
        *["--commit-results"] * commit])
    name = name or ("synthetic-quick" if quick else "synthetic")
    settings = settings or (QUICK["settings"] if quick else None)
    task_names = task_names or (QUICK["tasks"] if quick else DEFAULT_TASKS)
    seeds = seeds if seeds is not None else range(QUICK["seeds"]) if quick else None
    runs = os.path.join(REPO_OUT, f"out-{name}")
    results = os.path.join(REPO_OUT, "results" if commit else "out-results", name)
    with held(runs, "a synthetic suite's runs"), held(results, "a synthetic suite's results"):  # one writer each
        began = plans.begin(results) if commit else None  # the rule, committed before the run
        os.makedirs(runs, exist_ok=True)
        os.makedirs(results, exist_ok=True)
        suite(runs, results, plan(task_names, settings, seeds), jobs, n_eval, command, task_names, redo,
              synthetic_report, began)
        if any("-lr" in t for t in task_names):  # a sweep: its choice of rate, by the committed rule
            chosen = select_lr(synthetic_report.compare.read_csv(os.path.join(results, "accuracy.csv")))
            record(os.path.join(results, "selected.json"), chosen)
            print(f"selected learning rates: {chosen}")


def suite(runs, results, todo, jobs, n_eval, command, task_names, redo, synthetic_report, began=None):
    """Every run of todo (trained and evaluated unless reused), then the report. wall.json: every call's time up to
    its last run that trained or evaluated (an interrupted call counts too; a re-report adds nothing). began: the
    plan a --commit-results run began with (lib/plans.py), checked again before summary.json."""
    path = os.path.join(runs, "wall.json")
    wall, t0, last = (json.load(open(path))["wall_s"] if os.path.isfile(path) else 0), time.time(), time.time()
    spawn = multiprocessing.get_context("spawn")  # fork would inherit torch's threads
    with ProcessPoolExecutor(jobs, mp_context=spawn, initializer=_one_core) as pool:
        done = 0  # the rescalings read the softmax runs: a second round, once the first has finished
        for round_ in ([x for x in todo if x[1] not in RESCALED], [x for x in todo if x[1] in RESCALED]):
            futures = [pool.submit(run_one, t, s, seed, runs, n_eval, SUITE[t], overrides(t, s), redo)
                       for t, s, seed in round_]
            for f in futures:
                r, done = f.result(), done + 1
                print(f"[{done}/{len(todo)}] {r['task']} {r['setting']} seed {r['seed']}: train {r['train_s']} s, "
                      f"eval {r['eval_s']} s ({time.time() - t0:.0f} s so far)", flush=True)
                with open(os.path.join(results, "steps.jsonl"), "a") as log:
                    log.write(json.dumps(r) + "\n")
                if r["ran"]:
                    wall, last = wall + time.time() - last, time.time()
                    with open(path, "w") as f:
                        json.dump({"wall_s": round(wall)}, f)
    setup = dict(command=command, wall_s=round(wall), jobs=jobs, n_eval=n_eval,
                 settings={s: SETTINGS[s] for s in dict.fromkeys(s for _, s, _ in todo)}, ran=recorded(runs, todo),
                 tasks={t: dict(config=SUITE[t].config, extra=SUITE[t].extra, multiples=SUITE[t].multiples,
                                seeds=sorted({seed for tt, _, seed in todo if tt == t}),
                                n_eval=SUITE[t].n_eval or n_eval) for t in task_names})
    if began:
        setup["plan"] = plans.finish(results, began)
    synthetic_report.report(runs, results, todo, setup)
    print(f"done in {wall / 60:.1f} min: {results}/summary.json, tables.md, horizons.png, accuracy.png")
