"""The lm suite's plumbing without training (lib/lm_suite.py; the end-to-end runs are test_reproduce*.py): each seed's
evaluation commands (lengths, RoPE scale, text seed, which checkpoints a retrieval step reads, what --skip leaves
out), reproduce.py's defaults, and what run_steps hands summary.json (the training as run, the plan checked). CPU."""
import argparse
import os
import re

import pytest

import reproduce
from lib import lm_suite, plans


@pytest.fixture
def todo(monkeypatch):
    """The steps a call asks for, by name (seed suffix dropped); nothing runs."""
    got = {}

    def pending(steps, todo):
        got.update({t["name"].split(" (seed")[0]: t for t in todo})
        return []
    monkeypatch.setattr(lm_suite, "pending", pending)
    return got


def opt(cmd, flag):
    return cmd[cmd.index(flag) + 1]


def seed_steps(scale, skip=(), texts=None, seed=1337):
    S = lm_suite.SCALES[scale]
    variants = list(S.get("variants", lm_suite.PAPERS))
    lm_suite.seed_steps(S, seed, "runs", argparse.Namespace(results="res"), "data/x", variants, None, list(skip),
                        texts)
    return S, variants


def test_the_gate_reads_n_tokens_at_trained_theta_and_eval_long_10_n_under_theta_x_50_and_dynamic_ntk(todo):
    S, variants = seed_steps("cpu", skip=["eval_long"])
    N = S["model"]["block_size"]
    gate, theta, ntk = (todo[k]["cmd"] for k in ("gate", "eval_long theta", "eval_long dynamic_ntk"))
    assert (opt(gate, "--length"), opt(gate, "--rope_method"), opt(gate, "--seed")) == (str(N), "none", "0")
    assert opt(theta, "--length") == opt(ntk, "--length") == str(10 * N)  # the docstring's "evaluation to 10 N"
    assert (opt(theta, "--rope_method"), opt(theta, "--rope_scale")) == ("theta", "50")  # SSMax Fig. 5
    assert (opt(ntk, "--rope_method"), opt(ntk, "--rope_scale")) == ("dynamic_ntk", "1")  # LSSAR Table 4
    assert "--fading" in theta and "--fading" not in ntk
    assert opt(theta, "--labels") == variants[0] and opt(theta, "--baseline") == "softmax"
    assert todo["eval_long theta"]["skipped"] and todo["eval_long dynamic_ntk"]["skipped"]
    assert not todo["gate"]["skipped"] and todo["gate"]["out"] == os.path.join("res", "s1337", "gate", "summary.json")
    assert not any(k.startswith(("copy", "needle", "passkey")) for k in todo)  # cpu: retrieval after the fine-tune


def test_the_char_scale_copies_with_rescalings_of_softmax_alone_and_retrieves_at_both_thetas(todo):
    S, variants = seed_steps("cpu_char", skip=["score"], texts="per_seed", seed=5)
    N = S["model"]["block_size"]
    assert opt(todo["gate"]["cmd"], "--seed") == "5" and opt(todo["eval_long theta"]["cmd"], "--length") == str(16 * N)
    for name in lm_suite.COPY_RUNS:
        cmd = todo[name]["cmd"]
        reads = ["softmax"] if "--logit_scale" in cmd else variants
        assert cmd[1:1 + len(reads)] == [os.path.join("runs", v, "ckpt.pt") for v in reads]
        assert todo[name]["settings"]["variants"] == {v: lm_suite.VARIANTS[v][0] for v in reads}
    assert opt(todo["copy_llama4"]["cmd"], "--llama4_floor") == str(N)  # F = N: Llama 4's 8,192 changes nothing
    for how in ("", " native"):  # every seed's models, no fine-tune; score skipped, needle and passkey not
        assert [todo[k + how]["skipped"] for k in ("needle", "needle scores", "passkey")] == [False, True, False]
        assert ("--rope_method" in todo["needle" + how]["cmd"]) == (how == " native")


def test_after_the_fine_tune_needle_and_its_scores_read_the_tuned_models_and_passkey_the_pretrained(todo):
    S = lm_suite.SCALES["cpu"]
    lm_suite.sft_retrieval(S, 1337, "runs", argparse.Namespace(results="res"), "data/x", ["softmax", "ssa"],
                           ["--seed", "0"], ["passkey"])
    ckpts = lambda cmd: cmd[cmd.index("--ckpt") + 1:cmd.index("--ckpt") + 3]  # noqa: E731
    tuned = [os.path.join("runs", "sft", v, "ckpt.pt") for v in ("softmax", "ssa")]
    assert ckpts(todo["needle"]["cmd"]) == ckpts(todo["needle scores"]["cmd"]) == tuned
    assert ckpts(todo["passkey"]["cmd"]) == [os.path.join("runs", v, "ckpt.pt") for v in ("softmax", "ssa")]
    assert todo["needle"]["settings"]["sft"] == S["sft"] and todo["passkey"]["skipped"]
    assert not todo["needle"]["skipped"] and not todo["needle scores"]["skipped"]


def test_the_fine_tune_runs_while_needle_or_its_scores_is_asked_for(monkeypatch):
    monkeypatch.setattr(lm_suite, "pending", lambda steps, todo: [t for t in todo if not t["skipped"]])
    monkeypatch.setattr(lm_suite, "train_all", lambda *a: None)
    monkeypatch.setattr(lm_suite, "keep_train_log", lambda *a: None)
    for skip, want in ((["needle"], ["sft data", "sft softmax", "needle scores", "passkey"]),
                       (["needle", "score"], ["passkey"])):
        ran = []
        steps = argparse.Namespace(results="res", run=lambda name, *a, **k: ran.append(name))
        lm_suite.sft_retrieval(lm_suite.SCALES["cpu"], 1, "runs", steps, "data/x", ["softmax"], [], skip)
        assert ran == want


@pytest.fixture
def asked(monkeypatch, tmp_path):
    """reproduce.py's lm suite up to run_steps: what it would run, with which scale, seeds and folders."""
    monkeypatch.chdir(tmp_path)
    got = {}
    monkeypatch.setattr(reproduce, "run_steps", lambda a, S, root, data_dir, steps, variants, began: got.update(
        a=a, S=S, root=root, results=steps.results, variants=variants, began=began))
    return got


def test_reproduce_defaults_to_the_cpu_scale_three_seeds_two_jobs_and_shared_texts(asked):
    reproduce.main([])
    a = asked["a"]
    assert (a.scale, a.seeds, a.jobs, a.texts, a.skip) == ("cpu", [1337, 1338, 1339], 2, None, [])
    assert asked["S"] == lm_suite.SCALES["cpu"] and asked["variants"] == list(lm_suite.PAPERS)
    assert set(lm_suite.VARIANTS) - set(lm_suite.PAPERS) == {"softpick", "stickbreaking", "fox"}  # the papers' all
    assert (asked["root"], asked["results"], asked["began"]) == ("out-repro-cpu", os.path.join("out-results", "cpu"),
                                                                  None)


def test_max_iters_and_name_change_this_run_only(asked):
    reproduce.main(["--max_iters", "7", "--name", "short", "--seeds", "0", "--variants", "ssa", "softmax"])
    assert asked["S"]["train"]["max_iters"] == 7 and lm_suite.SCALES["cpu"]["train"]["max_iters"] == 250
    assert (asked["root"], asked["results"]) == ("out-repro-short", os.path.join("out-results", "short"))
    assert asked["a"].seeds == [0] and asked["variants"] == ["softmax", "ssa"]  # the scale's order


def test_summary_json_gets_the_training_as_run_and_the_plan_checked_at_the_end(monkeypatch, tmp_path):
    S = lm_suite.SCALES["cpu"]
    ran = dict(lm_suite.trained_with(S, "data/english"),
               train={**S["train"], "max_iters": 100, "gradient_accumulation_steps": 4})
    steps = argparse.Namespace(results=str(tmp_path), ran=lambda key: ran, wall_s=lambda: 3.0, skipped={"x": "y"},
                               left_out={"gone"}, reused={}, made=None, wall_notes={})
    monkeypatch.setattr(reproduce.dataset, "prepare", lambda *a, **k: None)
    monkeypatch.setattr(lm_suite, "seed_steps", lambda *a: None)
    monkeypatch.setattr(reproduce.report, "loss_curves", lambda *a: [])
    got = {}
    monkeypatch.setattr(reproduce.report, "summarize", lambda *a, **k: got.update(k))
    monkeypatch.setattr(reproduce, "pack", lambda *a: None)
    monkeypatch.setattr(lm_suite, "sft_retrieval", lambda S, seed, root, steps, data, variants, common, skip:
                        got.update(retrieval=(seed, root, common)))
    a = argparse.Namespace(seeds=[2, 1], texts="per_seed", jobs=2, skip=[], scale="cpu", commit_results=True)
    began = dict(path="results/x/plan.md", blob="b", commit="c" * 40, run_started="t")
    monkeypatch.setattr(reproduce.plans, "finish", lambda results, b: dict(b, checked=True))
    reproduce.run_steps(a, S, "runs", "data", steps, ["softmax"], began)
    assert got["tokens_per_variant"] == S["train"]["batch_size"] * S["model"]["block_size"] * 100 * 4
    assert got["config"] == ran and got["texts"] == "per_seed" and got["plan"] == dict(began, checked=True)
    assert got["retrieval"] == (2, os.path.join("runs", "s2"), ["--data", os.path.join("data", "english"), "--seed",
                                                                "2"])  # the first seed's models, its texts
    assert (got["skipped"], got["left_out"], got["wall_s"]) == ({"x": "y"}, {"gone"}, 3.0)

    def changed(results, b):
        raise plans.PlanError("changed since the run began")
    monkeypatch.setattr(reproduce.plans, "finish", changed)
    got.clear()
    with pytest.raises(plans.PlanError):
        reproduce.run_steps(a, S, "runs", "data", steps, ["softmax"], began)
    assert "plan" not in got  # no summary.json under a plan changed since the start


def args(**given):
    return argparse.Namespace(**{**dict(suite="lm", scale=None, max_iters=None, variants=None, skip=None, texts=None,
                                        quick=False, tasks=None, settings=None, jobs=None, name=None, seeds=None),
                                 **given})


def test_seeds_from_0_below_2_63_and_folder_names_are_checked_before_anything_runs():
    reproduce.check(args(seeds=[0, 2 ** 63 - 1], name="a.b"), None)
    for bad, words in ((dict(seeds=[2 ** 63]), "--seeds 9223372036854775808: seeds must be in [0, 2**63)"),
                       (dict(name=".."), "--name '..': a folder name"), (dict(name="."), "--name '.': a folder name"),
                       (dict(settings=["ssmax"]), "--settings does nothing with --suite lm"),
                       (dict(tasks=["first"]), "--tasks does nothing with --suite lm")):
        with pytest.raises(SystemExit, match=re.escape(words)):
            reproduce.check(args(**bad), None)


def test_reproduce_hands_the_synthetic_suite_every_option_it_was_given(monkeypatch):
    from lib import synthetic
    got = {}
    monkeypatch.setattr(synthetic, "main", lambda **k: got.update(k))
    reproduce.main(["--suite", "synthetic", "--scale", "gpu", "--seeds", "3", "4", "--commit-results", "--redo",
                    "--tasks", "first", "--settings", "ssmax", "--jobs", "3", "--name", "x"])
    assert got == dict(quick=False, jobs=3, settings=["ssmax"], task_names=["first"], name="x", seeds=[3, 4],
                       commit=True, redo=True, scale="gpu")


@pytest.mark.parametrize("error", [reproduce.StepError, reproduce.FolderError, reproduce.DataError])
def test_a_step_folder_or_data_error_is_one_error_line(error, monkeypatch):
    def fail(a):
        raise error("what went wrong")
    monkeypatch.setattr(reproduce, "lm", fail)
    with pytest.raises(SystemExit) as e:
        reproduce.main([])
    assert e.value.code == "error: what went wrong"
