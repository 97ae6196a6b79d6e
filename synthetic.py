"""
The synthetic suite: every task of tasks.py x every scorer setting x 3 seeds, trained with train.py and evaluated
with eval_tasks.py up to 16 N, on 2 CPU cores (`python reproduce.py --suite synthetic [--quick]`).

Runs live in out-synthetic[-quick]/<task>-<setting>-s<seed>/ (checkpoints, the eval's CSVs); results in
results/synthetic[-quick]/: accuracy.csv (every run x length x condition), attention.csv, summary.json (the gate,
means over seeds with their spread, pooled 95% Wilson intervals, differences to softmax with Newcombe intervals) and
the figures. A finished step is skipped, so an interrupted suite continues where it stopped.
"""
import csv, json, math, os, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import eval_tasks
import tasks

REPO = os.path.dirname(os.path.abspath(__file__))
REPO_OUT = REPO  # where out-synthetic*/ and results/synthetic*/ go (the tests point it elsewhere)
SETTINGS = {  # the scorer settings compared: train.py overrides
    "softmax": ["scorer=softmax"],
    "ssmax": ["scorer=ssmax"],
    "ssmax-fixed-s": ["scorer=ssmax", "ssmax_learn_s=False"],  # s = 1: logits times log n (Chiang & Cholak's fix)
    "ssa": ["scorer=ssa"],
    "lssa": ["scorer=lssa"],
    "lssar": ["scorer=lssar"],
    "softmax-p3": ["scorer=softmax", "reweight_p=3.0"],  # LSSAR's re-weighting on softmax (run with --settings)
}
DEFAULT_SETTINGS = ["softmax", "ssmax", "ssmax-fixed-s", "ssa", "lssa", "lssar"]
DEFAULT_TASKS = ["first", "recall", "recall-rope", "flipflop", "every", "some", "linear"]
MULTIPLES = (1, 2, 4, 8, 16)  # test lengths L / N
SUITE = {  # name -> (config file, extra overrides, L / N multiples, RoPE evaluations, attention diagnostics)
    "first": ("first", [], MULTIPLES, ["plain"], True),
    "recall": ("recall", [], MULTIPLES, ["plain"], True),
    "recall-rope": ("recall", ["pos=rope"], MULTIPLES, ["plain", "theta", "dynamic_ntk"], False),
    "recall-noise": ("recall", ["task_filler=noise"], MULTIPLES, ["plain"], True),  # the first design: noise filler
    "flipflop": ("flipflop", [], MULTIPLES, ["plain"], False),
    "every": ("every", [], MULTIPLES, ["plain"], True),
    "some": ("some", [], MULTIPLES, ["plain"], True),
    "linear": ("linear", [], (1, 2, 4), ["plain"], False),
}
QUICK = dict(tasks=["first", "recall"], settings=["softmax", "ssmax", "lssa"])
SEEDS = (0, 1, 2)
COLORS = dict(zip(SETTINGS, ["black", "tab:red", "tab:orange", "tab:blue", "tab:green", "tab:purple", "tab:gray"]))
GATE = dict(accuracy=0.95, mse=0.1)  # at L = N (default condition, plain RoPE), every setting, mean over seeds


def run_one(task, setting, seed, runs, n_eval):
    """Train (resumable) and evaluate one run; returns its wall times."""
    config, extra, multiples, ropes, diag = SUITE[task]
    out = os.path.join(runs, f"{task}-{setting}-s{seed}")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one core a run, two runs at once
    t0, ran = time.time(), False
    if not os.path.isfile(os.path.join(out, "done")):
        ran = True
        with open(os.path.join(runs, f"{os.path.basename(out)}.train.log"), "w") as log:
            subprocess.run([sys.executable, os.path.join(REPO, "train.py"), os.path.join(REPO, "configs", "tasks",
                            f"{config}.py"), *extra, *SETTINGS[setting], f"seed={seed}", f"out_dir={out}",
                            "resume=True"], check=True, env=env, stdout=log, stderr=subprocess.STDOUT)
        open(os.path.join(out, "done"), "w").close()
    t1 = time.time()
    if not os.path.isfile(os.path.join(out, "eval", "accuracy.csv")):
        ran, N = True, _block_size(out)
        subprocess.run([sys.executable, os.path.join(REPO, "eval_tasks.py"), os.path.join(out, "ckpt.pt"),
                        "--lengths", *[str(m * N) for m in multiples], "--n", str(n_eval), "--out_dir",
                        os.path.join(out, "eval"), "--rope", *ropes, "--diagnose", str(32 if diag else 0)],
                       check=True, env=env, stdout=subprocess.DEVNULL)
    return dict(task=task, setting=setting, seed=seed, train_s=round(t1 - t0, 1), eval_s=round(time.time() - t1, 1),
                ran=ran)


def _block_size(out):
    with open(os.path.join(out, "log.jsonl")) as f:
        return json.loads(f.readline())["config"]["block_size"]


# ----------------------------------------------------------------------------------------------------------------
# Gathering: one accuracy.csv and attention.csv, the gate, means over seeds, differences to softmax


def gather(runs, names):
    """Every run's eval CSVs in one list each; the task column names the suite task (recall-rope, not recall)."""
    acc, att = [], []
    for name in names:
        task = max((t for t in SUITE if name.startswith(t + "-")), key=len)  # recall-rope-..., not recall
        for file, rows in (("accuracy.csv", acc), ("attention.csv", att)):
            path = os.path.join(runs, name, "eval", file)
            if os.path.isfile(path):
                rows += [{**r, "task": task} for r in csv.DictReader(open(path))]
    return acc, att


def newcombe(p1, l1, u1, p2, l2, u2):
    """95% interval of p1 - p2 from the two Wilson intervals (Newcombe 1998, method 10; unpaired: conservative)."""
    d = p1 - p2
    return d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


def summarize(acc):
    """{task: {"gate": ..., "cells": [one per setting x condition x rope x length]}}: the mean over seeds, their
    spread, the pooled Wilson interval (all seeds' sequences), and the difference to softmax with its interval."""
    groups = {}
    for r in acc:
        key = (r["task"], r["condition"], r["rope"], int(r["length"]) // int(r["train_length"]), r["scorer"])
        groups.setdefault(key, []).append(r)
    cells = {}
    for (task, cond, rope, mult, setting), rows in groups.items():
        mse = rows[0]["mse"] != ""
        vals = np.array([float(r["mse" if mse else "accuracy"]) for r in rows])
        c = dict(task=task, condition=cond, rope=rope, multiple=mult, setting=setting, seeds=len(rows),
                 per_seed=vals.round(4).tolist(), mean=float(vals.mean()), sd=float(vals.std(ddof=1)) if len(vals) > 1
                 else 0.0, metric="mse" if mse else "accuracy")
        if mse:  # the mean of the seeds' means, its interval from theirs
            se = math.sqrt(sum(((float(r["ci_high"]) - float(r["ci_low"])) / 3.92) ** 2 for r in rows)) / len(rows)
            c["ci"] = [c["mean"] - 1.96 * se, c["mean"] + 1.96 * se]
        else:
            n = sum(int(r["n"]) for r in rows)
            c["ci"] = list(eval_tasks.wilson(sum(float(r["accuracy"]) * int(r["n"]) for r in rows), n))
            c["loss_per_seed"] = [round(float(r["loss"]), 5) for r in rows]  # the answer's loss, nats
            c["loss"] = float(np.mean(c["loss_per_seed"]))
        cells[(task, cond, rope, mult, setting)] = c
    for (task, cond, rope, mult, setting), c in cells.items():
        base = cells.get((task, cond, rope, mult, "softmax"))
        if base and setting != "softmax" and c["metric"] == "accuracy":
            c["diff_vs_softmax"] = c["mean"] - base["mean"]
            c["diff_ci"] = list(newcombe(c["mean"], *c["ci"], base["mean"], *base["ci"]))
    out = {}
    for c in cells.values():
        out.setdefault(c["task"], {"cells": []})["cells"].append(c)
    for task, t in out.items():
        first_cond = tasks.TASKS[SUITE[task][0]].conditions[0][0]
        at_n = [c for c in t["cells"] if c["multiple"] == 1 and c["condition"] == first_cond and c["rope"] in
                ("plain", "nope")]
        ok = {c["setting"]: (c["mean"] <= GATE["mse"] if c["metric"] == "mse" else c["mean"] >= GATE["accuracy"])
              for c in at_n}
        t["gate"] = dict(rule=f"every setting's mean over seeds at L = N: accuracy >= {GATE['accuracy']} "
                              f"(MSE <= {GATE['mse']} for linear); a comparison with softmax counts only if both "
                              f"settings pass", passed=all(ok.values()),
                         failed=sorted(k for k, v in ok.items() if not v))
        for c in t["cells"]:
            if "diff_vs_softmax" in c:
                c["counts"] = ok.get(c["setting"], False) and ok.get("softmax", False)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Figures: accuracy (or MSE) vs L / N with 95% bands; what the attention does as n grows

PANELS = [("first", "", "nope"), ("recall", "", "nope"), ("recall-noise", "", "nope"), ("recall-rope", "", "plain"),
          ("recall-rope", "", "dynamic_ntk"), ("flipflop", "sparse p_i=0.98", "plain"),
          ("flipflop", "dense p_i=0.1", "plain"), ("every", "sigma=10", "nope"), ("some", "sigma=10", "nope"),
          ("linear", "sigma=1", "plain"), ("linear", "sigma=4", "plain")]


def plot_accuracy(summary, path, settings, loss=False):
    """Accuracy (MSE for linear) with the pooled 95% Wilson band; or, loss=True, the answer's loss in nats with the
    seeds' range as the band (it shows confidence fading before the argmax flips)."""
    from matplotlib.figure import Figure
    panels = [p for p in PANELS if p[0] in summary and (not loss or p[0] != "linear")]
    cols = min(5, len(panels))
    fig = Figure(figsize=(3.4 * cols, 3.0 * math.ceil(len(panels) / cols)), layout="constrained")
    axes = fig.subplots(math.ceil(len(panels) / cols), cols, squeeze=False).ravel()
    for ax, (task, cond, rope) in zip(axes, panels):
        for s in settings:
            cs = sorted((c for c in summary[task]["cells"] if (c["setting"], c["condition"], c["rope"]) ==
                         (s, cond, rope)), key=lambda c: c["multiple"])
            if not cs:
                continue
            x = [c["multiple"] for c in cs]
            y, lo, hi = (([c["loss"] for c in cs], [min(c["loss_per_seed"]) for c in cs], [max(c["loss_per_seed"])
                          for c in cs]) if loss else ([c["mean"] for c in cs], [c["ci"][0] for c in cs],
                                                     [c["ci"][1] for c in cs]))
            ax.plot(x, y, "o-", ms=3, color=COLORS[s], label=s, lw=1.2)
            ax.fill_between(x, lo, hi, color=COLORS[s], alpha=0.15, lw=0)
        mse = any(c["metric"] == "mse" for c in summary[task]["cells"])
        ax.set(xscale="log", yscale="log" if mse or loss else "linear", xlabel="test length / train length N",
               ylabel="answer loss (nats)" if loss else "MSE (eq. 2)" if mse else "accuracy",
               title=" ".join(filter(None, [task, cond, "" if rope in ("nope", "plain") else rope,
                                            "(NoPE)" if rope == "nope" else ""])))
        ax.set_xticks([1, 2, 4, 8, 16], ["1", "2", "4", "8", "16"])
        if not (mse or loss):
            ax.set_ylim(-0.02, 1.02)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    axes[0].legend(fontsize=7, loc="lower left")
    fig.suptitle("The final answer's loss vs length (mean of the seeds; band: their range)" if loss else
                 "Accuracy vs length (mean of the seeds; band: pooled 95% Wilson interval)", fontsize=10)
    fig.savefig(path, dpi=110)


def plot_attention(att, path, settings):
    """Per task with diagnostics: the retrieval head's (the head with most target mass at N) mass on the target and
    its entropy vs L / N, mean over seeds; uniform attention (1 / L) for reference. And ssmax's learned s."""
    from matplotlib.figure import Figure
    task_names = [t for t in ("first", "recall", "recall-noise", "every", "some") if any(r["task"] == t for r in att)]
    fig = Figure(figsize=(3.6 * len(task_names), 6.0), layout="constrained")
    axes = fig.subplots(2, len(task_names), squeeze=False)
    for j, task in enumerate(task_names):
        for s in settings:
            rows = [r for r in att if r["task"] == task and r["scorer"] == s]
            if not rows:
                continue
            by_run = {}
            for r in rows:
                by_run.setdefault(r["model"], []).append(r)
            mass, ent, lengths = [], [], sorted({int(r["length"]) for r in rows})
            for run_rows in by_run.values():  # the head with the most target mass at the shortest length
                short = [r for r in run_rows if int(r["length"]) == lengths[0]]
                best = max(short, key=lambda r: float(r["target_mass"]))
                head = [r for r in run_rows if (r["layer"], r["head"]) == (best["layer"], best["head"])]
                head.sort(key=lambda r: int(r["length"]))
                mass.append([float(r["target_mass"]) for r in head])
                ent.append([float(r["entropy"]) for r in head])
            x = [L / lengths[0] for L in lengths]
            axes[0, j].plot(x, np.mean(mass, 0), "o-", ms=3, color=COLORS[s], label=s)
            axes[1, j].plot(x, np.mean(ent, 0), "o-", ms=3, color=COLORS[s], label=s)
        x = [L / lengths[0] for L in lengths]
        axes[0, j].plot(x, [1 / L for L in lengths], ":", color="gray", label="uniform 1/L")
        axes[1, j].plot(x, [math.log(L) for L in lengths], ":", color="gray", label="uniform: log L")
        axes[0, j].set(xscale="log", yscale="log", title=f"{task}: best head's mass on target", xlabel="L / N")
        axes[1, j].set(xscale="log", title=f"{task}: its entropy (nats)", xlabel="L / N")
    axes[0, 0].legend(fontsize=7)
    fig.savefig(path, dpi=110)


def main(quick=False, jobs=2, n_eval=100, settings=None, task_names=None, name=None):
    name = name or ("synthetic-quick" if quick else "synthetic")
    settings = settings or (QUICK["settings"] if quick else DEFAULT_SETTINGS)
    task_names = task_names or (QUICK["tasks"] if quick else DEFAULT_TASKS)
    runs, results = os.path.join(REPO_OUT, f"out-{name}"), os.path.join(REPO_OUT, "results", name)
    os.makedirs(runs, exist_ok=True)
    os.makedirs(results, exist_ok=True)
    todo = [(t, s, seed) for t in task_names for s in settings for seed in SEEDS]
    t0, ran = time.time(), False
    with ThreadPoolExecutor(jobs) as pool:  # each run is a process on one core
        futures = [pool.submit(run_one, *job, runs, n_eval) for job in todo]
        for i, f in enumerate(futures):
            r = f.result()
            ran |= r["ran"]
            print(f"[{i + 1}/{len(todo)}] {r['task']} {r['setting']} seed {r['seed']}: train {r['train_s']} s, eval "
                  f"{r['eval_s']} s ({time.time() - t0:.0f} s so far)", flush=True)
            with open(os.path.join(results, "steps.jsonl"), "a") as log:
                log.write(json.dumps(r) + "\n")
    acc, att = gather(runs, [f"{t}-{s}-s{seed}" for t, s, seed in todo])
    eval_tasks.write_csv(os.path.join(results, "accuracy.csv"), acc)
    if att:
        eval_tasks.write_csv(os.path.join(results, "attention.csv"), att)
    summary, path = summarize(acc), os.path.join(results, "summary.json")
    wall = time.time() - t0
    if not ran and os.path.isfile(path):  # only re-reported: the wall time is the run's that trained
        wall = json.load(open(path))["wall_s"]
    with open(path, "w") as f:
        json.dump(dict(command="python reproduce.py --suite synthetic" + (" --quick" if quick else ""),
                       wall_s=round(wall), jobs=jobs, n_eval=n_eval, seeds=SEEDS,
                       settings={s: SETTINGS[s] for s in settings},
                       tasks={t: SUITE[t][:2] for t in task_names}, run_info=_run_info(), tasks_summary=summary),
                  f, indent=1)
    with open(os.path.join(results, "tables.md"), "w") as f:
        f.write(tables(summary))
    plot_accuracy(summary, os.path.join(results, "accuracy.png"), settings)
    plot_accuracy(summary, os.path.join(results, "loss.png"), settings, loss=True)
    if att:
        plot_attention(att, os.path.join(results, "attention.png"), settings)
    for task, t in summary.items():
        print(f"{task}: gate {'passed' if t['gate']['passed'] else 'FAILED: ' + ', '.join(t['gate']['failed'])}")
    print(f"done in {wall / 60:.1f} min: {results}/accuracy.csv, summary.json, accuracy.png")


def tables(summary, multiples=(1, 4, 16)):
    """Markdown: per task, condition and RoPE evaluation, each setting's mean over seeds ± sd at L / N = multiples,
    and at the longest its difference to softmax with the Newcombe 95% interval (* : both pass the gate)."""
    out = []
    for task, t in summary.items():
        gate = t["gate"]
        out.append(f"\n### {task}: gate {'passed' if gate['passed'] else 'missed by ' + ', '.join(gate['failed'])}\n")
        for cond, rope in sorted({(c["condition"], c["rope"]) for c in t["cells"]}):
            cells = {(c["setting"], c["multiple"]): c for c in t["cells"]
                     if (c["condition"], c["rope"]) == (cond, rope)}
            ms = [m for m in multiples if any(k[1] == m for k in cells)] or sorted({k[1] for k in cells})
            metric = next(iter(cells.values()))["metric"]
            out.append(f"{task}, {cond or 'test'}, {rope}: {metric} (mean ± sd over seeds)\n")
            out.append("| setting | " + " | ".join(f"{m} N" for m in ms)
                       + (f" | {ms[-1]} N − softmax [95% CI] |" if metric == "accuracy" else " |"))
            out.append("|---" * (len(ms) + 1 + (metric == "accuracy")) + "|")
            for setting in dict.fromkeys(k[0] for k in cells):
                row = [f"{cells[setting, m]['mean']:.3f} ± {cells[setting, m]['sd']:.3f}" if (setting, m) in cells
                       else "" for m in ms]
                last = cells.get((setting, ms[-1]), {})
                if metric == "accuracy":
                    row.append(f"{last['diff_vs_softmax']:+.3f} [{last['diff_ci'][0]:+.3f}, {last['diff_ci'][1]:+.3f}]"
                               + ("*" if last.get("counts") else "") if "diff_vs_softmax" in last else "")
                out.append(f"| {setting} | " + " | ".join(row) + " |")
            out.append("")
    return "\n".join(out)


def _run_info():
    from model import run_info
    return run_info()
