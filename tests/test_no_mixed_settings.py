"""A rerun reuses a step only when its settings are the ones asked for (issue #44, cause 3): a step done with other
settings refuses, or runs again with --redo; an output left by a killed step is judged by the settings it was started
with (none recorded: refused); a seed's runs hold one training and may gain variants; the LM suite refuses a rerun
with other iterations before it trains. CPU only."""
import json, shutil, time

import pytest

from conftest import one_line_error
from lib import runs


def test_a_step_done_with_other_settings_refuses_or_with_redo_runs_again(tmp_path, capsys):
    script = tmp_path / "mark.py"  # a step: writes its output
    script.write_text("import sys; open(sys.argv[1], 'w').write(sys.argv[2])\n")
    out = tmp_path / "res" / "out.txt"
    out.parent.mkdir()
    run = lambda steps, max_iters: steps.run("train x", [str(script), str(out), str(max_iters)], str(out),
                                             settings={"train": {"max_iters": max_iters}})
    run(runs.Steps(str(out.parent)), 20)
    run(runs.Steps(str(out.parent)), 20)  # the same settings: reused
    assert out.read_text() == "20" and "[skip] train x" in capsys.readouterr().out
    with pytest.raises(runs.StepError, match=r"step 'train x' in .* was made with other settings than asked now "
                                             r"\(train.max_iters 20 -> 40\): --redo runs it again"):
        run(runs.Steps(str(out.parent)), 40)
    assert out.read_text() == "20"
    steps = runs.Steps(str(out.parent), redo=True)
    run(steps, 40)
    assert out.read_text() == "40" and steps.ran("train") == {"max_iters": 40}  # what summary.json reports
    lines = [json.loads(line) for line in open(out.parent / "steps.jsonl")]
    assert [r["settings"]["train"]["max_iters"] for r in lines] == [20, 40]
    (out.parent / "steps.jsonl").write_text(json.dumps({"step": "train x", "command": "old", "wall_s": 1}) + "\n")
    run(runs.Steps(str(out.parent)), 80)  # recorded before settings were: taken as it is, with a warning
    assert out.read_text() == "40" and "made before settings were recorded" in capsys.readouterr().out
    (out.parent / "wall.json").write_text(json.dumps({"wall_s": 1000.0, "older": 1}))  # earlier calls' time
    out.unlink()
    run(runs.Steps(str(out.parent)), 160)  # its output gone: this call runs the step
    wall = json.load(open(out.parent / "wall.json"))  # every call's time, kept after each step: rewritten, added to
    assert list(wall) == ["wall_s"] and 1000 <= wall["wall_s"] < 1100


def test_an_output_left_by_a_killed_step_is_judged_by_the_settings_it_was_started_with(tmp_path, capsys):
    script = tmp_path / "killed.py"  # a step killed after its output exists, before its steps.jsonl line
    script.write_text("import os, signal, sys\nopen(sys.argv[1], 'w').write('x')\n"
                      "os.kill(os.getpid(), signal.SIGKILL)\n")
    out = tmp_path / "res" / "out.txt"
    out.parent.mkdir()
    run = lambda max_iters: runs.Steps(str(out.parent)).run("train x", [str(script), str(out)], str(out),
                                                            settings={"train": {"max_iters": max_iters}})
    with pytest.raises(runs.StepError, match="failed"):
        run(20)
    run(20)  # started with these: reused
    assert "[skip] train x" in capsys.readouterr().out
    with pytest.raises(runs.StepError, match=r"train.max_iters 20 -> 40"):
        run(40)
    (out.parent / "started.json").unlink()  # no record left of what it was made with: not taken as asked now
    with pytest.raises(runs.StepError, match="an output with no record of its settings"):
        run(20)


def test_a_seeds_runs_hold_one_training_and_may_gain_variants(tmp_path):
    root = str(tmp_path / "s1")
    want = lambda it, **v: {"train": {"max_iters": it}, "variants": v}
    runs.check_runs(root, want(20, softmax={"scorer": "softmax"}), redo=False)
    (tmp_path / "s1" / "softmax").mkdir()
    runs.check_runs(root, want(20, softmax={"scorer": "softmax"}, ssa={"scorer": "ssa"}), redo=False)  # added
    assert set(json.load(open(tmp_path / "s1" / "settings.json"))["variants"]) == {"softmax", "ssa"}
    with pytest.raises(runs.StepError, match=r"train.max_iters 20 -> 40"):
        runs.check_runs(root, want(40, softmax={"scorer": "softmax"}), redo=False)
    with pytest.raises(runs.StepError, match=r"variants.ssa.scorer"):
        runs.check_runs(root, want(20, ssa={"scorer": "ssmax"}), redo=False)
    runs.check_runs(root, want(40, softmax={"scorer": "softmax"}), redo=True)  # scratch: trained again
    assert not (tmp_path / "s1" / "softmax").exists()


def test_the_lm_suite_refuses_a_rerun_with_other_iterations_before_it_trains(tmp_path, monkeypatch):
    import reproduce
    monkeypatch.chdir(tmp_path)
    res = tmp_path / "out-results" / "cpu_char"
    (res / "s1" / "gate").mkdir(parents=True)
    labels = [{"label": v} for v in reproduce.SCALES["cpu_char"]["variants"]]
    (res / "s1" / "gate" / "summary.json").write_text(json.dumps({"models": labels}))
    S = reproduce.SCALES["cpu_char"]
    cmd_settings = runs.plain(dict(train=dict(model=S["model"], train={**S["train"], "max_iters": 20}, dataset=S[
        "dataset"], switch_at=reproduce.SWITCH_AT)))
    (res / "steps.jsonl").write_text(json.dumps(dict(step="gate (seed 1)", command="", wall_s=1,
                                                     settings=cmd_settings)) + "\n")
    msg = one_line_error(reproduce.main, ["--scale", "cpu_char", "--seeds", "1", "--max_iters", "40",
                                          "--skip", "eval_long", "needle", "score", "passkey"])
    assert "step 'gate (seed 1)'" in msg and "train.train.max_iters 20 -> 40" in msg and "--redo" in msg
    assert not (tmp_path / "out-repro-cpu_char" / "s1").exists()  # nothing trained
    msg = one_line_error(reproduce.main, ["--scale", "cpu_char", "--seeds", "1", "--max_iters", "20", "--variants",
                                          "softmax", "--skip", "eval_long", "needle", "score", "passkey"])
    assert "step 'gate (seed 1)'" in msg and "variants" in msg  # a variant set other than its evaluation's


@pytest.fixture
def legacy(tmp_path, monkeypatch):
    """A toy results folder from before settings were recorded, as results/cpu: steps.jsonl without settings, a
    gate's output, its train_loss.csv and summary.json (the training it had); no seed's training log."""
    import reproduce
    from test_reproduce import TOY
    S = {**TOY, "dataset": "english_char"}  # characters: the dataset is made in a second
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(reproduce.SCALES, "toy", S)
    res = tmp_path / "out-results" / "toy"
    (res / "s1" / "gate").mkdir(parents=True)
    (res / "s1" / "gate" / "summary.json").write_text(json.dumps({
        "models": [{"label": v} for v in S["variants"]], "run_info": {"git_sha": "a" * 40, "git_dirty": False},
        "args": {"seed": 0, "labels": list(S["variants"])}}))  # shared texts, every variant
    (res / "steps.jsonl").write_text(json.dumps({"step": "gate (seed 1)", "command": "eval_long.py", "wall_s": 9}))
    (res / "summary.json").write_text(json.dumps({"dataset": "english_char", "config": runs.plain(S), "wall_s": 500.0}))
    (res / "train_loss.csv").write_text("variant,seed,iter,train_loss,val_loss\n" + "".join(
        f"{v},1,8,5.0,{5 + i / 10}\n" for i, v in enumerate(S["variants"])))
    return lambda *argv: ["--scale", "toy", "--seeds", "1", "--skip", "eval_long", "needle", "score", "passkey",
                          *argv]


def test_a_folder_from_before_settings_records_is_judged_by_the_training_its_summary_json_says(legacy, tmp_path):
    import reproduce
    msg = one_line_error(reproduce.main, legacy("--max_iters", "4"))  # it took 8 iterations' outputs as 4's (audit H)
    assert "step 'gate (seed 1)'" in msg and "summary.json's train.train.max_iters 8 -> 4" in msg and "--redo" in msg
    assert not (tmp_path / "out-repro-toy").exists()  # nothing trained
    reproduce.main(legacy())  # its own training: reused as it is, with a warning
    got = json.load(open(tmp_path / "out-results" / "toy" / "summary.json"))
    assert got["config"]["train"]["max_iters"] == 8 and got["tokens_per_variant"] == 2 * 64 * 8
    assert got["config"]["recorded"] is False and "sha256" not in got["config"]  # not today's splits: not known
    assert not (tmp_path / "out-repro-toy").exists()


def test_a_legacy_output_is_reused_only_where_its_own_args_are_the_texts_and_labels_asked(legacy, tmp_path):
    import reproduce
    msg = one_line_error(reproduce.main, legacy("--texts", "per_seed"))  # it said per_seed over shared texts (V4)
    assert "step 'gate (seed 1)'" in msg and "its args' --seed 0 -> 1" in msg and "--redo" in msg
    msg = one_line_error(reproduce.main, legacy("--variants", "softmax", "ssmax"))  # 2 variants over 5's lists
    assert "step 'gate (seed 1)'" in msg and "its args' --labels softmax ssmax ssmax_e" in msg
    assert not (tmp_path / "out-repro-toy").exists()  # nothing trained


def test_a_legacy_folder_without_summary_json_refuses_its_outputs_as_of_a_training_not_known(legacy, tmp_path):
    import reproduce
    (tmp_path / "out-results" / "toy" / "summary.json").unlink()
    msg = one_line_error(reproduce.main, legacy("--max_iters", "4"))  # it took any --max_iters (review V4)
    assert "step 'gate (seed 1)'" in msg and "no summary.json says it: not known" in msg and "--redo" in msg
    assert not (tmp_path / "out-repro-toy").exists()  # nothing trained


def test_a_folder_from_before_training_logs_were_kept_keeps_its_own_losses(legacy, tmp_path):
    import reproduce
    res = tmp_path / "out-results" / "toy"
    rows = (res / "train_loss.csv").read_text()
    reproduce.main(legacy())  # it wrote train_loss.csv's header only, every loss null (audit H)
    got = json.load(open(res / "summary.json"))
    assert (res / "train_loss.csv").read_text() == rows
    assert got["losses"]["ssmax"]["per_seed"]["1"]["val_loss"] == 5.1
    assert got["losses"]["ssmax"]["val_minus_baseline"][0] == pytest.approx(0.1)


def test_summary_json_records_this_calls_run_info_and_the_commits_its_reused_outputs_were_made_at(legacy, tmp_path):
    import reproduce
    reproduce.main(legacy())
    got = json.load(open(tmp_path / "out-results" / "toy" / "summary.json"))
    assert {"git_sha", "git_dirty", "torch"} <= set(got["run_info"])
    assert got["reused_made_at"] == {"a" * 40: 1}  # the gate's own run_info: not this call's commit


def test_a_legacy_output_is_judged_by_its_own_training_after_a_call_with_other_training_rewrote_summary_json(
        legacy, tmp_path):
    import reproduce
    res = tmp_path / "out-results" / "toy"
    (res / "s1" / "eval_long_theta").mkdir()  # an 8-iteration eval_long, recorded before settings were
    (res / "s1" / "gate" / "summary.json").rename(res / "s1" / "eval_long_theta" / "summary.json")
    with open(res / "steps.jsonl", "a") as f:
        f.write("\n" + json.dumps({"step": "eval_long theta (seed 1)", "command": "eval_long.py", "wall_s": 9}) + "\n")
    two = ["--variants", "softmax", "ssmax"]  # fewer to train
    reproduce.main(legacy("--max_iters", "4", *two))  # eval_long skipped: left out; the gate made again at 4
    assert json.load(open(res / "summary.json"))["config"]["train"]["max_iters"] == 4
    msg = one_line_error(reproduce.main, ["--scale", "toy", "--seeds", "1", "--max_iters", "4", *two, "--skip",
                                          "needle", "score", "passkey"])  # taken as 4's: summary.json said 4 (V3)
    assert "step 'eval_long theta (seed 1)'" in msg and "max_iters 8 -> 4" in msg


def test_a_legacy_summary_jsons_wall_s_is_kept_as_its_last_calls_time_never_as_every_calls_nor_added_twice(
        legacy, tmp_path):
    import reproduce
    res = tmp_path / "out-results" / "toy"
    t0 = time.time()
    reproduce.main(legacy())  # runs no step
    wall = json.load(open(res / "wall.json"))  # its 500 s timed the call that wrote it, taken as every call's (V4)
    assert wall["wall_s_before"] == "unknown" and wall["wall_s_legacy_last_call"] == 500.0 and wall["wall_s"] < 500
    reproduce.main(legacy())  # it counted the last summary.json's wall_s again (review V3)
    got = json.load(open(res / "summary.json"))
    assert got["wall_s"] <= time.time() - t0 and got["wall_s_before"] == "unknown"
    assert got["wall_s_legacy_last_call"] == 500.0


def add_seed_2(res):
    """Seed 2 in the legacy folder: its gate and, kept since, its training log."""
    import gzip
    from test_reproduce import TOY
    shutil.copytree(res / "s1" / "gate", res / "s2" / "gate")
    with open(res / "steps.jsonl", "a") as f:
        f.write("\n" + json.dumps({"step": "gate (seed 2)", "command": "eval_long.py", "wall_s": 9}) + "\n")
    with gzip.open(res / "s2" / "train_log.csv.gz", "wt") as f:
        f.write("variant,iter,loss,train_loss,val_loss\n" + "".join(f"{v},8,,4.0,4.5\n" for v in TOY["variants"]))


def test_a_seed_added_to_a_folder_from_before_training_logs_keeps_the_losses_of_the_seeds_without_one(legacy,
                                                                                                       tmp_path):
    import reproduce
    res = tmp_path / "out-results" / "toy"
    add_seed_2(res)
    reproduce.main(legacy("--seeds", "1", "2"))  # it kept seed 2's only (review V3)
    got = json.load(open(res / "summary.json"))["losses"]["ssmax"]["per_seed"]
    assert got["1"]["val_loss"] == 5.1 and got["2"]["val_loss"] == 4.5
    assert {r.split(",")[1] for r in (res / "train_loss.csv").read_text().split()[1:]} == {"1", "2"}


def test_made_at_reads_the_run_info_beside_an_output_that_holds_none_sft_data_and_the_kernel_benchmark(tmp_path):
    from lib import lm_suite
    (tmp_path / "sft_synthetic.jsonl").write_text("{}\n")  # needle.py sft_data: its run_info in the .json
    (tmp_path / "sft_synthetic.json").write_text(json.dumps({"run_info": {"git_sha": "b" * 40, "git_dirty": False}}))
    (tmp_path / "kernels.png").write_bytes(b"")  # bench/attention.py: run_info's fields in every row of the .csv
    (tmp_path / "kernels.csv").write_text(f"scorer,ms,git_sha,git_dirty\nsoftmax,1.0,{'c' * 40},True\n")
    got = lm_suite.made_at({"sft data": str(tmp_path / "sft_synthetic.jsonl"),
                            "kernel benchmark": str(tmp_path / "kernels.png")})
    assert got == {"b" * 40: 1, "c" * 40 + "+dirty:None": 1}  # both were "not recorded" (review V3); no diff hash


def test_kept_losses_say_which_seeds_have_no_log_which_were_not_asked_and_that_train_loss_png_lacks_them(
        legacy, tmp_path, capsys):
    import reproduce
    res = tmp_path / "out-results" / "toy"
    add_seed_2(res)
    reproduce.main(legacy("--seeds", "1", "2"))  # the figure was redrawn from seed 2 alone, silently (review V4)
    out = capsys.readouterr().out
    assert "seeds [1] are the folder's own: no training log of theirs is here; train_loss.png, drawn from seeds [2]' " \
           "logs, lacks them" in out
    reproduce.main(legacy())  # seed 2 has a log: it was said to have none (review V4)
    out = capsys.readouterr().out
    assert "seeds [1] are the folder's own: no training log of theirs is here\n" in out
    assert "the losses of seeds [2], not asked for now, are kept as they are" in out
