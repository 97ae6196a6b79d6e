"""Issue #32, exploratory (not pre-registered: written on 2026-11-27 at 03:45 UTC with 8 of the 10 seeds read, before
the verdicts): contrasts the pre-registered claims do not make, read from each seed's eval_long per-sequence losses,
with the same statistics (the seed as the unit, paired by seed, 95 % t interval, sign-flip p) and no verdict.

1. The premise of SSMax Fig. 5: does softmax's loss rise past N after θ × 50 (window k N minus window 1 N)?
   And SSMax's? If neither rises, "(b) keeps its loss where (a) degrades" has nothing to keep.
2. Does θ × 50 help at all: each model's loss under θ × 50 minus native θ, same sequences.
3. The zoo against softmax's extension: stick-breaking and FoX (NoPE, nothing to extend) minus softmax under θ × 50
   and under Dynamic NTK, the fairer baseline than the native θ the pre-registered claims used.
4. (Added for issue #47, after the results.) Texts as the unit: every seed is scored on the same 32 texts, so seeds
   that agree are partly texts that agree. Each text's difference is averaged over the 10 seeds, and the t interval
   and sign-flip p (Monte Carlo beyond 20) are taken over the texts: does FoX's loss keep falling past N, and does
   FoX - softmax hold, with the texts' spread counted?

    .venv/bin/python results/cpu_char/explore.py     # -> explore.md / explore.json / explore.png beside summary.json
"""
import csv, gzip, json, os, sys
from collections import defaultdict

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo root, for verdicts' lib from any folder
import verdicts  # noqa: E402

FAR = ("2x", "4x", "8x", "16x")


def seed_windows(results, seeds, method):
    """{(model, rope, window): one mean loss per seed (over that seed's sequences)}, rope 'extended' or 'native',
    from s<seed>/eval_long_<method>/per_sequence.csv.gz; a key missing from any seed is left out."""
    per_seed = []
    for seed in seeds:
        acc = defaultdict(list)
        with gzip.open(os.path.join(results, f"s{seed}", f"eval_long_{method}", "per_sequence.csv.gz"), "rt") as f:
            for row in csv.DictReader(f):
                acc[row["model"], row["rope"], row["window"]].append(float(row["loss"]))
        per_seed.append({k: float(np.mean(v)) for k, v in acc.items()})
    keys = set.intersection(*(set(d) for d in per_seed))
    return {k: np.array([d[k] for d in per_seed]) for k in keys}


def text_windows(results, seeds, method):
    """{(model, rope, window): one loss per text (sequence id and start), its mean over the seeds}: the texts every
    seed read; a text missing from any seed is left out."""
    per_seed = []
    for seed in seeds:
        acc = defaultdict(dict)
        with gzip.open(os.path.join(results, f"s{seed}", f"eval_long_{method}", "per_sequence.csv.gz"), "rt") as f:
            for row in csv.DictReader(f):
                acc[row["model"], row["rope"], row["window"]][row["sequence"], row["start"]] = float(row["loss"])
        per_seed.append(acc)
    keys = set.intersection(*(set(d) for d in per_seed))
    texts = {k: sorted(set.intersection(*(set(d[k]) for d in per_seed))) for k in keys}
    return {k: np.array([np.mean([d[k][t] for d in per_seed]) for t in texts[k]]) for k in keys}


def contrast(label, d):
    """verdicts.cell's statistics for one paired difference per seed, without its verdict (nothing was registered)."""
    return {**verdicts.cell(d, 0), "label": label, "side": 0, "verdict": "exploratory"}


def contrasts(theta, ntk):
    """[(question, [cells])] from seed_windows of the θ × 50 and the Dynamic NTK runs."""
    t = lambda m, rope, w: theta[m, rope, w]
    rows = [("(1) the loss past N minus the loss within N, θ × 50: does it rise? (SSMax Fig. 5: softmax's does)",
             [contrast(f"{m}, {w} − 1x", t(m, "extended", w) - t(m, "extended", "1x"))
              for m in ("softmax", "ssmax") for w in FAR]),
            ("(2) θ × 50 minus native θ, same model and sequences (< 0: the extension helps)",
             [contrast(f"{m}, {w}", t(m, "extended", w) - t(m, "native", w))
              for m in ("softmax", "ssmax") for w in ("1x",) + FAR])]
    zoo = []
    for m in ("stickbreaking", "fox"):
        zoo += [contrast(f"{m} − softmax θ × 50, {w}", t(m, "native", w) - t("softmax", "extended", w))
                for w in FAR]
        zoo += [contrast(f"{m} − softmax Dynamic NTK, {w}", ntk[m, "native", w] - ntk["softmax", "extended", w])
                for w in FAR]
    rows.append(("(3) the zoo (NoPE) minus softmax with its RoPE extended (< 0: the zoo is better)", zoo))
    return rows


def by_text(theta, texts):
    """(4): FoX's loss past N against its own at 1 N and 2 N, and FoX − softmax (the pre-registered cells), with the
    texts as the unit; FoX 16x − 2x with the seeds as the unit beside them."""
    f = lambda T, w: T["fox", "native", w]
    cells = [contrast(f"fox, {w} − {w0} (texts)", f(texts, w) - f(texts, w0))
             for w0, w in (("1x", "2x"), ("2x", "4x"), ("2x", "16x"), ("1x", "16x"))]
    cells.append(contrast("fox, 16x − 2x (seeds)", f(theta, "16x") - f(theta, "2x")))
    cells += [contrast(f"fox − softmax, {w} (texts)", f(texts, w) - texts["softmax", "native", w]) for w in FAR]
    return [("(4) texts as the unit (each text's mean over the seeds; t and sign-flip p over the texts)", cells)]


def markdown(seeds, rows):
    out = [f"Exploratory, not pre-registered: no verdict. Seeds: {len(seeds)} ({', '.join(map(str, seeds))}); "
           "each cell: mean over seeds of the paired difference [95 % t interval], sign-flip p; in (4) cells marked "
           "(texts): over the texts, each text's difference averaged over the seeds.\n",
           "| question | cell | mean [95 % t] | p |", "|---|---|---|---|"]
    for question, cells in rows:
        for i, c in enumerate(cells):
            p = f"{c['p']:.3f}" if c["p"] >= 0.001 else "< 0.001"  # (4): Monte Carlo over 32 texts
            out.append(f"| {question if i == 0 else ''} | {c['label']} | {c['mean']:+.3f} [{c['lo']:+.3f}, "
                       f"{c['hi']:+.3f}] | {p} |")
    return "\n".join(out) + "\n"


def main(results=HERE):
    with open(os.path.join(results, "summary.json")) as f:
        seeds = json.load(f)["seeds"]
    theta = seed_windows(results, seeds, "theta")
    rows = contrasts(theta, seed_windows(results, seeds, "dynamic_ntk"))
    rows += by_text(theta, text_windows(results, seeds, "theta"))
    v = dict(seeds=seeds, claims=[dict(claim=q, verdict="exploratory", cells=c) for q, c in rows])
    with open(os.path.join(results, "explore.json"), "w") as f:
        json.dump(v, f, indent=1)
    table = markdown(seeds, rows)
    with open(os.path.join(results, "explore.md"), "w") as f:
        f.write(table)
    verdicts.figure(v, os.path.join(results, "explore.png"),
                    "paired difference, as labelled (dots: seeds; in (4) texts where so labelled)")
    return table


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.error = lambda message: sys.exit(f"error: {message}")  # one line, no usage dump
    ap.add_argument("--results", default=HERE, help="the cpu_char results folder (default: this script's)")
    print(main(ap.parse_args().results))
