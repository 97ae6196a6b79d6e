"""
Reproduce the three papers' experiments at small scale, end to end (RESULTS.md reports what came out).

    python reproduce.py --scale cpu     # 2 CPU cores, ~2 hours: 4 x 64 model, N = 128, 3 seeds, evaluation to 10 N
    python reproduce.py --scale gpu     # one H100/H200, ~1 GPU hour: 6 x 384, N = 256, 3 seeds, evaluation to 10 N
    python reproduce.py --scale cpu_char --seeds 1337 ... 1346   # characters with copies (#32), 10 seeds: ~5 h
    python reproduce.py --suite synthetic [--quick]   # synthetic.py: tasks x scorers x 5-10 seeds on 2 CPU cores

The language-model suite (lib/lm_suite.py: its scales and variants) trains every variant on the same data and
token budget, once per seed (--seeds), with train.py; then eval_long.py
(RoPE θ x 50: SSMax Fig. 5; Dynamic NTK: LSSAR Table 4), and on the first seed's models needle.py after a short
retrieval fine-tune (Figs. 6-8) and passkey (LSSAR Fig. 3). cpu_char trains on characters whose training windows
repeat a code (train.py's copy_frac), adds the copy gate (eval_copy.py) and the zoo, evaluates to 16 N, and runs
needle, needle scores and passkey in characters on every seed's models, without a fine-tune. Runs live in
out-repro-<name>/s<seed>/, results in out-results/<name>/ (results/<name>/ with --commit-results), each folder
locked while a reproduction writes it. A step whose output exists is skipped when it was made with the settings asked
now (recorded as it starts, started.json, and when done, steps.jsonl), so an interrupted reproduction resumes; a step
made with other settings (another --max_iters, a variant added to its evaluation, the dataset made again, a
config default edited: the splits' sha256 and the resolved config are recorded) refuses in one line, or with --redo
is made again. A step left out by --skip runs not at all: summary.json reads its output only where it was made with
the settings asked now (with --redo an older one is removed) and says which were skipped. On a CPU, --jobs seeds run
at once (one core each).
The runs are scratch: training runs only when an evaluation is missing, and what the report needs of it is kept in
the results (lib/runs.py), so results/<name>/ alone resumes on a new machine (--commit-results gzips its CSVs).
--commit-results (either suite) runs only under a plan committed before it starts, results/<name>/plan.md, and
refuses to write summary.json if the plan changed since the run began (lib/plans.py); summary.json records its commit.
report.py writes summary.json, the numbers RESULTS.md quotes; --rereport DIR writes it again from the per-seed data
results/<name>/ keeps, with today's statistics (lib/rereport.py).
"""
import argparse, gzip, importlib, os, sys
from concurrent.futures import ThreadPoolExecutor

import torch

from lib import compare, dataset, lm_suite, plans, report
from lib.checkpoint import CheckpointError, run_info
from lib.corpora import DataError
from lib.folders import FolderError, held, replace_synced
from lib.lm_suite import PAPERS, SCALES, SWITCH_AT, VARIANTS  # noqa: F401 (the suite's definitions, for a reader)
from lib.runs import ADDED, StepError, Steps, own_folders, read_train_logs
from lib.runs import REPO  # noqa: F401 (where the scripts are)

# ----------------------------------------------------------------------------------------------------------------

def check(a, synthetic):
    """Options the suite would silently ignore, and seeds a suite cannot run twice at once: one error line each."""
    lm_only = [f for f, given in (("--scale", a.scale not in (None, "gpu")), ("--max_iters", a.max_iters),
                                  ("--variants", a.variants), ("--skip", a.skip), ("--texts", a.texts)) if given]
    bad = lm_only if a.suite == "synthetic" else [f for f, given in (("--quick", a.quick), ("--tasks", a.tasks),
                                                                     ("--settings", a.settings)) if given]
    if bad:
        sys.exit(f"error: {', '.join(bad)} {'do' if len(bad) > 1 else 'does'} nothing with --suite {a.suite}: "
                 f"--scale (but gpu), --max_iters, --variants and --skip are the lm suite's; --quick, --tasks and "
                 f"--settings the synthetic suite's")
    if a.suite == "synthetic" and a.scale and a.quick:
        sys.exit("error: --quick with --scale gpu: the quick suite is the CPU's; the GPU scale runs its own tasks")
    if a.jobs is not None and a.jobs < 1:
        sys.exit(f"error: --jobs {a.jobs}: must be >= 1")
    if a.max_iters is not None and a.max_iters < 1:  # else train.py's error, among the steps' lines, after they start
        sys.exit(f"error: --max_iters {a.max_iters}: must be >= 1")
    if a.name is not None and (a.name in ("", ".", "..") or os.sep in a.name or "/" in a.name):
        sys.exit(f"error: --name {a.name!r}: a folder name (no '/'), made under out-results/ (runs: out-repro-<name>/ "
                 "or out-<name>/)")
    for flag, given, allowed in (("--seeds", a.seeds, None), ("--tasks", a.tasks, synthetic and synthetic.SUITE),
                                 ("--settings", a.settings, synthetic and synthetic.SETTINGS)):
        wrong = [str(x) for x in given or [] if (x not in allowed if allowed else not 0 <= x < 2 ** 63)]
        twice = sorted({str(x) for x in given or [] if given.count(x) > 1})
        if wrong or twice:
            sys.exit(f"error: {flag} {' '.join(wrong or twice)}: " + ("given twice; each once" if not wrong else
                     f"unknown; allowed: {', '.join(allowed)}" if allowed else "seeds must be in [0, 2**63)"))


def lm(a):
    """The language-model suite (lib/lm_suite.py): its scale, variants and folders, each locked while it writes."""
    a.scale, a.skip = a.scale or "cpu", a.skip or []
    S = SCALES[a.scale]
    if a.max_iters:  # a copy: SCALES stays what the docs say
        S = {**S, "train": {**S["train"], "max_iters": a.max_iters}}
    if a.scale == "gpu" and not torch.cuda.is_available():
        sys.exit("error: --scale gpu needs CUDA; use --scale cpu here")
    variants = [v for v in S.get("variants", PAPERS) if not a.variants or v in a.variants]
    # softmax: the baseline, and where (e) and (f) start
    if "softmax" not in variants or set(a.variants or []) - set(variants):
        sys.exit(f"error: --variants {' '.join(a.variants)}: they must be {a.scale}'s and include softmax; "
                 f"{a.scale}'s: {' '.join(S.get('variants', PAPERS))}")
    name, a.seeds = a.name or a.scale, a.seeds or [1337, 1338, 1339]
    root, data_dir = f"out-repro-{name}", "data"
    results = os.path.join("results" if a.commit_results else "out-results", name)
    with held(root, "a reproduction's runs"), held(results, "a reproduction's results"):  # one writer each
        own_folders("lm", results, root)
        began = plans.begin(results) if a.commit_results else None  # the rule, committed before the run
        os.makedirs(results, exist_ok=True)
        steps = Steps(results, a.redo, lm_suite.unrecorded_training(results), lm_suite.own_args)
        run_steps(a, S, root, data_dir, steps, variants, began)


# ----------------------------------------------------------------------------------------------------------------
# The language-model suite's call: every seed's steps (lib/lm_suite.py), then summary.json

def run_steps(a, S, root, data_dir, steps, variants, began=None):
    """Every seed's steps, then the first seed's retrieval after fine-tuning, then summary.json from the steps'
    records: what they ran, not what this command asked (the same, unless recorded before settings were); a skipped
    step's output only where made with the same settings (summary.json's `skipped` says). began: the
    plan a --commit-results run began with (lib/plans.py), checked again before summary.json."""
    results = steps.results
    roots = {seed: os.path.join(root, f"s{seed}") for seed in a.seeds}  # every seed's runs: its own folder
    labels = {v: VARIANTS[v][1] for v in variants}
    DATA = S.get("dataset", lm_suite.DATASET)
    dataset.prepare(DATA, out_dir=data_dir)  # a no-op when up to date
    N, data = S["model"]["block_size"], os.path.join(data_dir, DATA)
    common = ["--data", data, "--seed", str(lm_suite.text_seed(a.texts, a.seeds[0]))]  # the first seed's retrieval
    jobs = 1 if S["train"]["device"] != "cpu" else max(1, min(a.jobs, len(roots)))  # one GPU: one at a time
    with ThreadPoolExecutor(jobs) as pool:  # each seed's steps in order; seeds side by side, a core each
        list(pool.map(lambda sr: lm_suite.seed_steps(S, *sr, steps, data, variants, 1 if jobs > 1 else None,
                                                     a.skip, a.texts), roots.items()))
    M, logs = S["train"]["max_iters"], read_train_logs(results, a.seeds)
    kept = kept_losses(results, logs, a.seeds)  # seeds without a log: a folder from before they were kept
    rows = kept if kept and not logs else report.loss_curves(logs, results, labels, int(SWITCH_AT * M), M, kept)
    if "sft" in S:  # else every seed's retrieval ran in seed_steps
        lm_suite.sft_retrieval(S, a.seeds[0], roots[a.seeds[0]], steps, data, variants, common, a.skip)
    if a.scale == "gpu" and "bench" not in a.skip:
        steps.run("kernel benchmark", [os.path.join("bench", "attention.py"), "--out",
                                       os.path.join(results, "kernels")], os.path.join(results, "kernels.png"))
    # not recorded (outputs from before settings records): the training the folder says, never today's splits
    ran = steps.ran("train") or dict({k: v for k, v in (steps.made or lm_suite.trained_with(S, data)).items()
                                      if k not in ADDED}, recorded=False)
    T, plan = ran["train"], {"plan": plans.finish(results, began)} if began else {}
    report.summarize(results, roots, labels, N, rows, list(lm_suite.COPY_RUNS), scale=a.scale, dataset=ran["dataset"],
                     config=ran, tokens_per_variant=T["batch_size"] * ran["model"]["block_size"] * T["max_iters"]
                     * T["gradient_accumulation_steps"],
                     wall_s=round(steps.wall_s(), 1), **steps.wall_notes, texts=a.texts or "shared",
                     skipped=steps.skipped, left_out=steps.left_out, run_info=run_info(),
                     reused_made_at=lm_suite.made_at(steps.reused), unrecorded_training=steps.made, **plan)
    if a.commit_results:
        pack(results, a.seeds)
    print(f"done: {results}/summary.json")


def kept_losses(results, logs, seeds):
    """The rows of a folder's train_loss.csv, as report.loss_curves returns them, of the seeds without a training log
    in `logs` (a folder from before they were kept, or seeds not asked for now): kept, not lost where the file is
    written again; [] without."""
    path = os.path.join(results, "train_loss.csv")
    if not os.path.isfile(path):
        return []
    kept = [dict(r, seed=int(r["seed"]), iter=int(r["iter"]), train_loss=float(r["train_loss"]),
                 val_loss=float(r["val_loss"])) for r in compare.read_csv(path) if int(r["seed"]) not in logs]
    held = sorted({r["seed"] for r in kept})
    lost, other = [s for s in held if s in seeds], [s for s in held if s not in seeds]
    if lost:  # train_loss.png is drawn from the logs alone
        print(f"{path}: the losses of seeds {lost} are the folder's own: no training log of theirs is here"
              + f"; train_loss.png, drawn from seeds {sorted(logs)}' logs, lacks them" * bool(logs), flush=True)
    if other:
        print(f"{path}: the losses of seeds {other}, not asked for now, are kept as they are", flush=True)
    return kept


def pack(results, seeds, keep=("gate/per_position.csv",)):
    """--commit-results: each seed's CSVs gzipped (a tenth of the size; the report reads summary.json files and
    `keep`), so ten seeds' per-sequence losses fit in the repository. Idempotent."""
    for seed in seeds:
        top = os.path.join(results, f"s{seed}")
        for folder, _, files in os.walk(top):
            for name in files:
                path = os.path.join(folder, name)
                if name.endswith(".csv") and os.path.relpath(path, top) not in keep:
                    with open(path, "rb") as f, gzip.open(path + ".gz.tmp", "wb") as g:
                        g.write(f.read())
                    replace_synced([path + ".gz.tmp"], [path + ".gz"])  # before the .csv goes
                    os.remove(path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.error = lambda message: sys.exit(f"error: {message}")  # one line, no usage dump
    p.add_argument("--scale", choices=SCALES, help="lm: the model and budget (default: cpu); synthetic: gpu runs "
                   "its GPU scale (first-gpu, recall-gpu: 4 x 256 at N = 256, to 64 N, 10 seeds)")
    p.add_argument("--max_iters", type=int, help="override the scale's training iterations (report it if you do)")
    p.add_argument("--seeds", type=int, nargs="+", help="training seeds (lm: 1337 1338 1339, retrieval on the "
                   "first seed's models; synthetic: each task's own count, 0, 1, ...)")
    p.add_argument("--name", help="results in out-results/<name>/, runs in out-repro-<name>/ (lm) or out-<name>/ "
                   "(synthetic) (default: the scale, or synthetic[-quick|-gpu])")
    p.add_argument("--commit-results", action="store_true",
                   help="write the committed results/<name>/ (RESULTS.md's numbers) instead of out-results/<name>/; "
                   "needs the run's rule in results/<name>/plan.md, committed before the run starts (lib/plans.py)")
    p.add_argument("--redo", action="store_true", help="run again each step made with other settings than asked "
                   "now (its output is replaced; a skipped step's is removed); without it such a step refuses")
    p.add_argument("--skip", nargs="*", choices=["eval_long", "needle", "passkey", "score", "bench"],
                   help="steps not to run; an output of theirs made with other settings is left out of summary.json "
                   "(with --redo, removed)")
    p.add_argument("--suite", choices=["lm", "synthetic"], default="lm",
                   help="lm: the papers' language-model experiments (--scale); synthetic: synthetic.py's task suite")
    p.add_argument("--quick", action="store_true", help="--suite synthetic: recall x {softmax, ssmax} x 10 seeds "
                   "(~4.5 min on 2 cores)")
    p.add_argument("--texts", choices=["shared", "per_seed"], help="lm: the test texts, the same for every seed "
                   "(shared, the default: texts can be the unit) or drawn per seed (per_seed: distinct texts)")
    p.add_argument("--jobs", type=int, help="runs at once: on a CPU one core each (default 2; lm: seeds); the "
                   "synthetic GPU scale's share the GPU (default 8)")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, help="lm: a subset of the scale's (softmax among them)")
    p.add_argument("--tasks", nargs="+", help="--suite synthetic: a subset of synthetic.SUITE")
    p.add_argument("--settings", nargs="+", help="--suite synthetic: a subset of synthetic.SETTINGS")
    p.add_argument("--rereport", metavar="DIR", help="DIR's summary.json and tables.md again from the per-seed data "
                   "it holds, with this code's statistics (lib/rereport.py); nothing runs")
    a = p.parse_args(argv)
    if a.rereport:
        given = [f"--{k.replace('_', '-') if k == 'commit_results' else k}" for k, v in vars(a).items()
                 if k not in ("rereport", "suite") and v not in (None, False)]
        if given:
            sys.exit(f"error: --rereport takes no other option ({', '.join(given)}): it reads the folder's own data")
        try:
            return importlib.import_module("lib.rereport").rereport(a.rereport)
        except (DataError, FolderError) as e:
            sys.exit(f"error: {e}")
    synthetic = importlib.import_module("lib.synthetic") if a.suite == "synthetic" else None
    check(a, synthetic)
    try:
        if synthetic:
            return synthetic.main(quick=a.quick, jobs=a.jobs, settings=a.settings, task_names=a.tasks, name=a.name,
                                  seeds=a.seeds, commit=a.commit_results, redo=a.redo, scale=a.scale)
        a.jobs = a.jobs or 2
        lm(a)
    except (StepError, FolderError, DataError, CheckpointError) as e:  # CheckpointError: a run's cut ckpt.pt
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
