"""reproduce.py --rereport (lib/rereport.py): every committed results folder's summary.json and tables.md are what
today's statistics give from the per-seed data the folder holds; a folder that lacks an input of its summary, or has
an older layout, is refused in one line and left as it was; cpu_rise's analyse.py writes its committed numbers
again. CPU only, no training (test_committed_rows.py: one level down, each per-seed file against its rows)."""
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
    (dst / "tables.md").write_text("a stale table\n")  # so that equal tables below are written again, not left
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


def test_a_folder_a_reproduction_is_writing_is_refused_untouched(tmp_path):
    from lib.folders import FolderError, held
    dst = copy("synthetic-first-long", tmp_path)
    before = (dst / "summary.json").read_bytes()
    with held(str(dst), "a reproduction's results"):  # as lm_suite and synthetic hold it while they write
        with pytest.raises(FolderError, match="is in use: a reproduction's results is being written by process"):
            rereport(str(dst))
    assert (dst / "summary.json").read_bytes() == before


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

