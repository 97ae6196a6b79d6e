"""
The committed eval_long and eval_copy figures drawn again from the numbers beside each (its summary.json and
per_position.csv[.gz]) by today's drawing code, the code those scripts draw with: how a fix to a figure reaches the
committed results without running a model again. A summary's own figures (train_loss.png,
eval_long_*_differences.png, the synthetic suite's) are `python reproduce.py --rereport results/<name>`'s.

    python results/redraw_figures.py results/cpu results/cpu_char    # every eval_long/eval_copy folder under them
"""
import argparse, csv, gzip, json, os, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repo root, from any folder
import eval_copy, eval_long  # noqa: E402
from lib import figures  # noqa: E402


def read_text(path):
    """A committed CSV, gzipped or not."""
    if os.path.exists(path):
        with open(path, newline="") as f:
            return f.read()
    with gzip.open(path + ".gz", "rt", newline="") as f:
        return f.read()


def redraw(folder):
    """folder's copy.png or per_position.png / differences.png from its own numbers; the PNGs it drew."""
    with open(os.path.join(folder, "summary.json")) as f:
        summary = json.load(f)
    args = argparse.Namespace(**{"ntk_per_length": False, "logit_scale": None, **summary["args"]})
    if os.path.exists(os.path.join(folder, "copy.png")):
        eval_copy.plot(os.path.join(folder, "copy.png"), summary["models"], args)
        return ["copy.png"]
    rows = list(csv.reader(read_text(os.path.join(folder, "per_position.csv")).splitlines()))
    columns = {name: [float(r[i]) for r in rows[1:]] for i, name in enumerate(rows[0]) if i}
    figures.eval_long(folder, summary, columns, {rope: d for rope, _, _, d in eval_long.rope_settings(args)})
    return ["per_position.png"] + ["differences.png"] * bool(summary["differences"])


def folders_under(paths):
    """Every eval_long or eval_copy folder under paths: a summary.json beside the per_position.png or copy.png drawn."""
    for top in paths:
        for folder, _, files in sorted(os.walk(top)):
            if "summary.json" in files and {"per_position.png", "copy.png"} & set(files):
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
        print(f"{folder}: {', '.join(drawn)}")
    print(f"{len(done)} folders redrawn")


if __name__ == "__main__":
    main()
