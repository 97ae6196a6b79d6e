"""One level below the summaries (test_rereport.py): each committed per-run or per-seed result file is what the rows
committed beside it give. eval_long's window means and its paired bootstrap differences from per_sequence.csv.gz (the
same resamples: its --n_boot and --seed), needle's and passkey's cells from their graded rows (as graded then: the
grader changed since, RESULTS.md says how much), the copy gate's losses and ratios from its per-sequence losses, the
synthetic suite's accuracy.csv from per_prompt.csv.gz. CPU only, reading only."""
import csv
import glob
import gzip
import json
import os
from collections import defaultdict

import numpy as np
import pytest

from lib import compare
from test_rereport import FOLDERS, RESULTS, same


def rows(path):
    with (gzip.open(path, "rt", newline="") if path.endswith(".gz") else open(path, newline="")) as f:
        return list(csv.DictReader(f))


def beside(summary, name):  # results/ keeps CSVs gzipped (--commit-results), a few folders as written
    path = os.path.join(os.path.dirname(summary), name)
    return path + ".gz" if os.path.isfile(path + ".gz") else path


def summaries(pattern):
    return sorted(os.path.relpath(p, RESULTS) for p in glob.glob(os.path.join(RESULTS, pattern)))


EVAL_LONG = [p for p in summaries("*/s*/*/summary.json") if os.path.isfile(beside(os.path.join(RESULTS, p),
                                                                                  "per_sequence.csv"))
             and "differences" in json.load(open(os.path.join(RESULTS, p)))]
RETRIEVAL = summaries("*/s*/needle*/needle.json") + summaries("*/s*/needle*/passkey.json") + \
    summaries("*/needle/needle.json") + summaries("*/needle/passkey.json")
COPY = summaries("*/s*/copy*/summary.json")


def test_the_committed_evaluations_are_all_found():
    assert len(EVAL_LONG) >= 30 and len(RETRIEVAL) >= 40 and len(COPY) >= 50  # cpu_char: 10 seeds of each


@pytest.mark.parametrize("path", EVAL_LONG)
def test_eval_longs_window_means_and_paired_differences_are_its_per_sequence_rows(path):
    path = os.path.join(RESULTS, path)
    s, got = json.load(open(path)), rows(beside(path, "per_sequence.csv"))
    loss = defaultdict(list)
    for r in got:
        loss[r["model"], r["rope"], r["window"]].append(float(r["loss"]))
    for m in s["models"]:
        first = "extended" if s["args"]["rope_method"] != "none" else "native"  # rope.eval_passes' first pass
        for rope, windows in ((first, m["windows"]), ("native", m.get("native", {}).get("windows", {}))):
            for w, v in windows.items():
                assert v["mean_loss"] == pytest.approx(np.mean(loss[m["label"], rope, w]), rel=1e-12), (m["label"], w)
    again = compare.paired_differences(got, s["baseline"], s["args"]["n_boot"], s["args"]["seed"])
    assert len(again) == len(s["differences"])  # results/cpu's predate the baseline_tokens column: its own columns
    same([{k: d[k] for k in old} for d, old in zip(again, s["differences"])], s["differences"])


@pytest.mark.parametrize("path", RETRIEVAL)
def test_a_retrieval_cell_is_the_share_of_its_graded_rows(path):
    path = os.path.join(RESULTS, path)
    s = json.load(open(path))
    depth = "depth" in s["cells"][0]  # needle's cells are per depth, passkey's pooled over its random depths
    graded = defaultdict(list)
    for r in rows(beside(path, os.path.basename(path)[:-len(".json")] + ".csv")):
        graded[r["model"], int(r["context"]), int(r["depth"]) if depth else None].append(r["score"])
    assert len(graded) == len(s["cells"])
    for c in s["cells"]:
        scores = graded[c["model"], c["context"], c["depth"] if depth else None]
        assert c["n"] == len(scores)
        assert c["accuracy"] == pytest.approx(scores.count("exact") / len(scores), abs=1e-12)
        assert c["first_digit"] == pytest.approx((scores.count("exact") + scores.count("first_digit"))
                                                 / len(scores), abs=1e-12)


@pytest.mark.parametrize("path", COPY)
def test_the_copy_gates_losses_and_ratio_by_distance_are_its_per_sequence_losses(path):
    path = os.path.join(RESULTS, path)
    s, by = json.load(open(path)), defaultdict(list)
    for r in rows(beside(path, "per_sequence.csv")):
        by[r["model"], f"{float(r['distance_x']):g}"].append(r)  # "1" or "1.0", as the CSV was written
    for m in s["models"]:
        for k, d in m["by_distance"].items():
            got = by[m["label"], k]
            means = {x: np.mean([float(r[x]) for r in got]) for x in ("first", "second", "control")}
            assert {x: d[x] for x in means} == pytest.approx(means, rel=1e-12)
            assert d["distance"] == int(got[0]["distance"])
            assert d["ratio"] == pytest.approx(means["second"] / means["control"], rel=1e-12)


@pytest.mark.parametrize("name", [d for d in FOLDERS if os.path.isfile(os.path.join(RESULTS, d, "per_prompt.csv.gz"))])
def test_a_committed_accuracy_csv_is_the_mean_of_its_per_prompt_rows(name):
    """Each row of accuracy.csv (one run at one length) against the prompts it was graded from: n, accuracy (the
    share correct) and the mean answer loss, or for linear the MSE (its per-prompt answer_loss is the squared error)."""
    prompts = defaultdict(list)
    for r in rows(os.path.join(RESULTS, name, "per_prompt.csv.gz")):
        prompts[r["task"], r["setting"], r["seed"], r["length"], r["condition"], r["rope"]].append(r)
    reported = compare.read_csv(os.path.join(RESULTS, name, "accuracy.csv"))
    assert len(reported) == len(prompts)  # no run graded but not reported, none reported but not graded
    for a in reported:
        got = prompts[a["task"], a["setting"], a["seed"], a["length"], a["condition"], a["rope"]]
        loss = sum(float(p["answer_loss"]) for p in got) / len(got)
        assert int(a["n"]) == len(got) == len({p["prompt_id"] for p in got}), a["model"]
        if a["mse"]:
            assert float(a["mse"]) == pytest.approx(loss, rel=1e-12) and a["accuracy"] == "", a["model"]
        else:
            assert float(a["accuracy"]) == pytest.approx(sum(float(p["correct"]) for p in got) / len(got), abs=1e-12)
            assert float(a["loss"]) == pytest.approx(loss, rel=1e-12), a["model"]
