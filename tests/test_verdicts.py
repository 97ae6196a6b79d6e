"""results/cpu_char's scripts: verdicts.py's pre-registered decision rule, cell by cell and claim by claim; explore.py;
retrain_losses.py (the recorded commands it reruns); each refuses bad input in one line."""
import importlib.util
import os

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(name):  # results/cpu_char's scripts are not a package
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "results", "cpu_char", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


verdicts = load("verdicts")


def test_a_cell_is_decided_by_its_interval_and_sign_flip_p_on_the_papers_side_and_needs_ten_seeds():
    up = np.linspace(0.1, 0.3, 10)  # every seed > 0: p = 2 / 1024
    assert verdicts.cell(up, +1)["verdict"] == "reproduced"
    assert verdicts.cell(up, -1)["verdict"] == "contradicted"
    assert verdicts.cell(up - 0.2, +1)["verdict"] == "inconclusive"  # straddles 0
    assert verdicts.cell(np.zeros(10), +1)["verdict"] == "inconclusive"  # no difference: p = 1
    assert verdicts.cell(up[:9], +1)["verdict"] == "no verdict (9 seeds)"
    assert verdicts.cell(up, 0)["verdict"] == "inconclusive"  # "close to": no margin was stated
    c = verdicts.cell(up, +1)
    assert c["lo"] < c["mean"] < c["hi"] and c["p"] == 2 / 1024 and c["n"] == 10


def test_a_claim_is_reproduced_only_when_every_cell_is_and_contradicted_when_one_is_and_none_reproduced():
    cells = lambda *v: [dict(verdict=x) for x in v]
    assert verdicts.aggregate(cells("reproduced", "reproduced")) == "reproduced"
    assert verdicts.aggregate(cells("reproduced", "inconclusive")) == "inconclusive"
    assert verdicts.aggregate(cells("contradicted", "inconclusive")) == "contradicted"
    assert verdicts.aggregate(cells("contradicted", "reproduced")) == "inconclusive"
    assert verdicts.aggregate(cells("no verdict (5 seeds)", "no verdict (5 seeds)")) == "no verdict (5 seeds)"
    for order in (("reproduced", "no verdict (8 seeds)"), ("no verdict (8 seeds)", "reproduced")):  # any order
        assert verdicts.aggregate(cells(*order)) == "no verdict (8 seeds)"


def test_every_claim_of_the_committed_summary_shows_the_papers_result_beside_its_gate_and_cells():
    import json
    with open(os.path.join(REPO, "results", "cpu_char", "summary.json")) as f:
        v = verdicts.decide(json.load(f))
    assert len(v["claims"]) == 13
    for r in v["claims"]:
        assert r["paper"] and r["cells"] and r["gate"]
    table = verdicts.markdown(v).splitlines()
    rows = [x for x in table if x.startswith("| ") and not x.startswith("| claim")]
    assert len(rows) == 13 and all(x.count(" | ") == 5 for x in rows)
    # Holm beside the rule (issue #47): no cell of 59 survives (the least p, 2/1024, times 59 is 0.115); over the 13
    # claims FoX's reproduction (its cells' largest p, 2/1024) and SSA's contradiction (4/1024) do, (e)'s does not
    claims = {r["claim"].split(":")[0]: r for r in v["claims"]}
    assert sum(len(r["cells"]) for r in v["claims"]) == 59
    assert min(c["holm_p"] for r in v["claims"] for c in r["cells"]) == pytest.approx(59 * 2 / 1024)
    assert claims["FoX"]["holm_p"] == pytest.approx(13 * 2 / 1024) and claims["FoX"]["verdict"] == "reproduced"
    assert claims["SSA"]["holm_p"] == pytest.approx(12 * 4 / 1024) and 12 * 4 / 1024 < 0.05
    assert next(r for r in v["claims"] if r["verdict"] == "contradicted" and r is not claims["SSA"])["holm_p"] > 0.05


def test_the_figure_plots_each_rows_labelled_difference_and_wraps_titles_whole_without_overlaps(tmp_path):
    """verdicts.png had plotted softmax − ssa under the label "ssa − softmax" (a side < 0 turns the cell round) and
    cut titles at 110 characters: every row's mean sits at its label's difference, recomputed from the summary, and
    every title reads whole; no title, tick label or axis label overlaps another panel's."""
    import json
    with open(os.path.join(REPO, "results", "cpu_char", "summary.json")) as f:
        s = json.load(f)
    v = verdicts.decide(s)
    fig = verdicts.figure(v, tmp_path / "verdicts.png")
    mean = {}  # (first, second, rest) -> the mean of first − second, from the table's cells
    for c in (c for r in v["claims"] for c in r["cells"]):
        diff, rest = c["label"].split(", ", 1)
        if " − " in diff:
            a, b = diff.split(" − ")
            mean[a, b, rest], mean[b, a, rest] = c["mean"], -c["mean"]
    ssa = s["losses"]["ssa"]["per_seed"]
    softmax = s["losses"]["softmax"]["per_seed"]
    assert mean["softmax", "ssa", "val loss"] == pytest.approx(np.mean([softmax[k]["val_loss"] - ssa[k]["val_loss"]
                                                                        for k in ssa if k in softmax]))
    renderer = fig.canvas.get_renderer()
    fig.canvas.draw()
    checked = 0
    for ax, r in zip(fig.axes, v["claims"]):
        labels = [t.get_text() for t in ax.get_yticklabels()]
        dots = sorted((line.get_ydata()[0], line.get_xdata()[0]) for line in ax.lines if line.get_marker() == "o")
        assert len(dots) == len(labels) == len(r["cells"])
        for (y, x), label, c in zip(dots, labels, r["cells"]):
            diff, rest = label.split(", ", 1)
            if " − " in diff:  # e.g. "softmax − ssa, val loss": its mean, on its side of 0
                a, b = diff.split(" − ")
                assert x == pytest.approx(mean[a, b, rest]), (label, x)
                checked += 1
            else:  # "ssmax, needle − control span (best head)": as recorded
                assert label == c["label"] and x == pytest.approx(c["mean"])
        title = ax.get_title(loc="left")
        assert title.replace("\n", " ").replace("\u00a0", " ") == f"{r['claim']} ({r['verdict']})"
        left, right = ax.title.get_window_extent(renderer), ax._right_title.get_window_extent(renderer)
        assert not left.overlaps(right) and right.x1 <= fig.bbox.x1 and left.y1 <= fig.bbox.y1
    assert checked == 58 and "softmax − ssa, val loss" in [t.get_text() for a in fig.axes for t in a.get_yticklabels()]
    boxes = [ax.get_tightbbox(renderer) for ax in fig.axes]  # title, tick labels and axis labels included
    assert all(not upper.overlaps(lower) for upper, lower in zip(boxes, boxes[1:]))
    assert all(b.x0 >= 0 and b.y0 >= 0 and b.x1 <= fig.bbox.x1 and b.y1 <= fig.bbox.y1 for b in boxes)


def test_explore_averages_each_seeds_sequences_before_pairing_by_seed(tmp_path):
    import csv, gzip
    explore = load("explore")
    for seed, shift in ((1, 0.0), (2, 0.5)):  # seed 2: every loss 0.5 higher; its paired differences stay the same
        os.makedirs(tmp_path / f"s{seed}" / "eval_long_theta")
        with gzip.open(tmp_path / f"s{seed}" / "eval_long_theta" / "per_sequence.csv.gz", "wt", newline="") as f:
            w = csv.writer(f)
            w.writerow(["model", "rope", "window", "loss"])
            for seq_loss in (1.0, 2.0):  # two sequences: the seed's mean is 1.5 (+ shift)
                w.writerow(["softmax", "extended", "1x", seq_loss + shift])
                w.writerow(["softmax", "extended", "4x", seq_loss + shift + 0.25])
                w.writerow(["fox", "native", "4x", seq_loss + shift - 1.0])
            if seed == 1:
                w.writerow(["fox", "native", "8x", 9.0])  # only one seed has it: left out
    W = explore.seed_windows(str(tmp_path), [1, 2], "theta")
    assert set(W) == {("softmax", "extended", "1x"), ("softmax", "extended", "4x"), ("fox", "native", "4x")}
    np.testing.assert_allclose(W["softmax", "extended", "1x"], [1.5, 2.0])
    c = explore.contrast("rise", W["softmax", "extended", "4x"] - W["softmax", "extended", "1x"])
    assert c["per_seed"] == [0.25, 0.25] and abs(c["mean"] - 0.25) < 1e-12 and c["verdict"] == "exploratory"
    d = explore.contrast("fox", W["fox", "native", "4x"] - W["softmax", "extended", "4x"])
    np.testing.assert_allclose(d["per_seed"], [-1.25, -1.25])


def test_explore_texts_as_the_unit_average_each_text_over_the_seeds(tmp_path):
    import csv, gzip
    explore = load("explore")
    for seed, shift in ((1, 0.0), (2, 0.4)):  # every seed reads the same two texts (sequence id and start)
        os.makedirs(tmp_path / f"s{seed}" / "eval_long_theta")
        with gzip.open(tmp_path / f"s{seed}" / "eval_long_theta" / "per_sequence.csv.gz", "wt", newline="") as f:
            w = csv.writer(f)
            w.writerow(["model", "rope", "window", "sequence", "start", "loss"])
            w.writerow(["fox", "native", "2x", 0, 100, 1.0 + shift])
            w.writerow(["fox", "native", "2x", 1, 900, 3.0 + shift])
            if seed == 1:
                w.writerow(["fox", "native", "2x", 2, 500, 9.0])  # a text only one seed read: left out
    T = explore.text_windows(str(tmp_path), [1, 2], "theta")
    np.testing.assert_allclose(T["fox", "native", "2x"], [1.2, 3.2])  # per text, the mean of its two seeds


def test_retrain_losses_runs_each_seeds_recorded_training_commands_and_keeps_their_logs(monkeypatch):
    """retrain_losses.py (it had rotted: it imported a step runner lib/runs.py no longer has) with a stand-in for the
    step runner: the three training steps of steps.jsonl, first recorded run each, one core, then the kept logs."""
    import json
    retrain = load("retrain_losses")
    here = os.path.join(REPO, "results", "cpu_char")
    first = {}
    for line in open(os.path.join(here, "steps.jsonl")):
        r = json.loads(line)
        first.setdefault(r["step"], r["command"].split(" "))
    ran, kept = [], []
    steps = type("Steps", (), {"run": lambda self, name, cmd, threads=None: ran.append((name, cmd, threads))})()
    monkeypatch.setattr(retrain, "keep_train_log", lambda *a: kept.append(a))
    retrain.retrain(1339, steps)
    assert ran == [(f"re{n} (seed 1339, its log was lost)", first[f"{n} (seed 1339)"], 1) for n in retrain.STEPS]
    out_dir = next(a.split("=", 1)[1].strip("'") for a in first["train ssa (seed 1339)"] if a.startswith("out_dir="))
    assert kept == [(os.path.dirname(out_dir), ["softmax", "ssa"], os.path.join(here, "s1339", "train_log.csv.gz"))]
    with pytest.raises(retrain.StepError, match="records no step 'train softmax to the switch \\(seed 999\\)'"):
        retrain.retrain(999, steps)


@pytest.mark.parametrize("script, argv, message", [
    ("verdicts", ["--summary", "none.json"], "error: --summary none.json: no such file"),
    ("explore", ["--bogus"], "error: unrecognized arguments: --bogus"),  # it had run, ignoring it, and rewritten
    ("retrain_losses", ["--seeds", "999"], "error: --seeds 999: "),
])
def test_the_cpu_char_scripts_refuse_bad_input_in_one_line_before_writing(script, argv, message, tmp_path):
    import subprocess, sys
    committed = sorted(os.listdir(os.path.join(REPO, "results", "cpu_char")))
    got = subprocess.run([sys.executable, os.path.join(REPO, "results", "cpu_char", f"{script}.py"), *argv],
                         cwd=tmp_path, capture_output=True, text=True)
    assert got.returncode != 0 and got.stderr.startswith(message) and len(got.stderr.strip().splitlines()) == 1
    # nothing written, here or into the committed folder (retrain_losses' Steps had written its wall.json there)
    assert os.listdir(tmp_path) == [] and sorted(os.listdir(os.path.join(REPO, "results", "cpu_char"))) == committed
