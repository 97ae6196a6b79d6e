"""
The synthetic suite: tasks of tasks.py x scorer settings x training seeds (synthetic_suite.py: what runs), trained
with train.py and evaluated with eval_tasks.py, on CPU cores or, at the GPU scale, side by side on one GPU
(`python reproduce.py --suite synthetic [--quick | --scale gpu]`); synthetic_report.py turns the runs into
seed-level statistics (the training seed is the unit), verdicts, tables and figures.

Runs live in out-synthetic[-quick]/<task>-<setting>-s<seed>/, results in out-results/<name>/ (the committed
results/<name>/ with commit=True). A finished step is skipped when it was made with the settings asked now (each run
records its training in its `done` marker and its evaluation in eval_settings.json), so an interrupted suite
resumes; other settings refuse in one line unless redo=True (the run is made again). Reuse ignores the code: each
run's steps.jsonl line names the commits that trained and evaluated it (made_at, from their run_info), summary.json
counts them, and a call reusing runs of other code says so in one line.
"""
import contextlib, ctypes, json, multiprocessing, os, runpy, signal, sys, time
from concurrent.futures import ProcessPoolExecutor

from lib import plans, tracking
from lib.checkpoint import run_info
from lib.folders import held, write_json
from lib.provenance import code
from lib.report import read_json
from lib.runs import StepError, judge, own_folders, plain, remove
from lib.synthetic_suite import (  # noqa: F401 (the suite's definitions, for a reader and the tests)
    CONTROLS, CORE, DEFAULT_TASKS, GPU, LONG, LRS, N_EVAL, QUICK, REPO, RESCALED, RESCALINGS, SETTINGS, SHORT, SUITE,
    RUNGS, SWEPT, ZOO, Entry, config_file, overrides, plan, recipe, select_budget, select_lr, sweep_accuracy, values)

REPO_OUT = REPO  # output root; tests point it elsewhere


def _die_with_parent():
    """Linux: this worker is killed when the suite's process dies (kill -9 too): else it finished its queued runs and
    then waited forever, holding its run folder's lock."""
    parent = multiprocessing.parent_process()
    if parent is None:  # not a worker (a test calls _one_core in its own process)
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if not parent.is_alive():  # it died before the line above
        os._exit(1)


def _stop(pool):
    """Stop the pool now (Ctrl-C, a failed run): a worker whose run was interrupted took the next queued one, and the
    suite exited only after it (35 s later, its time in no wall.json)."""
    workers = list((pool._processes or {}).values())  # the executor has no public kill before Python 3.14
    pool.shutdown(wait=False, cancel_futures=True)  # the queued runs first: cancelled, never started
    for process in workers:
        process.terminate()
    for process in workers:
        process.join()


def _one_core():  # one core per worker, `jobs` workers at once
    _die_with_parent()
    import torch
    torch.set_num_threads(1)
    # what train.py and eval_tasks.py import, and CUDA, start here, not in a worker's first run's time
    import kernels_cpu, model, tasks  # noqa: F401
    from lib import checkpoint, config, dataset, retrieval, rescale, tracking, vocab  # noqa: F401
    if torch.cuda.is_available():
        torch.cuda.init()


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
                raise StepError(f"{str(e.code).removeprefix('error: ')} (log: {log})") from None  # one "error: "
        finally:
            sys.argv = saved


def reuse(path, want, what, redo, clear, whole=True, trained=None):
    """runs.judge() of the record at `path` (a run's done marker, an evaluation's settings; empty or absent: written
    before settings were recorded, taken as it is where whole, else other settings). A record from before the config's
    values were recorded is judged by the values the trained run's log says it ran with; a field added since, which
    no earlier run could set, is taken at the value asked now (a new option's default keeps the old behaviour; a run
    may not read it at all, as a task run does not read sft_val_frac, ADDED_FIELDS' one field)."""
    old = json.loads(open(path).read() or "null") if os.path.isfile(path) else None
    rec, values = old.get("train", old) if isinstance(old, dict) else None, want.get("train", want)["values"]
    if isinstance(rec, dict) and "values" not in rec and trained and os.path.isfile(os.path.join(trained, "log.jsonl")):
        rec["values"] = logged(train_log(trained))  # a marker, or an evaluation's record's training
    if isinstance(rec, dict) and isinstance(rec.get("values"), dict):
        rec["values"] = {k: rec["values"].get(k, v) for k, v in values.items()}
    return judge(old, want, what, redo, [clear], whole)


def train_log(trained):
    """The records of a trained run's log.jsonl (tracking.read_log), which logged and trained_s read."""
    return tracking.read_log(os.path.join(trained, "log.jsonl"))


def logged(records):
    """The config a run's log.jsonl says it started with."""
    return plain(records[0]["config"])


def trained_s(records):
    """A run's whole training in seconds, from its log.jsonl: each train.py call's last elapsed, summed. A resumed
    call counts from 0 again; the steps a kill cut off after the checkpoint left the log (run again)."""
    total = last = 0.0
    for r in records:
        if "config" in r:  # a call's first line
            total, last = total + last, 0.0
        last = max(last, r.get("elapsed", 0.0))
    return round(total + last, 1)


def made_with(records, evaluated=None):
    """The code that made a run: {"train": each train.py call's (log.jsonl's headers; a resume may add one), "eval":
    eval_tasks.py's (its settings.json)}, None where a record predates run_info; evaluated None: trained only."""
    made = dict(train=list(dict.fromkeys(code(r.get("run_info")) for r in records if "config" in r)))
    if evaluated is not None:
        made["eval"] = code((read_json(evaluated, "settings.json") or {}).get("run_info"))
    return made


def record(path, settings):
    write_json(path, plain(settings))


def run_one(task, setting, seed, runs, n_eval, e, over, redo=False, evaluate=True):
    """Train (resumable) and evaluate one run in this worker process; e: its SUITE entry, over: its train.py
    overrides. A RESCALED setting evaluates the seed's softmax run (trained before, main's second round). Each step
    is reused only when made with these settings (redo: made again); each records them before it starts, so an
    output cut short between the two is judged too. evaluate=False: train only. Returns its times: train_s the whole
    training's (the budget pilot's, select_budget), not this call's, which saw only the end of a resumed run."""
    out = os.path.join(runs, f"{task}-{setting}-s{seed}")
    trained = os.path.join(runs, f"{task}-softmax-s{seed}") if setting in RESCALED else out
    log = os.path.join(runs, f"{os.path.basename(out)}.train.log")
    ran = False
    train = dict(config=e.config, overrides=[*over, f"seed={seed}"])  # what decides the trained model
    train["values"] = plain(values(e.config, train["overrides"]))
    marker, started = os.path.join(trained, "done"), os.path.join(trained, "train_settings.json")
    if os.path.isfile(marker):
        reused = reuse(marker, train, f"the run {trained}", redo, trained, trained=trained)
    else:  # a run cut short resumes only with the settings it started with (none recorded: other settings)
        reused = False
        if os.path.isfile(os.path.join(trained, "ckpt.pt")) or os.path.isfile(os.path.join(trained, "log.jsonl")):
            reuse(started, train, f"the unfinished run {trained}", redo, trained, whole=False, trained=trained)
    if not reused:
        ran = True
        os.makedirs(trained, exist_ok=True)
        record(started, train)
        _run("train.py", [config_file(e.config), *train["overrides"],
                           f"out_dir={trained}", "resume=True"], log)
        record(marker, train)
    records = train_log(trained)  # read once: the training's time and its config
    t1, train_s = time.time(), 0.0 if setting in RESCALED else trained_s(records)  # a rescaling trains nothing
    if not evaluate:
        return dict(task=task, setting="softmax", seed=seed, train_s=train_s, eval_s=0.0, ran=ran,
                    made_at=made_with(records))
    N = logged(records)["block_size"]
    args = ["--lengths", *[str(m * N) for m in e.multiples], "--n", str(e.n_eval or n_eval), "--rope", *e.ropes,
            "--diagnose", str(32 if e.diagnose else 0), *(x.format(N=N) for x in RESCALED.get(setting, []))]
    settings, evaluated = os.path.join(out, "eval_settings.json"), os.path.join(out, "eval", "per_prompt.csv")
    legacy = not open(marker).read().strip()  # a run from before records: its evaluation had none either (as lm's)
    if not (os.path.isfile(evaluated) and reuse(settings, dict(train=train, eval=args), f"the evaluation {out}/eval",
                                                redo, os.path.join(out, "eval"), whole=legacy, trained=trained)):
        ran = True
        os.makedirs(out, exist_ok=True)
        record(settings, dict(train=train, eval=args))  # before: an evaluation cut short is judged by it
        _run("eval_tasks.py", [os.path.join(trained, "ckpt.pt"), *args, "--out_dir", os.path.join(out, "eval")], log)
    return dict(task=task, setting=setting, seed=seed, train_s=train_s, eval_s=round(time.time() - t1, 1), ran=ran,
                made_at=made_with(records, os.path.join(out, "eval")))


def made_at(made, runs):
    """{commit: the runs made (trained or evaluated) at it} (made: each run's made_with()), and a line where any was
    made by other code than this call's (a scorer edited since): reuse judges settings, never the code."""
    made = [list(dict.fromkeys([*m["train"], m["eval"]])) for m in made]  # in order: a set's varies by run
    counts = {c or "unknown": sum(c in m for m in made) for c in dict.fromkeys(c for m in made for c in m)}
    now = code(run_info())
    other = [m for m in made if set(m) - {now}]
    if other:
        print(f"note: {len(other)} of {len(made)} runs were reused from other code than this call's ({now}): made at "
              + ", ".join(f"{c} ({n})" for c, n in counts.items() if c != now) + "; to make them with this code "
              f"remove their folders in {runs} or use another --name (--redo makes again only runs of other settings)")
    return counts


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


def main(quick=False, jobs=None, n_eval=N_EVAL, settings=None, task_names=None, name=None, seeds=None, commit=False,
         redo=False, scale=None):
    from lib import synthetic_report  # heavy imports, needed only to report
    # the command as given, subsets and name included, so the report says how to rerun it
    command = " ".join(["python reproduce.py --suite synthetic", *["--quick"] * quick,
                        *[f"--scale {scale}"] * bool(scale), *(
        f"{flag} {' '.join(map(str, v))}" for flag, v in (("--tasks", task_names), ("--settings", settings),
                                                           ("--seeds", seeds), ("--name", name and [name])) if v),
        *["--commit-results"] * commit])
    name = name or ("synthetic-quick" if quick else "synthetic-gpu" if scale else "synthetic")
    settings = settings or (QUICK["settings"] if quick else None)
    task_names = task_names or (QUICK["tasks"] if quick else GPU["tasks"] if scale else DEFAULT_TASKS)
    jobs = jobs or (GPU["jobs"] if scale else 2)
    if any("device=cuda" in SUITE[t].extra for t in task_names):
        import torch
        if not torch.cuda.is_available():
            raise StepError(f"--tasks {' '.join(task_names)}: the GPU scale trains on CUDA, and this machine has "
                            "none; the CPU suite is --suite synthetic without --scale")
    seeds = seeds if seeds is not None else range(QUICK["seeds"]) if quick else None
    runs = os.path.join(REPO_OUT, f"out-{name}")
    results = os.path.join(REPO_OUT, "results" if commit else "out-results", name)
    with held(runs, "a synthetic suite's runs"), held(results, "a synthetic suite's results"):  # one writer each
        own_folders("synthetic", results, runs)
        began = plans.begin(results) if commit else None  # the rule, committed before the run
        os.makedirs(runs, exist_ok=True)
        os.makedirs(results, exist_ok=True)
        suite(runs, results, plan(task_names, settings, seeds), jobs, n_eval, command, task_names, redo,
              synthetic_report, began)
        sweep, ladder = any("-lr" in t for t in task_names), sum(t in RUNGS for t in task_names) > 1
        # an earlier call's choice, not of these runs
        remove(*(os.path.join(results, name) for name in [*["selected.json", "sweep.png"] * (not sweep),
                                                          *["selected_budget.json"] * (not ladder)]))
        if sweep:  # its choice of rate, by the committed rule
            rows = synthetic_report.compare.read_csv(os.path.join(results, "accuracy.csv"))
            chosen = select_lr(rows)
            record(os.path.join(results, "selected.json"), chosen)
            synthetic_report.synthetic_figures.sweep(sweep_accuracy(rows), chosen, os.path.join(results, "sweep.png"))
            print(f"selected learning rates: {chosen}")
        if ladder:  # the GPU pilot's: recall's budget, by the committed rule
            rows = synthetic_report.compare.read_csv(os.path.join(results, "accuracy.csv"))
            steps = [json.loads(line) for line in open(os.path.join(results, "steps.jsonl"))]
            rung = select_budget(rows, steps)
            record(os.path.join(results, "selected_budget.json"), dict(task=rung, batch_iters=RUNGS.get(rung)))
            print(f"selected recall budget: {rung or 'none passes the gate at N'}"
                  + (f" (batch, iterations {RUNGS[rung]}): bash bench/gpu.sh synthetic --tasks first-gpu {rung}"
                     if rung else ""))


def suite(runs, results, todo, jobs, n_eval, command, task_names, redo, synthetic_report, began=None):
    """Every run of todo (trained and evaluated unless reused), then the report. wall.json: every call's time up to
    its last run that trained or evaluated (an interrupted call counts too; a re-report adds nothing). began: the
    plan a --commit-results run began with (lib/plans.py), checked again before summary.json."""
    path = os.path.join(runs, "wall.json")
    wall, t0, last = (json.load(open(path))["wall_s"] if os.path.isfile(path) else 0), time.time(), time.time()
    made = []  # each reported run's made_with()
    spawn = multiprocessing.get_context("spawn")  # fork would inherit torch's threads
    with ProcessPoolExecutor(jobs, mp_context=spawn, initializer=_one_core) as pool:
        done = 0  # the rescalings read the softmax runs: a second round, once the first has finished
        first = [(x, True) for x in todo if x[1] not in RESCALED]
        # a rescaled seed whose softmax run is not asked is trained (only) in the first round, once: not by each of
        # its rescalings in the second, where two workers would write one run
        need = dict.fromkeys((t, "softmax", seed) for t, s, seed in todo if s in RESCALED)
        first += [(x, False) for x in need if x not in todo]
        for round_ in (first, [(x, True) for x in todo if x[1] in RESCALED]):
            futures = [pool.submit(run_one, t, s, seed, runs, n_eval, SUITE[t], overrides(t, s), redo, evaluate)
                       for (t, s, seed), evaluate in round_]
            for f, (_, evaluate) in zip(futures, round_):
                try:
                    r, done = f.result(), done + evaluate
                except BaseException:  # stop now: queued runs would otherwise all run before the error shows
                    _stop(pool)
                    raise
                print(f"[{done}/{len(todo)}] {r['task']} {r['setting']} seed {r['seed']}: train {r['train_s']} s, "
                      + (f"eval {r['eval_s']} s" if evaluate else "for its rescalings") +
                      f" ({time.time() - t0:.0f} s so far)", flush=True)
                made += [r["made_at"]] * evaluate
                with open(os.path.join(results, "steps.jsonl"), "a") as log:
                    log.write(json.dumps(r) + "\n")
                if r["ran"]:
                    wall, last = wall + time.time() - last, time.time()
                    write_json(path, {"wall_s": round(wall)})
    setup = dict(command=command, wall_s=round(wall), jobs=jobs, n_eval=n_eval,
                 settings={s: SETTINGS[s] for s in dict.fromkeys(s for _, s, _ in todo)}, ran=recorded(runs, todo),
                 tasks={t: dict(config=SUITE[t].config, extra=SUITE[t].extra, multiples=SUITE[t].multiples,
                                seeds=sorted({seed for tt, _, seed in todo if tt == t}),
                                n_eval=SUITE[t].n_eval or n_eval) for t in task_names},
                 made_at=made_at(made, runs))
    if began:
        setup["plan"] = plans.finish(results, began)
    synthetic_report.report(runs, results, todo, setup)
    print(f"done: this call {time.time() - t0:.0f} s, the runs of every call {wall / 60:.1f} min (wall.json): "
          f"{results}/summary.json, tables.md, horizons.png, accuracy.png")  # a rerun reusing all said "1.1 min"
