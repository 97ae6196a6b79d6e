"""Issue #32: the pre-registered claims of RESULTS.md ("The full run's claims", 06:12 UTC, and "retrieval", 07:06 UTC)
decided from results/cpu_char/summary.json by the rule written there, and nothing else: the training seed is the
unit, each difference paired by seed; a cell is **reproduced** when its 95 % t interval excludes 0 on the paper's
side and the sign-flip p < 0.05, **contradicted** when both hold on the other side, **inconclusive** otherwise, and
gets no verdict under 10 seeds; a claim whose gate fails is **not testable**. A claim with several cells (windows,
distances, models) is reproduced when every cell is, contradicted when one is and none is reproduced, else
inconclusive (this aggregation was written on 2026-11-26 at 10:50 UTC, with 2 of the 10 seeds done).

The rule applies no correction for multiple comparisons, and its verdicts stand as ruled. Reported beside them
(issue #47, after the results): Holm's adjusted p over the table's 59 cells, and over its 13 claims, a claim's p
being its cells' largest (the intersection-union test behind "reproduced only if every cell is") or, for
"contradicted if one cell is", the smallest contradicting cell's p times the claim's cells (Bonferroni within it).

    .venv/bin/python results/cpu_char/verdicts.py [--summary results/cpu_char/summary.json]  # -> verdicts.md/.json/.png
"""
import argparse, json, os, sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root
from lib import compare  # noqa: E402

MIN_SEEDS, ALPHA = 10, 0.05
CONTEXT_GATE, RETRIEVAL_GATE = 0.3, 0.2


def cell(d, side):
    """d: one paired difference per seed; side: +1 or -1, the paper's expected sign; 0: "close to", which had no
    margin, so no verdict either way."""
    mean, sd, lo, hi = compare.seed_interval(d)
    p = compare.sign_flip_p(d)
    if len(d) < MIN_SEEDS:
        verdict = f"no verdict ({len(d)} seeds)"
    elif side == 0:
        verdict = "inconclusive"
    elif p < ALPHA and side * lo > 0 and side * hi > 0:
        verdict = "reproduced"
    elif p < ALPHA and side * lo < 0 and side * hi < 0:
        verdict = "contradicted"
    else:
        verdict = "inconclusive"
    return dict(mean=mean, lo=lo, hi=hi, p=p, n=len(d), verdict=verdict, per_seed=[float(x) for x in d])


def aggregate(cells):
    v = [c["verdict"] for c in cells]
    short = [x for x in v if x.startswith("no verdict")]
    if short:  # any cell below the rule's seeds: no verdict for the claim, whichever cell comes first
        return short[0]
    if all(x == "reproduced" for x in v):
        return "reproduced"
    if "contradicted" in v and "reproduced" not in v:
        return "contradicted"
    return "inconclusive"


def val_diff(s, model):
    """model's final val loss minus softmax's, paired by seed: only seeds with both (a seed's lost training log)."""
    a, b = s["losses"][model]["per_seed"], s["losses"]["softmax"]["per_seed"]
    return np.array([a[k]["val_loss"] - b[k]["val_loss"] for k in a if k in b])


def claims(s):
    """[(claim, what the paper reports, gate, [(label, d, side)])]: the pre-registered claims, the papers' own
    results beside them (their scale, not ours), their gates and cells."""
    # eval_long's per-seed mean difference to softmax (per_seed: [mean, lo, hi] of each seed's sequences)
    to_softmax = {(method, d["model"], d["rope"], d["window"]): np.array([x[0] for x in d["per_seed"]])
                  for method in ("theta", "dynamic_ntk") for d in s[f"eval_long_{method}"]["differences"]}

    def long_diffs(method, rope, model, window, base="softmax"):  # another base: difference of the differences
        d = to_softmax[method, model, rope, window]
        return d if base == "softmax" else d - to_softmax[method, base, rope, window]

    softmax_ctx = s["gates"]["softmax"]["context_gain"][0]
    copies = s["copy_gate"]["softmax"]["gate"]
    needle_1n = s["retrieval_native"]["needle"]["softmax"]["64"]["interval"][0]
    passkey_1n = s["retrieval_native"]["passkey"]["softmax"]["64"]["interval"][0]
    gates = {"context gate (softmax loss(1) - mean(N/2+1..N) >= 0.3)": softmax_ctx >= CONTEXT_GATE,
             "copy gate (softmax ratio at N/2 <= 0.5)": copies,
             "needle gate (softmax exact needle accuracy at 1 N, native θ, >= 0.2)": needle_1n >= RETRIEVAL_GATE,
             "passkey gate (softmax exact passkey accuracy at 1 N, native θ, >= 0.2)": passkey_1n >= RETRIEVAL_GATE}
    ctx, cp, nd, pk = gates
    far, far2 = ("4x", "8x", "16x"), ("2x", "4x", "8x", "16x")
    ratio = lambda key, m, k: np.array(s[key][m]["ratio_per_seed"][k])
    acc = lambda key, m, c: np.array(s["retrieval"][key][m][c]["per_seed"])
    score = lambda m, k: np.array(s["retrieval"]["needle_scores"][m][k]["per_seed"])
    out = [
        ("SSMax Fig. 5: after θ × 50, (b) and (c) keep their loss beyond N where (a) degrades: (b), (c) − (a), "
         "eval_long windows 4 N-16 N",
         "162M, N = 1,024, RoPE θ × 50: softmax's loss rises past N, (b) and (c) stay low to ~20 N", ctx,
         [(f"{m} − softmax, {w}", long_diffs("theta", "extended", m, w), -1) for m in ("ssmax", "ssmax_nos")
          for w in far]),
        ("SSMax Fig. 5: (d) between (b) and (a): (d) − (a) < 0 and (d) − (b) > 0 at 4 N-16 N",
         "(d) degrades past N more than (b), less than (a)", ctx,
         [(f"ssmax_bias − softmax, {w}", long_diffs("theta", "extended", "ssmax_bias", w), -1) for w in far]
         + [(f"ssmax_bias − ssmax, {w}", long_diffs("theta", "extended", "ssmax_bias", w, "ssmax"), +1)
            for w in far]),
        ("SSMax Fig. 5: (e) worse than (a) at short context: (e) − (a) at 1 N after θ × 50",
         "(e), switched after pretraining, has a higher loss than (a) at short context", ctx,
         [("ssmax_e − softmax, 1x", long_diffs("theta", "extended", "ssmax_e", "1x"), +1)]),
        ("SSMax Fig. 5: (f) close to (b): (f) − (b) at 4 N-16 N (no equivalence margin was stated: reported, "
         "inconclusive by the rule)", "(f), switched for the last 12.5 % of training, ends close to (b)", ctx,
         [(f"ssmax_f − ssmax, {w}", long_diffs("theta", "extended", "ssmax_f", w, "ssmax"), 0) for w in far]),
        ("LSSAR Table 4: under Dynamic NTK, LSSA and LSSAR keep a lower loss than softmax at long prefixes "
         "(prefix 4 N-16 N)",
         "GPT-2 124M, N = 1,024, Dynamic NTK: softmax 3.19 at 1K -> 6.28 at 8K; LSSAR 3.19 -> 3.32; LSSA "
         "slightly below softmax past N", ctx,
         [(f"{m} − softmax, prefix_{w}", long_diffs("dynamic_ntk", "extended", m, f"prefix_{w}"), -1)
          for m in ("lssa", "lssar") for w in far]),
        ("SSMax Figs. 6-8 as copying: (b) copies past N under θ × 50 where (a) does not: ratio (b) − (a) at "
         "2 N-16 N",
         "after a retrieval fine-tune, (b) retrieves to ~10 N where (a) fails (here: copying a 16-character "
         "code)", cp,
         [(f"ssmax − softmax, θ × 50, {k} N", ratio("copy_gate_theta50", "ssmax", k)
           - ratio("copy_gate_theta50", "softmax", k), -1) for k in ("2", "4", "8", "16")]),
        ("SSA: lower loss than softmax (val loss, SSA − softmax)",
         "GPT-2 124M, OpenWebText: val loss 3.15 (n = 1.5) vs 3.27 (softmax)", None,
         [("ssa − softmax, val loss", val_diff(s, "ssa"), -1)]),
        ("Stick-breaking: better length extrapolation without positions: copy ratio and loss windows past N, − "
         "softmax (native θ)",
         "350M trained at 2,048 tokens: perplexity keeps improving to 16,384, where softmax + RoPE degrades", cp,
         [(f"stickbreaking − softmax, copy ratio {k} N", ratio("copy_gate", "stickbreaking", k)
           - ratio("copy_gate", "softmax", k), -1) for k in ("2", "4", "8", "16")]
         + [(f"stickbreaking − softmax, loss {w}", long_diffs("theta", "native", "stickbreaking", w), -1)
            for w in far2]),
        ("FoX: better length extrapolation than a RoPE transformer: loss windows past N (native θ), − softmax",
         "760M: loss stays low past the training length, where the RoPE Transformer's rises", ctx,
         [(f"fox − softmax, loss {w}", long_diffs("theta", "native", "fox", w), -1) for w in far2]),
        ("Rescalings (Qwen log-n, YaRN, Llama 4 with F = N) make a trained softmax copy past N: ratio, rescaled − "
         "native softmax, 1 N-4 N",
         "logit scaling with length keeps attention sharp past N (in this repo's synthetic suite qwen and yarn "
         "reproduced)", cp,
         [(f"{r} − softmax, {k} N", ratio(f"copy_gate_{r}", "softmax", k) - ratio("copy_gate", "softmax", k), -1)
          for r in ("qwen", "yarn", "llama4") for k in ("1", "2", "4")]),
        ("SSMax Fig. 6: (b) retrieves the needle past N where (a) fails: exact accuracy (b) − (a), θ × 50, "
         "2 N-8 N", "after a retrieval fine-tune, (a) retrieves only within N, (b) to ~10 N", nd,
         [(f"ssmax − softmax, needle at {c}", acc("needle", "ssmax", c) - acc("needle", "softmax", c), +1)
          for c in ("128", "256", "512")]),
        ("SSMax Figs. 7-8: (b)'s best head puts more weight on the needle: score at 4 N, θ × 50, (b) − (a); "
         "(b)'s needle − control span",
         "(b)'s attention concentrates on the needle; (a)'s spreads as the context grows", nd,
         [("ssmax − softmax, best-head needle score", score("ssmax", "top_score") - score("softmax", "top_score"),
           +1), ("ssmax, needle − control span (best head)", score("ssmax", "top_minus_control"), +1)]),
        ("LSSAR Fig. 3: LSSA and LSSAR keep retrieving the passkey past N: exact accuracy − softmax, θ × 50, "
         "2 N-8 N", "LSSAR keeps retrieving the passkey past N where softmax falls to 0", pk,
         [(f"{m} − softmax, passkey at {c}", acc("passkey", m, c) - acc("passkey", "softmax", c), +1)
          for m in ("lssa", "lssar") for c in ("128", "256", "512")]),
    ]
    values = dict(softmax_context_gain=softmax_ctx, softmax_copy_ratio=s["copy_gate"]["softmax"]["ratio"]["0.5"][0],
                  softmax_needle_1n=needle_1n, softmax_passkey_1n=passkey_1n)
    return out, gates, values


def decide(s):
    out, gates, values = claims(s)
    rows = []
    for claim, paper, gate, cells in out:
        got = [dict(label=label, side=side, **cell(d, side)) for label, d, side in cells]
        ok = True if gate is None else gates[gate]
        rows.append(dict(claim=claim, paper=paper, gate=gate or "none (a loss within N)", gate_passed=ok, cells=got,
                         verdict=aggregate(got) if ok else "not testable"))
    cells = [c for r in rows for c in r["cells"]]
    for c, h in zip(cells, compare.holm([c["p"] for c in cells])):
        c["holm_p"] = h
    for r in rows:
        r["p"] = claim_p(r)
    for r, h in zip(rows, compare.holm([r["p"] for r in rows])):
        r["holm_p"] = h
    return dict(seeds=s["seeds"], gate_values=values, gates=gates, claims=rows)


def claim_p(r):
    """A claim's p for Holm over claims: contradicted, its smallest contradicting cell's p times its cells
    (Bonferroni: one cell decides); else its cells' largest p (every cell must be reproduced)."""
    against = [c["p"] for c in r["cells"] if c["verdict"] == "contradicted"]
    if r["verdict"] == "contradicted":
        return min(1.0, len(r["cells"]) * min(against))
    return max(c["p"] for c in r["cells"])


def markdown(v):
    g = v["gate_values"]
    out = [f"Seeds: {len(v['seeds'])} ({', '.join(map(str, v['seeds']))}). Gate values (mean over seeds): softmax "
           f"context gain {g['softmax_context_gain']:.3f}, copy ratio at N/2 {g['softmax_copy_ratio']:.2f}, needle "
           f"accuracy at 1 N {g['softmax_needle_1n']:.2f}, passkey accuracy at 1 N {g['softmax_passkey_1n']:.2f}.\n",
           "| claim | the paper reports (its scale) | gate | cell: mean [95 % t interval], sign-flip p, Holm p over "
           f"the {sum(len(r['cells']) for r in v['claims'])} cells, verdict | claim's verdict | claim's p; Holm p over "
           f"the {len(v['claims'])} claims |", "|---|---|---|---|---|---|"]
    for r in v["claims"]:
        cells = "<br>".join(f"{c['label']}: {c['mean']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}], p = {c['p']:.3f}, "
                            f"Holm p = {c['holm_p']:.3f}, {c['verdict']}" for c in r["cells"])
        gate = f"{r['gate']}: {'passed' if r['gate_passed'] else '**failed**'}"
        out.append(f"| {r['claim']} | {r['paper']} | {gate} | {cells} | **{r['verdict']}** | {r['p']:.4f}; "
                   f"{r['holm_p']:.4f} |")
    out.append("\nThe rule applies no correction; its verdicts stand as ruled. Holm p beside them: a verdict survives "
               "Holm where its Holm p < 0.05 (a claim's p: its cells' largest, or for a contradiction its smallest "
               "contradicting cell's p times its cells).")
    return "\n".join(out) + "\n"


def plotted_label(label, side):
    """The difference a cell's row plots: its label's, turned round ("a − b, x" -> "b − a, x") when the paper's
    side is < 0, so that the paper's side is always > 0 and the label still names what is plotted."""
    if side >= 0:
        return label
    diff, rest = label.split(", ", 1)
    a, b = diff.split(" − ")
    return f"{b} − {a}, {rest}"


def figure(v, path, width=105):
    """Every cell: each seed's paired difference (dots), the mean and its 95 % t interval (bar), each row the
    difference its label names, turned so that the paper's side is right of 0; one panel a claim, rows top down
    in the table's order. width: a title's characters a line (wrapped whole)."""
    import re, textwrap
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    claims = v["claims"]
    keep = lambda t: re.sub(r"(?<=\d) (?=N\b)|(?<=θ) (?=×)|(?<=×) (?=\d)", "\u00a0", t)  # "2 N", "θ × 50" unbroken
    titles = [textwrap.wrap(keep(f"{r['claim']} ({r['verdict']})"), width) for r in claims]
    sizes = [len(r["cells"]) for r in claims]
    heights = [0.32 * n + 0.55 + 0.13 * len(t) for n, t in zip(sizes, titles)]  # rows + ticks + title lines
    fig, axes = plt.subplots(len(claims), 1, figsize=(9, sum(heights) + 0.4), gridspec_kw=dict(height_ratios=sizes))
    for ax, r, title in zip(axes, claims, titles):
        for y, c in enumerate(r["cells"]):
            sign = c["side"] or 1  # "close to" (side 0) has no side: plotted as labelled
            ax.scatter(sign * np.array(c["per_seed"]), np.full(len(c["per_seed"]), y), s=8, color="grey", alpha=0.6)
            lo, hi = sorted((sign * c["lo"], sign * c["hi"]))
            color = {"reproduced": "tab:green", "contradicted": "tab:red"}.get(c["verdict"], "tab:blue")
            ax.plot([lo, hi], [y, y], color=color, lw=2)
            ax.plot(sign * c["mean"], y, "o", color=color)
        ax.axvline(0, color="k", lw=0.5)
        ax.set_yticks(range(len(r["cells"])), [plotted_label(c["label"], c["side"]) for c in r["cells"]], fontsize=6)
        ax.set_ylim(len(r["cells"]) - 0.5, -0.5)  # first cell on top, as in verdicts.md
        ax.set_title("\n".join(title), fontsize=7, loc="left")
        side = "the paper's side →" if any(c["side"] for c in r["cells"]) else "no side (“close to”)"
        ax.set_title(side, fontsize=6, loc="right", color="dimgrey")
        ax.tick_params(axis="x", labelsize=6)
    axes[-1].set_xlabel("each row: the difference its label names (dots: seeds; bar: mean, 95 % t interval), "
                        "written so that the paper's side is > 0\n(a loss or copy ratio: lower is better; "
                        "an accuracy or needle score: higher is better)", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    return fig


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--summary", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "summary.json"))
    ap.add_argument("--out", default=None, help="folder for verdicts.md/.json (default: the summary's)")
    a = ap.parse_args()
    if not os.path.isfile(a.summary):
        sys.exit(f"error: --summary {a.summary}: no such file (reproduce.py's summary.json of the cpu_char scale)")
    with open(a.summary) as f:
        v = decide(json.load(f))
    out = a.out or os.path.dirname(a.summary)
    with open(os.path.join(out, "verdicts.json"), "w") as f:
        json.dump(v, f, indent=1)
    with open(os.path.join(out, "verdicts.md"), "w") as f:
        f.write(markdown(v))
    figure(v, os.path.join(out, "verdicts.png"))
    print(markdown(v))
