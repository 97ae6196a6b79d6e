"""The synthetic suite's runs used again: a run or an evaluation cut short is judged by the settings it started with
(recorded before it starts), a rescaling evaluates its softmax run at that run's own recipe and trains it once, and a
later call leaves none of an earlier call's files in its results folder. Tiny runs on the CPU."""
import csv
import dataclasses
import json
import os

import pytest

from lib import runs, synthetic
from lib.synthetic_suite import overrides

TINY = ("max_iters=2", "eval_interval=2", "n_embd=16", "ffn_hidden=32", "batch_size=4")


@pytest.fixture
def suite(tmp_path, monkeypatch):
    monkeypatch.setattr(synthetic, "REPO_OUT", str(tmp_path))

    def run(extra=TINY, task="first", **kw):
        monkeypatch.setitem(synthetic.SUITE, task, dataclasses.replace(synthetic.SUITE[task], extra=extra,
                                                                       multiples=(1, 2)))
        synthetic.main(**{"jobs": 1, "n_eval": 4, "settings": ["softmax"], "task_names": [task], "seeds": [0], **kw})
    return run


def test_a_run_cut_short_resumes_only_with_the_settings_it_started_with(suite, tmp_path):
    # its settings were recorded only when it finished: a rerun with others resumed it and recorded only the new ones
    suite()
    run = tmp_path / "out-synthetic" / "first-softmax-s0"
    started = json.loads((run / "train_settings.json").read_text())
    assert started == json.loads((run / "done").read_text())
    (run / "done").unlink()  # killed after a checkpoint, before its marker
    other = (*TINY[:-1], "batch_size=2")
    with pytest.raises(runs.StepError, match=r"the unfinished run .*batch_size=4.*->.*batch_size=2.*--redo"):
        suite(other)
    suite()  # the same settings: it resumes
    (run / "done").unlink()
    (run / "train_settings.json").unlink()  # cut short by a version that recorded nothing before it started
    with pytest.raises(runs.StepError, match="made before settings were recorded"):
        suite()
    suite(other, redo=True)  # made again, from scratch, with the settings asked
    assert "batch_size=2" in json.loads((run / "done").read_text())["overrides"]
    heads = [json.loads(line)["config"]["batch_size"] for line in open(run / "log.jsonl") if '"config"' in line]
    assert heads == [2]  # one training, not a mix of two


def test_an_evaluation_is_judged_by_the_settings_it_started_with(suite, tmp_path):
    suite()
    out = tmp_path / "out-synthetic" / "first-softmax-s0"
    (out / "eval_settings.json").unlink()  # an evaluation whose record is gone: not taken as it is
    with pytest.raises(runs.StepError, match="the evaluation .* made before settings were recorded"):
        suite(n_eval=8)
    suite(n_eval=8, redo=True)
    assert "8" in json.loads((out / "eval_settings.json").read_text())["eval"]
    rows = list(csv.DictReader(open(tmp_path / "out-results" / "synthetic" / "accuracy.csv")))
    assert {r["n"] for r in rows} == {"8"}
    text = (tmp_path / "out-results" / "synthetic" / "summary.json").read_text()  # one seed: no sd, no interval
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in summary.json")) and "null" in text


def test_the_synthetic_suite_leaves_a_results_folder_of_the_lm_suite_untouched(suite, tmp_path):
    results = tmp_path / "out-results" / "synthetic"
    results.mkdir(parents=True)
    lm = json.dumps({"step": "gate (seed 1)", "command": "eval_long.py", "wall_s": 1}) + "\n"
    (results / "steps.jsonl").write_text(lm)
    with pytest.raises(runs.StepError, match="holds the lm suite's results"):
        suite()
    assert os.listdir(results) == ["steps.jsonl"] and (results / "steps.jsonl").read_text() == lm
    assert not (tmp_path / "out-synthetic").exists()  # refused before any run


def test_a_rescaling_evaluates_its_softmax_run_at_that_runs_recipe():
    # softmax-qwen of first-tuned lacked softmax's tuned rate: it refused, or with --redo retrained at 3e-3
    for task in ("first-tuned", "recall-tuned"):
        assert overrides(task, "softmax-qwen") == overrides(task, "softmax")
    assert "learning_rate=0.01" in overrides("first-tuned", "softmax-qwen")


def test_two_rescalings_of_a_seed_train_its_softmax_run_once(suite, tmp_path):
    # without softmax asked, each rescaling trained the one softmax run at once: "in use by process ..."
    suite(settings=["softmax-qwen", "softmax-yarn"], jobs=2)
    res = tmp_path / "out-results" / "synthetic"
    steps = [json.loads(line) for line in open(res / "steps.jsonl")]
    assert [(r["setting"], r["eval_s"] == 0.0) for r in steps][0] == ("softmax", True)  # trained only
    rows = list(csv.DictReader(open(res / "accuracy.csv")))
    assert {r["setting"] for r in rows} == {"softmax-qwen", "softmax-yarn"}


def test_a_call_that_reuses_every_run_reports_its_own_time_apart_from_the_runs_of_every_call(suite, tmp_path,
                                                                                             capsys):
    suite()
    wall = json.loads((tmp_path / "out-synthetic" / "wall.json").read_text())["wall_s"]
    capsys.readouterr()
    suite()  # nothing trains or evaluates: it said "done in 0.1 min", the first call's time, as its own
    out = capsys.readouterr().out
    done = out.splitlines()[-1]
    assert done.startswith("done: this call ") and f"the runs of every call {wall / 60:.1f} min (wall.json)" in done
    from lib.checkpoint import run_info  # reused runs of this very code: no note, made_at this commit
    summary = json.loads((tmp_path / "out-results" / "synthetic" / "summary.json").read_text())
    assert "note:" not in out and summary["made_at"] == {synthetic.code(run_info()): 1}


def test_a_later_call_leaves_no_earlier_calls_attention_files(suite, tmp_path):
    res = tmp_path / "out-results" / "synthetic"
    suite()  # first: diagnosed
    assert (res / "attention.csv").exists() and (res / "attention.png").exists()
    suite(task="flipflop")  # not diagnosed, no verdict endpoint (its report had crashed drawing horizons.png)
    assert not any((res / f).exists() for f in ("attention.csv", "attention.png", "horizons.png"))
    assert (res / "accuracy.png").exists() and "flipflop" in (res / "tables.md").read_text()


def test_a_run_from_before_settings_records_is_taken_as_it_is_evaluation_included(suite, tmp_path):
    # as the lm suite's rule: its evaluation had no record either, and was refused while its training was taken
    suite()
    run = tmp_path / "out-synthetic" / "first-softmax-s0"
    (run / "done").write_text("")
    (run / "train_settings.json").unlink()
    (run / "eval_settings.json").unlink()
    suite()  # neither trained nor evaluated again (the workers print a warning each)
    last = json.loads((tmp_path / "out-results" / "synthetic" / "steps.jsonl").read_text().splitlines()[-1])
    assert not last["ran"]


def test_attention_png_leaves_out_a_settings_entropy_where_any_of_its_runs_lacks_row_mass(monkeypatch):
    # decided by a task's first row: a new run first let an old sigmoid run's raw -sum w log w (9.42 nats) through
    from matplotlib.figure import Figure

    from lib import synthetic_figures
    def row(setting, scorer, seed, L, mass=None):
        return dict(task="first", model=f"first-{setting}-s{seed}", setting=setting, scorer=scorer, length=str(L),
                    layer="0", head="0", target_mass="0.5", entropy="9.42", **({} if mass is None else
                                                                                {"row_mass": mass}))
    rows = [row(s, sc, seed, L, mass) for s, sc in (("sigmoid", "sigmoid"), ("softmax", "softmax"))
            for seed, mass in ((0, "1.3"), (1, None)) for L in (32, 64)]
    figs = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figs.append(self))
    synthetic_figures.attention(rows, "attention.png")
    entropy = figs[0].axes[1]
    assert [line.get_label() for line in entropy.get_lines() if not line.get_label().startswith("_")] == [
        "softmax", "uniform: log L"]  # "_child": each seed's thin line


def test_a_config_file_edited_since_a_run_trained_refuses_its_reuse_old_records_judged_by_the_runs_log(
        suite, tmp_path, monkeypatch):
    # a run's record held its config's name and overrides alone: an edited configs/tasks/first.py was reused silently
    import shutil
    configs = tmp_path / "configs"
    configs.mkdir()
    shutil.copy(synthetic.config_file("first"), configs / "first.py")
    monkeypatch.setitem(synthetic.SUITE, "first", dataclasses.replace(synthetic.SUITE["first"],
                                                                      config=str(configs / "first")))  # a path: its own
    suite()
    run = tmp_path / "out-synthetic" / "first-softmax-s0"
    done = json.loads((run / "done").read_text())
    assert done["values"]["n_layer"] == 2 and done["values"]["task"] == "first"
    legacy = {k: done[k] for k in ("config", "overrides")}  # a record from before values were: its log decides
    (run / "done").write_text(json.dumps(legacy))
    settings = json.loads((run / "eval_settings.json").read_text())
    (run / "eval_settings.json").write_text(json.dumps({**settings, "train": legacy}))
    suite()  # the same values: reused, evaluation included
    assert json.loads((run / "done").read_text()) == legacy
    # fields added since a run trained (none of them set by it): reused, whether its record holds values or not
    gone = ("wandb_run_name", "sft_val_frac", "qk_norm", "qkv_bias")
    older = {k: v for k, v in done["values"].items() if k not in gone}
    (run / "done").write_text(json.dumps({**done, "values": older}))
    suite()
    lines = (run / "log.jsonl").read_text().splitlines()
    head = json.loads(lines[0])
    head["config"] = {k: v for k, v in head["config"].items() if k not in gone}  # a log from before the fields
    (run / "log.jsonl").write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    (run / "done").write_text(json.dumps(legacy))
    suite()
    with open(configs / "first.py", "a") as f:
        f.write("\nn_layer = 1\n")
    with pytest.raises(runs.StepError, match=r"the run .*first-softmax-s0 .*values.n_layer 2 -> 1.*--redo"):
        suite()
    (run / "done").write_text(json.dumps(done))  # a record with values: the same refusal
    with pytest.raises(runs.StepError, match=r"values.n_layer 2 -> 1"):
        suite()
    suite(redo=True)  # trained again with what the file says now, and evaluated again
    heads = [json.loads(line)["config"]["n_layer"] for line in open(run / "log.jsonl") if '"config"' in line]
    assert heads == [1] and json.loads((run / "eval_settings.json").read_text())["train"]["values"]["n_layer"] == 1


def test_a_run_killed_and_resumed_records_the_whole_trainings_time(tmp_path, monkeypatch):
    # select_budget sums the runs' train_s: a resumed run recorded only its last call's, half of it here
    import time

    from lib import tracking
    clock, real, step, killed = [0.0], time.time, tracking.progress, []

    class Killed(Exception):
        pass

    def progress(record, *a):  # each step takes a minute; the first call dies at iter 3, its checkpoint at 2
        clock[0] += 60
        if record["iter"] == 3 and not killed:
            killed.append(True)
            raise Killed
        step(record, *a)
    monkeypatch.setattr(time, "time", lambda: real() + clock[0])
    monkeypatch.setattr(tracking, "progress", progress)
    over = ["max_iters=4", "eval_interval=2", *TINY[2:]]
    with pytest.raises(Killed):
        synthetic.run_one("first", "softmax", 0, str(tmp_path), 4, synthetic.SUITE["first"], over, evaluate=False)
    r = synthetic.run_one("first", "softmax", 0, str(tmp_path), 4, synthetic.SUITE["first"], over, evaluate=False)
    assert r["ran"] and 4 * 60 <= r["train_s"] < 5 * 60  # iters 0-3, not the resumed 2-3 alone (nor 2-3 twice)


def test_reused_runs_made_at_another_commit_are_named_in_summary_json_and_in_one_printed_line(suite, tmp_path, capsys,
                                                                                               monkeypatch):
    # reuse judges settings alone: runs trained before a committed scorer edit were reported under the new commit
    from lib.checkpoint import run_info
    now, old = synthetic.code(run_info()), "0" * 40
    res, run = tmp_path / "out-results" / "synthetic", tmp_path / "out-synthetic" / "first-softmax-s0"
    e = dataclasses.replace(synthetic.SUITE["first"], extra=TINY, multiples=(1, 2))  # the fixture's run
    monkeypatch.setitem(synthetic.SUITE, "first", e)
    fresh = synthetic.run_one("first", "softmax", 0, str(run.parent), 4, e, overrides("first", "softmax"))
    assert fresh["made_at"] == {"train": [now], "eval": now}
    lines = (run / "log.jsonl").read_text().splitlines()  # trained at an older commit
    head = json.loads(lines[0])
    head["run_info"].update(git_sha=old, git_dirty=False, cpu_capability=None)  # recorded since: None before
    (run / "log.jsonl").write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    evaluated = json.loads((run / "eval" / "settings.json").read_text())  # evaluated before run_info was recorded
    (run / "eval" / "settings.json").write_text(json.dumps({"args": evaluated["args"]}))
    suite()
    out, summary = capsys.readouterr().out, json.loads((res / "summary.json").read_text())
    assert json.loads((res / "steps.jsonl").read_text().splitlines()[-1])["made_at"] == {"train": [old], "eval": None}
    assert summary["made_at"] == {old: 1, "unknown": 1} and synthetic.code(summary["run_info"]) == now
    note = [line for line in out.splitlines() if line.startswith("note:")]
    assert len(note) == 1 and f"1 of 1 runs were reused from other code than this call's ({now})" in note[0]
    assert f"{old} (1), unknown (1)" in note[0] and "--redo" in note[0]


def test_a_run_trained_on_other_cpu_kernels_is_named_as_made_by_other_code(suite, tmp_path, capsys, monkeypatch):
    # AVX2 and AVX-512 kernels train to other weights: a run of this commit on AVX2 was reused as this call's own
    from lib.checkpoint import run_info
    now = synthetic.code(run_info())
    run = tmp_path / "out-synthetic" / "first-softmax-s0"
    e = dataclasses.replace(synthetic.SUITE["first"], extra=TINY, multiples=(1, 2))
    monkeypatch.setitem(synthetic.SUITE, "first", e)
    synthetic.run_one("first", "softmax", 0, str(run.parent), 4, e, overrides("first", "softmax"))
    lines = (run / "log.jsonl").read_text().splitlines()
    head = json.loads(lines[0])
    other = "AVX2" if head["run_info"]["cpu_capability"] != "AVX2" else "DEFAULT"
    head["run_info"]["cpu_capability"] = other
    (run / "log.jsonl").write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    suite()
    note = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert now.endswith(f" on {run_info()['cpu_capability']}") and len(note) == 1
    assert f"on {other} (1)" in note[0]
