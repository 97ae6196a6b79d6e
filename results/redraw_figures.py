"""
The committed figures drawn again from the numbers beside each, by the code that drew them: eval_long's (its
summary.json and per_position.csv[.gz]), eval_copy's (summary.json) and the synthetic suite's (accuracy.csv,
attention.csv, a sweep's rows) and an LM suite's train_loss.png (its seeds' train logs; train_loss.csv must come out
the same): how a fix to a figure reaches the committed results without running a model again. An LM suite's
eval_long_*_differences.png are `reproduce.py --rereport`'s.

    python results/redraw_figures.py results/cpu results/synthetic    # every such folder under them
"""
import argparse, csv, gzip, json, os, shutil, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repo root, from any folder
from lib import compare, figures, report, synthetic_figures, synthetic_report  # noqa: E402
from lib.lm_suite import SWITCH_AT, VARIANTS  # noqa: E402
from lib.rereport import SYNTHETIC_COLUMNS  # noqa: E402
from lib.runs import read_train_logs  # noqa: E402
from lib.synthetic_suite import select_lr, sweep_accuracy  # noqa: E402


def read_text(path):
    """A committed CSV, gzipped or not."""
    if os.path.exists(path):
        with open(path, newline="") as f:
            return f.read()
    with gzip.open(path + ".gz", "rt", newline="") as f:
        return f.read()


def synthetic(folder):
    """A synthetic suite's figures, as the suite draws them: summarize(accuracy.csv), attention.csv where kept, a
    sweep's sweep.png at the rates its selected.json holds. An older layout's folder is left as it is."""
    acc = compare.read_csv(os.path.join(folder, "accuracy.csv"))
    if not acc or any(c not in acc[0] for c in SYNTHETIC_COLUMNS):
        return []
    summary, att = synthetic_report.summarize(acc), os.path.join(folder, "attention.csv")
    synthetic_figures.draw(summary, compare.read_csv(att) if os.path.isfile(att) else [], folder,
                           {t: synthetic_report.primary(t) for t in summary}, synthetic_report.BELOW_N)
    if os.path.exists(os.path.join(folder, "sweep.png")):
        with open(os.path.join(folder, "selected.json")) as f:
            chosen = json.load(f)
        if chosen != select_lr(acc):
            sys.exit(f"error: {folder}/selected.json is not the rates its accuracy.csv selects")
        synthetic_figures.sweep(sweep_accuracy(acc), chosen, os.path.join(folder, "sweep.png"))
    return sorted(f for f in os.listdir(folder) if f.endswith(".png"))


def train_loss(folder, summary):
    """An LM suite's train_loss.png as the suite draws it, from its seeds' train_log.csv.gz."""
    M = summary["config"]["train"]["max_iters"]
    with tempfile.TemporaryDirectory() as tmp:
        report.loss_curves(read_train_logs(folder, summary["seeds"]), tmp, summary["variants"], int(SWITCH_AT * M), M)
        if read_text(os.path.join(tmp, "train_loss.csv")) != read_text(os.path.join(folder, "train_loss.csv")):
            return []  # its seeds' train logs were not all kept (results/cpu): left as drawn
        shutil.move(os.path.join(tmp, "train_loss.png"), os.path.join(folder, "train_loss.png"))
    return ["train_loss.png"]


def copy_models(folder, models):
    """eval_copy's models as it records them now, with each one's pos (NoPE: no RoPE to extend, none claimed in the
    title): an LM suite's summary from before it recorded it takes its variant's (lib.lm_suite.VARIANTS, by label)."""
    suite = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(folder))), "summary.json")
    if all("pos" in m for m in models) or not os.path.isfile(suite):
        return models
    with open(suite) as f:
        variants = json.load(f).get("variants", {})  # an LM suite's: its models' labels are its variants
    return [dict(m, pos=(VARIANTS[m["label"]][0] or {}).get("pos", "rope"))  # (e), (f): softmax's, switched
            if "pos" not in m and m["label"] in variants and m["label"] in VARIANTS else m for m in models]


def redraw(folder):
    """folder's copy.png, per_position.png / differences.png, train_loss.png or synthetic figures from its own
    numbers; the PNGs."""
    if os.path.exists(os.path.join(folder, "horizons.png")):
        return synthetic(folder)
    with open(os.path.join(folder, "summary.json")) as f:
        summary = json.load(f)
    if os.path.exists(os.path.join(folder, "train_loss.png")):
        return train_loss(folder, summary)
    if os.path.exists(os.path.join(folder, "copy.png")):
        figures.copy_gate(os.path.join(folder, "copy.png"), copy_models(folder, summary["models"]), summary["args"])
        return ["copy.png"]
    rows = list(csv.reader(read_text(os.path.join(folder, "per_position.csv")).splitlines()))
    columns = {name: [float(r[i]) for r in rows[1:]] for i, name in enumerate(rows[0]) if i}
    figures.eval_long(folder, summary, columns)
    return ["per_position.png"] + ["differences.png"] * bool(summary["differences"])


def folders_under(paths):
    """Every folder under paths with a summary.json beside a per_position.png, copy.png, horizons.png or
    train_loss.png it drew."""
    for top in paths:
        for folder, _, files in sorted(os.walk(top)):
            drawn = {"per_position.png", "copy.png", "horizons.png", "train_loss.png"} & set(files)
            if "summary.json" in files and drawn:
                yield folder


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("paths", nargs="*", default=[os.path.join(ROOT, "results")], help="folders to search")
    a = p.parse_args(argv)
    missing = [x for x in a.paths if not os.path.isdir(x)]
    if missing:
        sys.exit(f"error: {', '.join(missing)}: not a folder")
    done = [(folder, redraw(folder)) for folder in folders_under(a.paths)]
    for folder, drawn in done:
        print(f"{folder}: {', '.join(drawn) or 'left as drawn (an older layout, or its inputs not all kept)'}")
    print(f"{len(done)} folders redrawn")


if __name__ == "__main__":
    main()
