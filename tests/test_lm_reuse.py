"""The lm suite reuses only what was made as asked now: an output left by a run killed before its record is judged
by the settings it started with (lib/runs.py's started.json); a retrieval step made under other grading rules is
refused. (summary.json leaving out a skipped step's output made with other training: tests/test_reproduce.py, on its
toy run.)"""
import json
import os
import subprocess
import sys
from dataclasses import field, make_dataclass

import pytest
import torch

from lib import runs
from test_reproduce import TOY  # the GPT-2-token toy's model and training


def mark_step(tmp_path, exit_status=0):
    """A step that writes its output (its argument) and exits with exit_status: 1 stands for a kill after the output."""
    script = tmp_path / f"mark{exit_status}.py"
    script.write_text(f"import sys; open(sys.argv[1], 'w').write(sys.argv[2]); sys.exit({exit_status})\n")
    return lambda steps, out, it: steps.run("eval x", [str(script), str(out), str(it)], str(out),
                                            settings={"train": {"max_iters": it}})


def test_an_output_left_by_a_kill_before_its_record_is_judged_by_the_settings_it_started_with(tmp_path):
    res = tmp_path / "res"
    res.mkdir()
    out = res / "out.txt"
    with pytest.raises(runs.StepError, match="failed"):  # the output is made, the run dies before steps.jsonl
        mark_step(tmp_path, exit_status=1)(runs.Steps(str(res)), out, 16)
    assert out.read_text() == "16" and not (res / "steps.jsonl").exists()
    run = mark_step(tmp_path)
    with pytest.raises(runs.StepError, match=r"train.max_iters 16 -> 20\): --redo"):  # not taken as it is
        run(runs.Steps(str(res)), out, 20)
    assert out.read_text() == "16"
    run(runs.Steps(str(res)), out, 16)  # what it started with: reused
    assert out.read_text() == "16" and not (res / "steps.jsonl").exists()
    steps = runs.Steps(str(res), redo=True)
    run(steps, out, 20)
    assert out.read_text() == "20" and steps.ran("train") == {"max_iters": 20}
    assert not (res / "started.json").exists()  # done: its record is steps.jsonl's line


def test_an_output_with_no_record_is_taken_as_it_is_only_where_no_record_carries_settings(tmp_path, capsys):
    res = tmp_path / "res"
    res.mkdir()
    out, run = res / "out.txt", mark_step(tmp_path)
    out.write_text("16")  # an older call's output whose records were lost (the auditor's a2.py)
    other = {"step": "gate", "command": "", "wall_s": 1, "settings": {"train": {"max_iters": 16}}}
    (res / "steps.jsonl").write_text(json.dumps(other) + "\n")
    with pytest.raises(runs.StepError, match="no record of its settings"):
        run(runs.Steps(str(res)), out, 20)
    run(runs.Steps(str(res), redo=True), out, 20)
    assert out.read_text() == "20"
    # a folder whose steps.jsonl predates settings records altogether: its outputs are taken as they are
    (res / "steps.jsonl").write_text(json.dumps({k: v for k, v in other.items() if k != "settings"}) + "\n")
    assert not (res / "started.json").exists()
    run(runs.Steps(str(res)), out, 40)
    assert out.read_text() == "20" and "made before settings were recorded" in capsys.readouterr().out


def test_a_suite_refuses_the_other_suites_results_folder_and_a_train_py_runs_folder(tmp_path):
    # reproduce.py --suite synthetic --name qa rewrote the lm suite's out-results/qa/summary.json, and back again
    res, run_dir = tmp_path / "res", tmp_path / "runs"
    res.mkdir()
    run_dir.mkdir()
    runs.own_folders("synthetic", str(res), str(run_dir))  # empty folders: either suite's
    (res / "steps.jsonl").write_text(json.dumps({"step": "gate (seed 1)", "command": "eval_long.py"}) + "\n")
    runs.own_folders("lm", str(res), str(run_dir))
    with pytest.raises(runs.StepError, match="holds the lm suite's results; nothing was written: give the "
                                             "synthetic suite another --name"):
        runs.own_folders("synthetic", str(res), str(run_dir))
    (res / "steps.jsonl").write_text(json.dumps({"task": "recall", "setting": "softmax", "seed": 0}) + "\n")
    with pytest.raises(runs.StepError, match="holds the synthetic suite's results"):
        runs.own_folders("lm", str(res), str(run_dir))
    (run_dir / "log.jsonl").write_text("")  # --name quick: the synthetic runs in the quickstart's out-quick/
    with pytest.raises(runs.StepError, match=r"runs holds a train.py run \(log.jsonl\)"):
        runs.own_folders("synthetic", str(tmp_path / "elsewhere"), str(run_dir))


def test_a_retrieval_step_made_under_older_rules_is_not_reused(tmp_path):
    """needle.py's steps record retrieval.RULES (how answers are graded, which row the score reads): one made under
    other rules (or before they were recorded) is refused without --redo, as other training is; other steps not."""
    from lib import lm_suite, retrieval
    S = {"model": TOY["model"], "train": TOY["train"]}
    needle = lm_suite.eval_settings(["needle.py", "needle"], S, "data/x", 1, ["softmax"])
    assert needle["rules"] == retrieval.RULES
    assert "rules" not in lm_suite.eval_settings(["eval_long.py"], S, "data/x", 1, ["softmax"])
    older = {**needle, "rules": "answers: any a-j letter"}
    assert runs.mismatch(older, needle) and runs.mismatch({k: v for k, v in needle.items() if k != "rules"}, needle)
    with pytest.raises(runs.StepError, match="rules"):
        runs.judge(older, needle, "step 'needle'", False, [str(tmp_path / "needle")])


def toy_data(tmp_path, sha):
    """A dataset folder whose meta.json records its splits' sha256 as prepare_data.py writes it."""
    data = tmp_path / "data" / "english"
    data.mkdir(parents=True, exist_ok=True)
    (data / "meta.json").write_text(json.dumps({"sha256": {"train": sha, "val": "v"}}))
    return str(data)


def recorded(res, settings):
    """A results folder holding one done step, "gate", made with `settings`."""
    res.mkdir(exist_ok=True)
    (res / "steps.jsonl").write_text(json.dumps(dict(step="gate", command="", wall_s=1, settings=runs.plain(settings)))
                                     + "\n")
    return str(res)


def test_steps_and_runs_made_before_the_dataset_was_prepared_again_are_refused(tmp_path):
    from lib import lm_suite
    S = {"model": TOY["model"], "train": TOY["train"]}
    asked = lambda data: lm_suite.eval_settings(["eval_long.py"], S, data, 1, ["softmax"])  # noqa: E731
    res = recorded(tmp_path / "res", asked(toy_data(tmp_path, "old")))
    assert runs.Steps(res).reuse("gate", asked(toy_data(tmp_path, "old")))  # the same splits: reused
    with pytest.raises(runs.StepError, match=r'train.sha256.train "old" -> "new"\): --redo'):
        runs.Steps(res).reuse("gate", asked(toy_data(tmp_path, "new")))  # made again under the same name
    # a seed's runs: what its checkpoints trained on decides, even where no settings.json records it
    root = tmp_path / "s1"
    (root / "softmax").mkdir(parents=True)
    torch.save({"model": {}, "model_args": {}, "iter_num": 8, "data_state": {"sha256": {"train": "old", "val": "v"}}},
               root / "softmax" / "ckpt.pt")
    want = {"train": lm_suite.trained_with(S, toy_data(tmp_path, "new")), "variants": {"softmax": {}}}
    with pytest.raises(runs.StepError, match=r'train.sha256.train "old" -> "new"'):
        runs.check_runs(str(root), want, redo=False)
    runs.check_runs(str(root), want, redo=True)  # scratch: trained again on the new splits
    assert not (root / "softmax").exists()


def test_a_default_changed_since_a_step_is_refused_and_a_record_from_before_values_is_judged_as_before(
        tmp_path, monkeypatch):
    from lib import config, lm_suite
    S, data = {"model": TOY["model"], "train": TOY["train"]}, toy_data(tmp_path, "same")
    asked = lambda: lm_suite.eval_settings(["eval_long.py"], S, data, 1, ["softmax"])  # noqa: E731
    now = asked()
    with monkeypatch.context() as m:  # TrainConfig's weight_decay defaulted to 0.05 when the step ran
        m.setattr(config, "TrainConfig", make_dataclass("TrainConfig", [("weight_decay", float, field(default=0.05))],
                                                        bases=(config.TrainConfig,)))
        res = recorded(tmp_path / "res", asked())
    with pytest.raises(runs.StepError, match=r"train.values.weight_decay 0.05 -> 0.1\): --redo"):
        runs.Steps(res).reuse("gate", now)
    added = runs.plain(now)  # a config field added since the step ran: taken at today's value
    del added["train"]["values"]["copy_kind"]
    assert runs.Steps(recorded(tmp_path / "added", added)).reuse("gate", now)
    # a record from before the splits' sha256 and the values were recorded: judged by the fields it holds
    older = {**runs.plain(now), "train": {k: v for k, v in runs.plain(now)["train"].items() if k not in runs.ADDED}}
    assert runs.Steps(recorded(tmp_path / "older", older)).reuse("gate", now)
    older["train"]["train"]["max_iters"] = 4
    with pytest.raises(runs.StepError, match=r"train.train.max_iters 4 -> 8\): --redo"):
        runs.Steps(recorded(tmp_path / "older", older)).reuse("gate", now)


def test_a_step_whose_move_into_a_shared_folder_was_cut_by_a_kill_is_reused_once_the_move_is_finished(tmp_path):
    """needle, score and passkey share one folder: a kill between the renames left needle.csv without needle.json, and
    the next call ran the step again, whose needle.py finished the move, then refused it (step failed) once."""
    res, names = tmp_path / "res", ["needle.csv", "needle.png", "needle.json"]
    (res / "needle").mkdir(parents=True)
    (res / "needle" / "passkey.json").write_text("another mode's")
    settings = {"train": {"max_iters": 16}}
    runs.Steps(str(res)).record_start("needle", settings)  # the killed call's record
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    staged = res / f"needle.tmp-{dead.pid}"  # its results, whole, and their list: moved up to needle.csv
    staged.mkdir()
    (staged / ".moving").write_text(json.dumps(names))
    for name in names:
        (staged / name).write_text(name)
    os.replace(staged / "needle.csv", res / "needle" / "needle.csv")
    fails = tmp_path / "fails.py"
    fails.write_text("import sys; sys.exit(1)\n")  # as needle.py's refusal of the results it has just finished
    runs.Steps(str(res)).run("needle", [str(fails)], str(res / "needle" / "needle.json"), settings=settings)
    assert sorted(os.listdir(res / "needle")) == sorted(["passkey.json", *names]) and not staged.exists()
