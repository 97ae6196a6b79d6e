"""
A results folder's summary.json and tables.md again, with this code's statistics, from the per-seed data the folder
itself holds (`python reproduce.py --rereport results/<name>`): how a reader checks that committed numbers are what
the committed data give. The synthetic suite's come from its accuracy.csv; the language-model suite's from
train_loss.csv and its s<seed>/ and needle/ outputs. The run's head (command, config, run_info, plan, ...) is kept and
rereport_run_info added; figures other than the summary's own are left as they are. A folder that lacks an input of
a section its summary has (a pilot whose evaluations were not kept, a file of an older layout) is left as it was,
with one error that names what is missing.
"""
import json, os, tempfile

from lib import compare, report, synthetic_report
from lib.checkpoint import run_info
from lib.corpora import DataError
from lib.folders import held
from lib.lm_suite import COPY_RUNS

# what synthetic_report.summarize reads of each accuracy.csv row (setting and base: the suite since 2026-11-26)
SYNTHETIC_COLUMNS = ("task", "setting", "base", "seed", "length", "train_length", "condition", "rope", "accuracy",
                     "mse", "loss")
# report.summarize's sections: the rest of an LM summary.json is the run's head, kept as it was
LM_SECTIONS = ("seeds", "variants", "losses", "interval", "eval_long", "gates", "copy_gate", "retrieval", "needle",
               "passkey")


def rereport(results):
    results = os.path.normpath(results)
    path = os.path.join(results, "summary.json")
    if not os.path.isfile(path):
        raise DataError(f"{results}: no summary.json; --rereport reads a results folder that reproduce.py wrote")
    with held(results, "a reproduction's results"):  # never beside a reproduction writing the same folder
        with open(path) as f:
            old = json.load(f)
        (synthetic if "tasks_summary" in old else lm)(results, old)
    print(f"rereported: {path}")


def synthetic(results, old):
    acc = compare.read_csv(os.path.join(results, "accuracy.csv"))
    missing = [c for c in SYNTHETIC_COLUMNS if acc and c not in acc[0]]
    if not acc or missing:
        raise DataError(f"{results}/accuracy.csv " + (f"lacks the column(s) {', '.join(missing)} (an older suite's "
                        "layout)" if acc else "holds no rows") + ": its summary.json is left as that run wrote it")
    head = {k: v for k, v in old.items() if k not in ("rule", "tasks_summary")}
    synthetic_report.write(results, synthetic_report.summarize(acc), {**head, "rereport_run_info": run_info()})


def section(key):
    return any(key == s or key.startswith(s + "_") for s in LM_SECTIONS)


def lm(results, old):
    losses = os.path.join(results, "train_loss.csv")
    if not os.path.isfile(losses):
        raise DataError(f"{losses} is not there: the final losses of {results}/summary.json can't be recomputed")
    rows = [dict(variant=r["variant"], seed=int(r["seed"]), iter=int(r["iter"]), train_loss=float(r["train_loss"]),
                 val_loss=float(r["val_loss"])) for r in compare.read_csv(losses)]
    head = {k: v for k, v in old.items() if not section(k)}
    # the folder is written only once every section is made again; beside it, so that os.replace is one step
    with tempfile.TemporaryDirectory(prefix=f".{os.path.basename(results)}.rereport-",
                                     dir=os.path.dirname(os.path.abspath(results))) as tmp:
        for name in os.listdir(results):  # summarize reads s<seed>/ and needle/, and writes beside them
            if os.path.isdir(os.path.join(results, name)):
                os.symlink(os.path.abspath(os.path.join(results, name)), os.path.join(tmp, name))
        new = report.summarize(tmp, dict.fromkeys(old["seeds"]), old["variants"],
                               old["config"]["model"]["block_size"], rows, list(COPY_RUNS),
                               **{**head, "rereport_run_info": run_info()})
        lost = [k for k in old if section(k) and k not in new]
        if lost:
            raise DataError(f"{results}/summary.json's {', '.join(lost)} can't be recomputed: their per-seed inputs "
                            f"(s<seed>/...) are not in the folder; it is left as it was")
        made = [n for n in os.listdir(tmp) if not os.path.islink(os.path.join(tmp, n))]
        for name in sorted(made, key=lambda n: n == "summary.json"):  # summary.json last: what RESULTS.md reads
            os.replace(os.path.join(tmp, name), os.path.join(results, name))
