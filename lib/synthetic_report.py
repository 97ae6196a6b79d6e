"""
The synthetic suite's report (synthetic.py runs it): every run's evaluation gathered, statistics with the training
seed as the unit, the verdicts by the rule RESULTS.md states before the results, tables and figures.

Per task, setting, condition, RoPE evaluation and length: each seed's accuracy (MSE for linear), their mean, sd and
95 % Student-t interval over seeds; against softmax, the per-seed paired difference with its t interval and exact
sign-flip p (compare.py); each run's horizon (the longest length solved at accuracy >= 0.95, in units of N). Prompts
are never pooled over seeds: they describe one model, not a scorer. The rule applies no correction for multiple
comparisons; each verdict and control table reports Holm's adjusted p over its own rows beside it, and a pair whose
settings both sit at a bound on every seed (accuracy 1.000, a horizon at the longest length) is "at ceiling": no
interval, and no equivalence read from it.
"""
import csv, gzip, io, math, os, re

import numpy as np

import tasks
from lib import compare, synthetic_figures
from lib.corpora import DataError
from lib.folders import write_json
from lib.runs import remove

GATE = dict(accuracy=0.95, mse=0.1)  # validity gate: each setting's mean at L = N
SOLVED = 0.95  # a horizon's accuracy
BELOW_N = 0.5  # log-axis spot for a run failing at N
ALPHA, MIN_SEEDS = 0.05, 6  # a verdict needs p < ALPHA, which needs 6 seeds
EQUIVALENT = 0.05  # "same": the whole 95 % interval within ±this
ACCURACY_BOUNDS = (0.0, 1.0)  # both settings at one of these on every seed: "at ceiling", not "the same"
# each paper's claim: beats softmax at the primary endpoint
CLAIMS = {"ssmax": "SSMax paper (logits x s log n)", "ssmax-fixed-s": "Chiang & Cholak 2022 (logits x log n)",
          "ssa": "SSA paper (Naim et al. 2025)", "lssa": "LSSA paper (Gao & Spratling 2025)",
          "lssar": "LSSAR paper (Gao & Spratling 2025)", "stickbreaking": "Stick-breaking paper (Tan et al. 2024)",
          "fox": "FoX paper (Lin et al. 2025)",  # softpick claims no sink, not length: a contrast
          "softmax-qwen": "Qwen's log-n scaling (training-free)", "softmax-yarn": "YaRN's temperature (training-free)",
          "softmax-llama4": "Llama 4's temperature tuning (training-free, F = N)"}
# verdict endpoints: (condition, rope, multiple; None = longest)
PRIMARY = {"first": [("", "nope", None)], "recall": [("", "nope", None)], "recall-long": [("", "nope", None)],
           "first-long": [("", "nope", None)], "first-control": [("", "nope", None)],
           "recall-rope": [("", r, None) for r in ("plain", "theta", "dynamic_ntk")],
           "every": [("sigma=10", "nope", None)], "some": [("sigma=10", "nope", None)],
           "linear": [("sigma=4", "plain", 1)]}


NO_PRIMARY = "no primary contrast registered for task {} (synthetic_report.PRIMARY): no verdict"


def primary(task):
    """A task's verdict endpoints; a learning-rate sweep's entry (<task>-lr<rate>), its tuned run (<task>-tuned, each
    setting at its chosen rate) and the GPU scale's (<task>-gpu, and recall's budget rungs <task>-gpu-b<B>-i<I>)
    have their task's."""
    return PRIMARY.get(task) or PRIMARY.get(re.sub(r"-(lr[0-9.e-]+|tuned|gpu(-b[0-9]+-i[0-9]+)?)$", "", task), [])


# notes that decide a task's verdict
NOTES = {t: "accuracy is flat from 1 N to 16 N: the task tests deviant values, not length" for t in ("every", "some")}
# (a, b) by seed: growth in n vs scale alone, and confounds
CONTRASTS = [("ssmax-fixed-s", "softmax-logN"), ("ssmax", "softmax-logN"), ("softmax-logN", "softmax"),
             ("ssmax-s0.5", "ssmax-fixed-s"), ("ssmax-s2", "ssmax-fixed-s"), ("softmax-wd0", "softmax"),
             ("ssmax-wd0", "ssmax"), ("sigmoid", "softmax"), ("softpick", "softmax"),
             ("softmax-qwen", "ssmax-fixed-s"),  # log n without training vs trained
             ("softmax-x2", "softmax"), ("softmax-x3", "softmax")]  # a constant temperature, not trained


def gather(runs, todo):
    """The runs' eval CSVs, each row named by its suite task and setting (recall-rope, softmax-logN)."""
    out = {"accuracy.csv": [], "attention.csv": [], "per_prompt.csv": []}
    for task, setting, seed in todo:
        for file, rows in out.items():
            path = os.path.join(runs, f"{task}-{setting}-s{seed}", "eval", file)
            if os.path.isfile(path):
                rows += [{**r, "task": task, "setting": setting, "base": r["task"]}  # base: tasks.py's name
                         for r in csv.DictReader(open(path))]
    for r in (r for rows in out.values() for r in rows if r.get("checkpoint")):  # as the runs folder names it
        r["checkpoint"] = os.path.relpath(r["checkpoint"], os.path.dirname(os.path.abspath(runs)))
    return out["accuracy.csv"], out["attention.csv"], out["per_prompt.csv"]


def summarize(acc):
    """{task: gate, cells (setting x condition x rope x multiple), horizons, verdicts, contrasts}."""
    cells = {}
    for r in acc:
        mse = r["mse"] != ""
        multiple, rest = divmod(int(r["length"]), int(r["train_length"]))
        key, seed = (r["task"], r["setting"], r["condition"], r["rope"], multiple), int(r["seed"])
        c = cells.setdefault(key, dict(zip(("task", "setting", "condition", "rope", "multiple"), key), base=r["base"],
                                       metric="mse" if mse else "accuracy", by_seed={}, loss_by_seed={}))
        if rest or seed in c["by_seed"]:  # a cell is a multiple of N, one value a seed: never one over another
            raise DataError(f"{r['task']} {r['setting']} seed {seed}: " + (
                f"length {r['length']} is not a multiple of its training length {r['train_length']}" if rest else
                f"two rows at {multiple} N ({r['condition'] or 'no condition'}, rope {r['rope']})") +
                ": the report reads one accuracy a seed at each multiple of N")
        c["by_seed"][seed] = float(r["mse" if mse else "accuracy"])
        if not mse:
            c["loss_by_seed"][seed] = float(r["loss"])
    for c in cells.values():
        c["seeds"], c["per_seed"] = sorted(c["by_seed"]), [c["by_seed"][s] for s in sorted(c["by_seed"])]
        c["mean"], c["sd"], c["ci_lo"], c["ci_hi"] = compare.seed_interval(c["per_seed"])
        c["loss_per_seed"] = [c["loss_by_seed"][s] for s in c["seeds"] if s in c["loss_by_seed"]]
        base = cells.get((c["task"], "softmax", c["condition"], c["rope"], c["multiple"]))
        if base and c["setting"] != "softmax":
            c["vs_softmax"] = compare.paired_by_seed(c["by_seed"], base["by_seed"],
                                                     ACCURACY_BOUNDS if c["metric"] == "accuracy" else ())
    out = {}
    for c in cells.values():
        out.setdefault(c["task"], {"cells": []})["cells"].append(c)
    for task, t in out.items():
        t["gate"] = gate(t["cells"], task)
        t["horizons"] = horizons(t["cells"])
        t["verdicts"] = [verdict(t, task, *p) for p in primary(task)]
        t["contrasts"] = [contrast(t, a, b, *p) for p in primary(task)[:1] for a, b in CONTRASTS
                          if {a, b} <= {c["setting"] for c in t["cells"]}]
        for rows, p in (([v for vs in t["verdicts"] for v in vs], "sign_flip_p"), (t["contrasts"], None)):
            for r, h in zip(rows, compare.holm([r[p] if p else r["accuracy"]["sign_flip_p"] for r in rows])):
                r["holm_p"] = h  # the table's rows are the family
        for c in t["cells"]:  # per_seed has them; JSON would stringify keys
            del c["by_seed"], c["loss_by_seed"]
    return out


def gate(cells, task):
    first = tasks.TASKS[cells[0]["base"]].conditions[0][0]  # flipflop's p_i=0.8, linear's sigma=1
    at_n = {c["setting"]: c for c in cells if c["multiple"] == 1 and c["condition"] == first}
    ok = {s: c["mean"] <= GATE["mse"] if c["metric"] == "mse" else c["mean"] >= GATE["accuracy"]
          for s, c in at_n.items()}
    return dict(rule=f"every setting's mean over seeds at L = N, first condition: accuracy >= {GATE['accuracy']} "
                     f"(MSE <= {GATE['mse']} for linear); a comparison counts only if both settings pass",
                passed=all(ok.values()), failed=sorted(s for s, v in ok.items() if not v),
                at_n={s: c["mean"] for s, c in at_n.items()})


def horizons(cells):
    """{condition|rope: {setting: {seed: horizon in units of N}}}; BELOW_N for a run that fails at N."""
    out = {}
    for c in cells:
        if c["metric"] == "accuracy":
            for seed, acc in zip(c["seeds"], c["per_seed"]):
                out.setdefault(f"{c['condition']}|{c['rope']}", {}).setdefault(c["setting"], {}).setdefault(
                    seed, []).append((c["multiple"], acc))
    return {k: {s: {seed: compare.horizon(*zip(*curve), threshold=SOLVED) or BELOW_N for seed, curve in runs.items()}
                for s, runs in v.items()} for k, v in out.items()}


def _cell(t, setting, cond, rope, mult):
    cs = [c for c in t["cells"] if (c["setting"], c["condition"], c["rope"]) == (setting, cond, rope)]
    mult = mult or max((c["multiple"] for c in cs), default=None)
    return next((c for c in cs if c["multiple"] == mult), None)


def verdict(t, task, cond, rope, mult):
    """Each claimed scorer against softmax at the task's primary endpoint, by the rule in RESULTS.md."""
    out = []
    for setting, source in CLAIMS.items():
        c, base = _cell(t, setting, cond, rope, mult), _cell(t, "softmax", cond, rope, mult)
        if c is None or base is None:
            continue
        v = c["vs_softmax"]
        sign = -1 if c["metric"] == "mse" else 1  # the claim: accuracy up, MSE down
        gain = sorted((sign * v["ci_lo"], sign * v["ci_hi"]))
        sure = v["n"] >= MIN_SEEDS and v["sign_flip_p"] < ALPHA
        headroom = c["metric"] == "mse" or base["mean"] < SOLVED
        if task in NOTES:
            label, why = "not reproduced at this scale", NOTES[task]
        elif not {setting, "softmax"}.isdisjoint(t["gate"]["failed"]):
            label, why = "not testable", "a setting misses the validity gate at N"
        elif sure and gain[1] < 0:
            label, why = "contradicted", "worse than softmax"
        elif not headroom:
            label, why = "not testable", f"softmax solves this length (mean {base['mean']:.3f}): no room to improve"
        elif sure and gain[0] > 0:
            label, why = "reproduced", "better than softmax"
        else:
            label, why = "inconclusive", ("fewer than 6 seeds" if v["n"] < MIN_SEEDS else
                                          "the interval holds 0 or p >= 0.05")
        out.append(dict(setting=setting, source=source, condition=cond, rope=rope, multiple=c["multiple"],
                        metric=c["metric"], mean=c["mean"], softmax=base["mean"], **v, verdict=label, why=why))
    return out


def contrast(t, a, b, cond, rope, mult):
    """a - b by seed at the primary endpoint and in log2 horizon; 'same' if the interval lies within ±EQUIVALENT,
    'at ceiling' if both sit at a bound on every seed (a difference of 0 that shows no equivalence)."""
    ca, cb = _cell(t, a, cond, rope, mult), _cell(t, b, cond, rope, mult)
    d = compare.paired_by_seed(dict(zip(ca["seeds"], ca["per_seed"])), dict(zip(cb["seeds"], cb["per_seed"])),
                               ACCURACY_BOUNDS if ca["metric"] == "accuracy" else ())
    hz = t["horizons"].get(f"{cond}|{rope}", {})
    top = max(c["multiple"] for c in t["cells"] if (c["condition"], c["rope"]) == (cond, rope))
    h = compare.paired_by_seed(*({s: math.log2(x) for s, x in hz.get(k, {}).items()} for k in (a, b)),
                               bounds=(math.log2(top), math.log2(BELOW_N)))
    same = -EQUIVALENT <= d["ci_lo"] and d["ci_hi"] <= EQUIVALENT
    differ = d["n"] >= MIN_SEEDS and d["sign_flip_p"] < ALPHA and (d["ci_lo"] > 0 or d["ci_hi"] < 0)
    return dict(a=a, b=b, multiple=ca["multiple"], accuracy=d, log2_horizon=h,
                reading="a > b" if differ and d["ci_lo"] > 0 else "a < b" if differ else
                "at ceiling" if d["at_bound"] is not None else "the same within ±0.05" if same else "undecided")


# ----------------------------------------------------------------------------------------------------------------
# Files: CSVs, summary.json, tables.md, figures

def report(runs, results, todo, setup):
    """Every file of the report, summary.json last (gone meanwhile): a folder with it holds one report whole."""
    remove(os.path.join(results, "summary.json"))
    acc, att, prompts = gather(runs, todo)
    compare.write_csv(os.path.join(results, "accuracy.csv"), acc, list(acc[0]))
    if att:
        compare.write_csv(os.path.join(results, "attention.csv"), att, list(dict.fromkeys(k for r in att for k in r)))
    else:  # an earlier call's, of other runs
        remove(os.path.join(results, "attention.csv"), os.path.join(results, "attention.png"))
    path = os.path.join(results, "per_prompt.csv.gz")
    with gzip.GzipFile(path, "wb", mtime=0) as gz, io.TextIOWrapper(gz, newline="") as f:  # mtime 0: same bytes
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in prompts for k in r)))  # old runs: fewer
        w.writeheader()
        w.writerows(prompts)
    from lib.checkpoint import run_info
    summary = summarize(acc)
    synthetic_figures.draw(summary, att, results, {task: primary(task) for task in summary}, BELOW_N)
    write(results, summary, {**setup, "run_info": run_info()})
    for task, t in summary.items():
        print(f"{task}: gate {'passed' if t['gate']['passed'] else 'FAILED: ' + ', '.join(t['gate']['failed'])}"
              + ("" if primary(task) else f"; {NO_PRIMARY.format(task)}"))


def write(results, summary, head):
    """tables.md, then summary.json (head, the rule, the statistics: summarize's) whole."""
    rule = dict(gate=GATE, solved=SOLVED, alpha=ALPHA, min_seeds=MIN_SEEDS, equivalent=EQUIVALENT,
                correction="none (the rule as committed); holm_p: Holm's adjusted p over each table's rows, reported",
                ceiling=f"both settings at one of {ACCURACY_BOUNDS} (accuracy) or the tested horizon's bounds on every "
                        "seed: at_bound, no interval, no equivalence")
    with open(os.path.join(results, "tables.md"), "w") as f:
        f.write(tables(summary))
    write_json(os.path.join(results, "summary.json"), {**head, "rule": rule, "tasks_summary": summary}, indent=1,
               default=float)


def _f(x, d=3):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.{d}f}"


def _ci(v, d=3, horizon=False):
    """A paired difference's mean [95 % t CI], or "at ceiling" where both settings sit at a bound on every seed."""
    b = v.get("at_bound")
    if b is None:
        return f"{_f(v['mean_diff'], d)} [{_f(v['ci_lo'], d)}, {_f(v['ci_hi'], d)}]"
    if horizon:
        return "at floor (both fail at N on every seed)" if b < 0 else f"at ceiling (both {2 ** b:g} N on every seed)"
    return f"at {'floor' if b == 0 else 'ceiling'} (both {b:.3f} on every seed)"


def tables(summary):
    """Markdown per task: the verdicts, then per condition and RoPE evaluation each setting's mean ± sd over seeds by
    length with its difference to softmax (t interval, sign-flip p), the horizons, and the control contrasts."""
    out = []
    for task, t in summary.items():
        g = t["gate"]
        out.append(f"\n## {task}: gate {'passed' if g['passed'] else 'missed by ' + ', '.join(g['failed'])}\n")
        rows = [v for vs in t["verdicts"] for v in vs]
        if not primary(task):  # an added task has no verdict until PRIMARY names its endpoint: never silently
            out.append(f"{NO_PRIMARY.format(task)}\n")
        if rows:
            out += ["| claim | at | mean − softmax [95% t CI] | sign-flip p | Holm p | seeds | verdict |",
                    "|---" * 7 + "|"]
            out += [f"| {v['setting']} > softmax ({v['source']}) | {v['condition'] or 'test'} {v['rope']}, "
                    f"{v['multiple']} N | {_ci(v)} | {v['sign_flip_p']:.4f} | {v['holm_p']:.4f} | {v['n']} | "
                    f"**{v['verdict']}** ({v['why']}) |" for v in rows]
            out.append(f"\nHolm p: Holm's adjusted p over this table's {len(rows)} row{'s' * (len(rows) > 1)} (the "
                       "rule, as committed, applies no correction; a verdict survives Holm where its Holm p < 0.05)")
        for cond, rope in sorted({(c["condition"], c["rope"]) for c in t["cells"]}):
            cs = {(c["setting"], c["multiple"]): c for c in t["cells"] if (c["condition"], c["rope"]) == (cond, rope)}
            ms, metric = sorted({m for _, m in cs}), next(iter(cs.values()))["metric"]
            hz = t["horizons"].get(f"{cond}|{rope}", {})
            out.append(f"\n{task}, {cond or 'test'}, {rope}: {metric}, mean ± sd over seeds; at {ms[-1]} N the "
                       f"paired difference to softmax [95% t CI] (sign-flip p); horizon: median [min, max] L/N\n")
            out.append("| setting | seeds | " + " | ".join(f"{m} N" for m in ms) + f" | {ms[-1]} N − softmax | "
                       "horizon |")
            out.append("|---" * (len(ms) + 4) + "|")
            for s in dict.fromkeys(k[0] for k in cs):
                last, h = cs.get((s, ms[-1]), {}), list(hz.get(s, {}).values())
                v = last.get("vs_softmax")
                out.append(f"| {s} | {last.get('seeds') and len(last['seeds'])} | " + " | ".join(
                    f"{cs[s, m]['mean']:.3f} ± {cs[s, m]['sd']:.3f}" if (s, m) in cs else "" for m in ms)
                    + (f" | {_ci(v)} ({v['sign_flip_p']:.3g})" if v else " | ")
                    + (f" | {np.median(h):g} [{min(h):g}, {max(h):g}] |" if h else " | |"))
        if t["contrasts"]:
            out += [f"\n{task}: controls, a − b by seed at {t['contrasts'][0]['multiple']} N (accuracy) and in "
                    "log2 horizon; Holm p: over this table's rows, from the accuracy p\n",
                    "| a − b | accuracy [95% t CI] (p) | Holm p | log2 horizon [95% t CI] (p) | reading |",
                    "|---" * 5 + "|"]
            for k in t["contrasts"]:
                d, h = k["accuracy"], k["log2_horizon"]
                out.append(f"| {k['a']} − {k['b']} | {_ci(d)} ({d['sign_flip_p']:.3g}) | {k['holm_p']:.3g} | "
                           f"{_ci(h, 2, horizon=True)} ({h['sign_flip_p']:.3g}) | {k['reading']} |")
    return "\n".join(out) + "\n"
