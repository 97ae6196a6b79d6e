"""reproduce.py end to end at a toy scale: two seeds train (the scorer variants of the run below are a subset; every
variant's settings are checked to build a model), every evaluation writes its outputs, summary.json gathers them over
seeds with intervals, and a rerun skips every finished step. CPU, tiny models (the GPT-2 vocabulary of `english`)."""
import json
import math
import os
import shutil

import pytest
import torch

from conftest import one_line_error
from lib import compare
from lib import checkpoint, lm_suite, report, runs
import reproduce
from lib.config import TrainConfig, model_config, parse_args
from lib.checkpoint import save_checkpoint
from model import ssmax_s_for_switch

TOY = dict(
    model=dict(n_layer=1, n_head=2, n_embd=32, ffn_hidden=64, block_size=64),
    train=dict(batch_size=2, gradient_accumulation_steps=1, max_iters=8, learning_rate=1e-3, warmup_iters=2,
               lr_schedule="constant", eval_interval=4, eval_iters=1, log_interval=4, device="cpu"),
    sft=dict(examples=6, max_iters=2, batch_size=2, learning_rate=1e-3),
    eval=dict(num_seqs=2, gate_seqs=3, length_x=4, needle_contexts=[96], samples=1, passkey_contexts=[96],
              passkey_samples=1, score_context=96, trials=2, batch_size=2))
SUBSET = ("softmax", "ssmax", "ssmax_e", "ssmax_f", "lssar")  # softmax, (e) and (f) branch off it; the slowest scorer
TOY["variants"] = SUBSET


@pytest.mark.parametrize("variant", [v for v, (over, _) in reproduce.VARIANTS.items() if over is not None])
def test_every_variant_trained_from_scratch_has_settings_that_build_a_model(variant):
    over = reproduce.VARIANTS[variant][0]
    explicit = parse_args(lm_suite.kv({**reproduce.SCALES["cpu"]["model"], **over}))
    args, _ = model_config(TrainConfig(**explicit), explicit, None, False)
    assert args["scorer"] == over["scorer"]


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """The toy's reproduction of seeds 1 and 2, made once for this file's tests (each step is a fresh process: ~4 s
    of imports): the folder it ran in, which holds data/, out-repro-toy/ and out-results/toy/."""
    root = tmp_path_factory.mktemp("toy")
    with pytest.MonkeyPatch.context() as m:
        m.chdir(root)
        m.setitem(reproduce.SCALES, "toy", TOY)
        reproduce.main(["--scale", "toy", "--seeds", "1", "2"])
    return root


def test_two_seeds_every_evaluation_and_a_rerun_that_skips_finished_steps(toy_run, monkeypatch):
    monkeypatch.chdir(toy_run)  # data/, out-repro-toy/ and out-results/toy/ are written under the cwd
    monkeypatch.setitem(reproduce.SCALES, "toy", TOY)
    res = toy_run / "out-results" / "toy"  # untracked: results/ only with --commit-results
    steps = [json.loads(line)["step"] for line in open(res / "steps.jsonl")]
    for seed in (1, 2):
        assert {f"train {v} (seed {seed})" for v in ("ssmax", "lssar")} <= set(steps)
        assert f"train softmax to the switch (seed {seed})" in steps and f"eval_long theta (seed {seed})" in steps
    assert {f"sft {v}" for v in SUBSET} <= set(steps)  # retrieval: the first seed's models only

    # each seed's (f) branch starts from its softmax run at the switch, (e) from its end
    load = lambda s, v: torch.load(toy_run / "out-repro-toy" / f"s{s}" / v / "ckpt.pt", weights_only=True)
    k = int(reproduce.SWITCH_AT * 8)
    for s in (1, 2):
        assert load(s, "softmax_at_switch")["iter_num"] == k and load(s, "softmax")["iter_num"] == 8
        assert load(s, "ssmax_f")["iter_num"] == 8 and load(s, "ssmax_f")["model_args"]["scorer"] == "ssmax"
        e = load(s, "ssmax_e")
        assert e["iter_num"] == 0 and e["model_args"]["ssmax_s_init"] == pytest.approx(ssmax_s_for_switch(64))
    assert not torch.equal(load(1, "ssmax")["model"]["lm_head.weight"], load(2, "ssmax")["model"]["lm_head.weight"])

    summary = json.load(open(res / "summary.json"))
    assert summary["seeds"] == [1, 2] and summary["tokens_per_variant"] == 2 * 64 * 8
    losses = summary["losses"]
    assert set(losses) == set(SUBSET) and losses["softmax"]["val_minus_baseline"][:2] == [0.0, 0.0]
    per_seed = [losses["ssmax"]["per_seed"][s]["val_loss"] for s in ("1", "2")]
    mean, sd, lo, hi = losses["ssmax"]["val"]
    assert mean == pytest.approx(sum(per_seed) / 2) and lo < mean < hi
    for method in ("theta", "dynamic_ntk"):
        got = summary[f"eval_long_{method}"]
        assert set(got["windows"]["extended"]) == set(got["windows"]["native"]) == set(SUBSET)
        assert {d["model"] for d in got["differences"]} == set(SUBSET) - {"softmax"}
        assert all(d["n_seeds"] == 2 and d["ci_lo"] <= d["mean_diff"] <= d["ci_hi"] and len(d["per_seed"]) == 2
                   for d in got["differences"])
        assert (res / f"eval_long_{method}_differences.png").stat().st_size > 0
        assert set(got["extended_minus_native"]) == set(SUBSET)
        for s in (1, 2):  # each seed's own paired bootstrap CIs can be redone from its per-sequence losses
            assert (res / f"s{s}" / f"eval_long_{method}" / "per_sequence.csv").stat().st_size > 0
    # Dynamic NTK per length runs N-token sequences at factor 1: its 1x window costs nothing against native θ
    cost = summary["eval_long_dynamic_ntk"]["extended_minus_native"]
    assert all(abs(c["prefix_1x"][0]) < 1e-4 for c in cost.values())
    assert set(summary["gates_minus_softmax"]) == set(SUBSET) - {"softmax"}
    assert set(summary["gates"]) == set(SUBSET)
    assert all(math.isfinite(g["context_gain"][0]) for g in summary["gates"].values())
    for name in ("needle", "passkey", "needle_score_trials"):  # labelled by variant
        assert {c["model"] for c in summary[name]} == set(SUBSET)
    assert "### Final losses" in (res / "tables.md").read_text()
    for png in ("train_loss.png", "needle/needle.png", "needle/passkey.png", "needle/needle_score_heads.png"):
        assert (res / png).stat().st_size > 0
    rows = open(res / "train_loss.csv").read().splitlines()
    assert rows[0] == "variant,seed,iter,train_loss,val_loss" and len(rows) > 2 * len(SUBSET)

    reproduce.main(["--scale", "toy", "--seeds", "1", "2"])  # everything is done: nothing runs again
    assert len(open(res / "steps.jsonl").readlines()) == len(steps)

    # the runs folder is scratch (a new machine): the results alone resume, with no training and the same report
    shutil.rmtree(toy_run / "out-repro-toy")
    reproduce.main(["--scale", "toy", "--seeds", "1", "2"])
    assert len(open(res / "steps.jsonl").readlines()) == len(steps) and not (toy_run / "out-repro-toy").exists()
    assert open(res / "train_loss.csv").read().splitlines() == rows
    assert json.load(open(res / "summary.json"))["losses"] == losses


def test_summary_json_leaves_out_a_skipped_steps_outputs_made_with_other_training(toy_run, tmp_path, monkeypatch):
    """A rerun at other training with --skip: summary.json holds only what was made as asked now (reproduce.py
    --skip), and the records of the outputs it reads, not the command line, say which training that was."""
    for folder in ("data", "out-results"):  # the toy run's results at 8 iterations (not its runs: 12 trains afresh)
        shutil.copytree(toy_run / folder, tmp_path / folder)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(reproduce.SCALES, "toy", TOY)
    args = ["--scale", "toy", "--seeds", "1"]
    res = tmp_path / "out-results" / "toy"
    first = json.load(open(res / "summary.json"))
    retrieval = ("needle", "passkey", "needle_score_trials", "needle_scores")
    assert all(k in first for k in (*retrieval, "eval_long_theta"))
    shutil.copytree(res / "needle", tmp_path / "needle_at_8")
    skip = ["--skip", "eval_long", "needle", "passkey", "score"]
    reproduce.main(args + ["--max_iters", "12", "--redo", *skip])  # the gate and the models at 12
    got = json.load(open(res / "summary.json"))
    assert not any(k in got for k in (*retrieval, "eval_long_theta", "eval_long_dynamic_ntk"))
    # what the records of the outputs it reads say (not "recorded": False, as records of 8 and 12 gave)
    assert got["config"]["train"]["max_iters"] == 12 and "recorded" not in got["config"]
    assert first["skipped"] == {}
    assert got["skipped"]["needle"].startswith("removed (--redo): made with other settings (train.train.max_iters "
                                               "8 -> 12")
    assert set(got["skipped"]) == {"needle", "needle scores", "passkey", "eval_long theta (seed 1)",
                                   "eval_long dynamic_ntk (seed 1)"}
    assert not (res / "needle" / "needle.json").exists() and not (res / "s1" / "eval_long_theta").exists()
    assert not list(res.glob("eval_long_*_differences.png"))  # no figure of the 8-iteration models either
    # the 8-iteration outputs back (a copied results folder): without --redo they stay, out of the summary
    shutil.copytree(tmp_path / "needle_at_8", res / "needle", dirs_exist_ok=True)
    reproduce.main(args + ["--max_iters", "12", *skip])
    got = json.load(open(res / "summary.json"))
    assert not any(k in got for k in retrieval) and (res / "needle" / "needle.json").exists()
    assert got["skipped"]["passkey"].startswith("left out of the summary: made with other settings")
    assert got["skipped"]["eval_long theta (seed 1)"] == "not made"
    # one seed: no sd or interval, "–" in tables.md (was "± nan", "[+nan, +nan]") and null in summary.json (was NaN)
    tables, text = (res / "tables.md").read_text(), (res / "summary.json").read_text()
    assert "nan" not in tables.lower() and " ± –" in tables and "NaN" not in text and "null" in text


def test_context_gates_on_a_hand_made_curve():
    # N = 32: position 1 at 4, positions 2-16 at 3, the second half (17-32) at 2.5; positions beyond N are not read
    curve = [4.0] + [3.0] * 15 + [2.5] * 16 + [9.0] * 32
    assert report.context_gates(curve, 32) == {"context_gain": 1.5, "distant_gain": 0.5}
    ramp = [float(p) for p in range(1, 65)]  # loss = position: the windows' ends show (mean of 17..32 is 24.5)
    assert report.context_gates(ramp, 32) == {"context_gain": 1 - 24.5, "distant_gain": 12.5 - 24.5}


def test_retrieval_pools_depths_by_their_counts_and_pairs_seeds_with_softmax():
    cells = lambda a, b: [dict(model="m", context=64, depth=10, n=3, accuracy=a),  # pooled: (3a + b) / 4
                          dict(model="m", context=64, depth=90, n=1, accuracy=b),
                          dict(model="softmax", context=64, depth=10, n=4, accuracy=0.25)]
    score = lambda m, top, ctrl: dict(model=m, top_score=top, control_top_score=ctrl, mean_score=0.1,
                                      control_mean_score=0.05, uniform=0.01)
    files = {("s1", "needle.json"): dict(cells=cells(1.0, 0.0)), ("s2", "needle.json"): dict(cells=cells(0.0, 1.0)),
             ("s1", "needle_score_trials.json"): dict(scores=[score("m", 0.9, 0.2), score("softmax", 0.5, 0.3)]),
             ("s2", "needle_score_trials.json"): dict(scores=[score("m", 0.7, 0.4), score("softmax", 0.6, 0.1)])}
    got = report.retrieval("r", [1, 2], read=lambda results, seed, folder, name: files.get((seed, name)))
    cell = got["needle"]["m"]["64"]
    assert cell["per_seed"] == [0.75, 0.25] and cell["minus_softmax"][0] == pytest.approx(0.25)
    assert got["needle_scores"]["m"]["top_minus_control"]["per_seed"] == pytest.approx([0.7, 0.3])


def test_seed_interval_is_the_student_t_interval_of_the_mean():
    mean, sd, lo, hi = compare.seed_interval([1.0, 2.0, 3.0])
    assert (mean, sd) == (2.0, 1.0) and hi - mean == pytest.approx(4.30265272975 / math.sqrt(3)) and lo == 4 - hi
    assert all(math.isnan(x) for x in compare.seed_interval([1.0])[1:])


def test_an_interrupted_evaluation_is_not_taken_for_done(tmp_path):
    # eval_long.py rewrites summary.json after every model: one that lacks a variant means the step was cut short
    out = tmp_path / "eval"
    out.mkdir()
    write = lambda labels: (out / "summary.json").write_text(json.dumps({"models": [{"label": v} for v in labels]}))
    write(list(reproduce.VARIANTS)[:2])
    assert reproduce.lm_suite.complete(str(out), reproduce.PAPERS) is None
    write(list(reproduce.VARIANTS))
    assert reproduce.lm_suite.complete(str(out), reproduce.PAPERS) == str(out / "summary.json")


def test_a_run_cut_short_is_not_taken_for_trained(tmp_path):
    # train.py checkpoints at every evaluation, iteration 0 included: a ckpt.pt alone does not mean the run finished
    path = str(tmp_path / "ckpt.pt")
    assert checkpoint.trained(path, 40) is None
    save_checkpoint({"model": {}, "model_args": {}, "iter_num": 0}, path)
    assert checkpoint.trained(path, 40) is None
    save_checkpoint({"model": {}, "model_args": {}, "iter_num": 40}, path)
    assert checkpoint.trained(path, 40) == path


def test_the_cpu_char_scale_trains_what_configs_cpu_char_py_trains():
    # one recipe: a user's `python train.py configs/cpu_char.py` is one seed of the reproduction's softmax
    want = {**reproduce.SCALES["cpu_char"]["model"], **reproduce.SCALES["cpu_char"]["train"],
            "dataset": reproduce.SCALES["cpu_char"]["dataset"]}
    got = parse_args([f"{reproduce.REPO}/configs/cpu_char.py"])
    assert {k: got.get(k) for k in want} == want


@pytest.mark.parametrize("chosen", [["ssmax"], ["softmax", "ssa_learn_n"]])
def test_a_variant_subset_without_softmax_or_outside_the_scale_is_one_error_line(chosen, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        reproduce.main(["--scale", "cpu_char", "--variants", *chosen])
    assert str(e.value.code).startswith(f"error: --variants {' '.join(chosen)}: they must be cpu_char's and include "
                                        "softmax") and "\n" not in str(e.value.code)
    assert not (tmp_path / "out-results").exists()  # refused before anything is written


def test_the_kept_training_log_reads_back_what_train_py_logged(tmp_path):
    # the runs folder is scratch: the report's curves and loss table come from this copy
    (tmp_path / "runs" / "softmax").mkdir(parents=True)
    log = [{"config": {"seed": 1}}, {"iter": 0, "train_loss": 4.5, "val_loss": 4.25}, {"iter": 0, "loss": 4.123456},
           {"iter": 1, "loss": 3.5, "lr": 1e-3}]
    (tmp_path / "runs" / "softmax" / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    runs.keep_train_log(str(tmp_path / "runs"), ["softmax"], str(tmp_path / "res" / "s7" / "train_log.csv.gz"))
    got = runs.read_train_logs(str(tmp_path / "res"), [7, 8])  # seed 8 kept nothing: left out
    assert got == {7: {"softmax": [{"iter": 0, "train_loss": 4.5, "val_loss": 4.25}, {"iter": 0, "loss": 4.1235},
                                   {"iter": 1, "loss": 3.5}]}}


def test_packing_gzips_each_seeds_csvs_but_what_the_report_reads(tmp_path):
    import gzip
    for sub in ("gate/per_position.csv", "copy/per_sequence.csv"):
        (tmp_path / "s1" / sub).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "s1" / sub).write_text("a,b\n1,2\n")
    reproduce.pack(str(tmp_path), [1])
    reproduce.pack(str(tmp_path), [1])  # a rerun changes nothing
    assert (tmp_path / "s1" / "gate" / "per_position.csv").read_text() == "a,b\n1,2\n"
    assert sorted(p.name for p in (tmp_path / "s1" / "copy").iterdir()) == ["per_sequence.csv.gz"]
    assert gzip.open(tmp_path / "s1" / "copy" / "per_sequence.csv.gz", "rt").read() == "a,b\n1,2\n"


def test_a_seed_whose_training_log_was_lost_drops_out_of_the_loss_table_only_where_it_lacks_rows():
    row = lambda v, s, val: dict(variant=v, seed=s, iter=8, train_loss=val, val_loss=val)
    rows = [row("softmax", 1, 2.0), row("ssmax", 1, 1.5), row("softmax", 2, 3.0), row("ssmax", 3, 1.0)]
    t = report.loss_table(rows, ["softmax", "ssmax"], [1, 2, 3])
    assert list(t["softmax"]["per_seed"]) == [1, 2] and list(t["ssmax"]["per_seed"]) == [1, 3]
    assert t["ssmax"]["val_minus_baseline"][0] == -0.5  # paired on seed 1 alone


def test_loss_curves_take_a_seed_that_kept_only_some_variants(tmp_path):
    # seeds 1339/1340 of cpu_char: softmax and SSA retrained, the rest of their training logs lost
    rec = lambda i, x: [{"iter": i, "loss": x}, {"iter": i, "train_loss": x, "val_loss": x}]
    logs = {1: {"softmax": rec(0, 3.0) + rec(7, 2.0), "ssmax_f": rec(7, 1.5)},
            2: {"softmax": rec(0, 3.0) + rec(7, 2.5)}}
    rows = report.loss_curves(logs, str(tmp_path), {"softmax": "a", "ssmax_f": "f"}, 7, 8)
    got = [(r["variant"], r["seed"], r["iter"]) for r in rows]  # (f): softmax's steps before the switch, then its own
    assert got == [("softmax", 1, 0), ("softmax", 1, 7), ("softmax", 2, 0), ("softmax", 2, 7), ("ssmax_f", 1, 0),
                   ("ssmax_f", 1, 7)]


def test_per_seed_texts_draw_each_seeds_test_texts_with_its_own_seed_and_a_rerun_with_shared_texts_refuses(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(reproduce.SCALES, "toy", {**TOY, "variants": ("softmax",)})
    args = ["--scale", "toy", "--seeds", "3", "--skip", "eval_long", "needle", "passkey", "score"]
    reproduce.main(args + ["--texts", "per_seed"])
    res = tmp_path / "out-results" / "toy"
    gate = [json.loads(line) for line in open(res / "steps.jsonl") if json.loads(line)["step"] == "gate (seed 3)"]
    cmd = gate[0]["settings"]["command"]
    assert cmd[cmd.index("--seed") + 1] == "3"  # eval_long.py draws the texts from seed 3, not 0
    assert json.load(open(res / "summary.json"))["texts"] == "per_seed"
    with pytest.raises(SystemExit, match="other settings"):  # the gate read other texts: not reused silently
        reproduce.main(args)
    assert reproduce.lm_suite.text_seed(None, 3) == reproduce.lm_suite.text_seed("shared", 3) == 0


def test_texts_is_refused_with_the_synthetic_suite():
    with pytest.raises(SystemExit, match="--texts does nothing with --suite synthetic"):
        reproduce.main(["--suite", "synthetic", "--texts", "per_seed"])


@pytest.mark.parametrize("args, words", [(["--name", "../x"], "--name '../x': a folder name"),
                                         (["--name", ""], "--name '': a folder name"),
                                         (["--max_iters", "0"], "--max_iters 0: must be >= 1")])
def test_a_name_outside_the_results_folders_or_no_iterations_is_one_error_line_before_anything_runs(
        args, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # --name ../x wrote ./x/started.json beside out-results; --max_iters 0 ran 250
    assert words in one_line_error(reproduce.main, args) and not os.listdir(tmp_path)
