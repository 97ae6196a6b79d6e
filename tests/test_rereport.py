"""reproduce.py --rereport (lib/rereport.py): every committed results folder's summary.json and tables.md are what
today's statistics give from the per-seed data the folder holds; a folder that lacks an input of its summary, or has
an older layout, is refused in one line and left as it was; each accuracy.csv is the mean of its per-prompt rows.
CPU only, no training."""
import json
import os
import re
import shutil

import pytest

import reproduce
from lib.corpora import DataError
from lib.rereport import rereport, section

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "results")
REFUSED = {"cpu_char_pilot": "eval_long_theta, eval_long_dynamic_ntk can't be recomputed",  # not kept by the pilot
           "synthetic-recall-noise": "lacks the column(s) setting, base"}  # written before those columns
FOLDERS = sorted(d for d in os.listdir(RESULTS) if os.path.isfile(os.path.join(RESULTS, d, "summary.json")))


def copy(name, tmp_path):
    """The folder's own files copied, its subfolders' files linked (rereport writes only at the top: a write through
    a link would change the committed file, so the top is copied)."""
    src, dst = os.path.join(RESULTS, name), tmp_path / name
    dst.mkdir()
    for entry in os.listdir(src):
        path = os.path.join(src, entry)
        if os.path.isdir(path):
            shutil.copytree(path, dst / entry, copy_function=os.symlink)
        else:
            shutil.copy2(path, dst / entry)
    return dst


def same(a, b, where=""):
    """Equal, floats to 1e-12 (another machine's last bits), with the first place that differs named."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert sorted(a) == sorted(b), where
        for k in a:
            same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-12, abs=1e-12, nan_ok=True), where
    else:
        assert a == b, where


def computed(summary):  # the sections the statistics make, not the run's head
    if "tasks_summary" in summary:
        return {"rule": summary["rule"], "tasks_summary": summary["tasks_summary"]}
    return {k: v for k, v in summary.items() if section(k)}


def test_the_committed_folders_include_both_suites_and_the_refused_ones():
    assert {"cpu", "cpu_char", "synthetic", *REFUSED} <= set(FOLDERS)


@pytest.mark.parametrize("name", [d for d in FOLDERS if d not in REFUSED])
def test_a_committed_summary_and_its_tables_are_what_todays_statistics_give_from_its_own_data(name, tmp_path):
    dst = copy(name, tmp_path)
    rereport(str(dst))
    with open(os.path.join(RESULTS, name, "summary.json")) as f:
        committed = json.load(f)
    with open(dst / "summary.json") as f:
        again = json.load(f)
    same(computed(again), computed(committed))
    head = lambda s: {k: v for k, v in s.items() if k not in computed(s) and k != "rereport_run_info"}
    assert head(again) == head(committed) and head(again)  # the run's head kept as the run wrote it
    assert again["rereport_run_info"]["git_sha"]
    with open(os.path.join(RESULTS, name, "tables.md")) as f:
        assert (dst / "tables.md").read_text() == f.read()  # the numbers RESULTS.md quotes, to their last digit


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_folder_lacking_an_input_of_its_summary_is_refused_by_name_and_left_byte_for_byte(name, tmp_path):
    dst = copy(name, tmp_path)
    before = {p: (dst / p).read_bytes() for p in os.listdir(dst) if (dst / p).is_file()}
    with pytest.raises(DataError, match=re.escape(REFUSED[name])):
        rereport(str(dst))
    assert {p: (dst / p).read_bytes() for p in os.listdir(dst) if (dst / p).is_file()} == before
    assert sorted(os.listdir(tmp_path)) == [name]  # and no scratch folder left beside it


def test_the_command_line_rereports_a_folder_alone_and_refuses_other_options_and_a_folder_without_summary(
        tmp_path, capsys):
    dst = copy("synthetic-first-long", tmp_path)
    reproduce.main(["--rereport", str(dst) + "/"])
    assert f"rereported: {dst / 'summary.json'}" in capsys.readouterr().out
    assert "rereport_run_info" in json.loads((dst / "summary.json").read_text())
    for argv, message in ((["--seeds", "3"], "error: --rereport takes no other option (--seeds)"),
                          (["--commit-results"], "error: --rereport takes no other option (--commit-results)")):
        with pytest.raises(SystemExit) as e:
            reproduce.main(["--rereport", str(dst), *argv])
        assert str(e.value).startswith(message)
    with pytest.raises(SystemExit) as e:
        reproduce.main(["--rereport", str(tmp_path)])
    assert str(e.value) == f"error: {tmp_path}: no summary.json; --rereport reads a results folder that " \
                           "reproduce.py wrote"


def test_cpu_rise_analyse_writes_the_committed_numbers_again_from_the_committed_rows(tmp_path, monkeypatch):
    """results/cpu_rise/analyse.py from its committed per-seed rows (the rows' data path is relative: the english
    corpus is prepared under tmp_path, where the script runs)."""
    import subprocess, sys
    from lib import compare, dataset
    dataset.prepare("english", out_dir=str(tmp_path / "data"))
    src = os.path.join(RESULTS, "cpu_rise")
    got = subprocess.run([sys.executable, os.path.join(src, "analyse.py"), "--rows", src, "--out", str(tmp_path)],
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    with open(os.path.join(src, "rise_summary.json")) as f:
        same(json.loads((tmp_path / "rise_summary.json").read_text()), json.load(f))
    for name in ("rise_by_seed.csv", "rise_paired.csv"):
        committed, again = compare.read_csv(os.path.join(src, name)), compare.read_csv(str(tmp_path / name))
        assert [list(r) for r in again] == [list(r) for r in committed] and len(again) == len(committed)
        for a, b in zip(again, committed):
            same({k: number(v) for k, v in a.items()}, {k: number(v) for k, v in b.items()})


def number(v):
    try:
        return float(v)
    except ValueError:
        return v


@pytest.mark.parametrize("name", [d for d in FOLDERS if os.path.isfile(os.path.join(RESULTS, d, "per_prompt.csv.gz"))])
def test_a_committed_accuracy_csv_is_the_mean_of_its_per_prompt_rows(name):
    """Each row of accuracy.csv (one run at one length) against the prompts it was graded from: n, accuracy (the
    share correct) and the mean answer loss, or for linear the MSE (its per-prompt answer_loss is the squared error)."""
    import csv, gzip
    from lib import compare
    with gzip.open(os.path.join(RESULTS, name, "per_prompt.csv.gz"), "rt", newline="") as f:
        prompts = {}
        for r in csv.DictReader(f):
            key = (r["task"], r["setting"], r["seed"], r["length"], r["condition"], r["rope"])
            prompts.setdefault(key, []).append(r)
    rows = compare.read_csv(os.path.join(RESULTS, name, "accuracy.csv"))
    assert len(rows) == len(prompts)  # no run graded but not reported, none reported but not graded
    for a in rows:
        got = prompts[a["task"], a["setting"], a["seed"], a["length"], a["condition"], a["rope"]]
        loss = sum(float(p["answer_loss"]) for p in got) / len(got)
        assert int(a["n"]) == len(got) == len({p["prompt_id"] for p in got}), a["model"]
        if a["mse"]:
            assert float(a["mse"]) == pytest.approx(loss, rel=1e-12) and a["accuracy"] == "", a["model"]
        else:
            assert float(a["accuracy"]) == pytest.approx(sum(float(p["correct"]) for p in got) / len(got), abs=1e-12)
            assert float(a["loss"]) == pytest.approx(loss, rel=1e-12), a["model"]
