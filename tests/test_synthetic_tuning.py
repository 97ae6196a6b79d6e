"""Tuning the synthetic suite (synthetic.py, synthetic_suite.py) by committed rules: the learning-rate sweep picks
each setting's rate (a sweep entry trains at its rate; stage two's rates are what the committed sweep chose), and the
GPU scale runs its own tasks, refuses without CUDA, and its pilot runs every rung of recall's budget ladder and picks
the fastest rung that passes the gate. CPU only."""
import dataclasses
import json
import os

import pytest
import torch

from lib import compare, config, runs, synthetic, synthetic_report, synthetic_suite


def _sweep_rows(task, setting, at_n, at_top):  # accuracy.csv rows of 2 seeds: mean at_n at N, at_top at 128 N
    return [dict(task=task, setting=setting, seed=str(seed), condition="", rope="nope", train_length="32",
                 length=str(32 * m), accuracy=str(a)) for seed in (0, 1) for m, a in ((1, at_n), (128, at_top))]


def test_the_sweep_picks_the_rate_by_its_committed_rule():
    rows = [*_sweep_rows("recall-lr0.001", "fox", 0.99, 0.30), *_sweep_rows("recall-lr0.003", "fox", 0.90, 0.60),
            *_sweep_rows("recall-lr0.01", "fox", 0.96, 0.25),  # 3e-3 misses the gate: 1e-3 has the higher mean at 128 N
            *_sweep_rows("recall-lr0.001", "ssa", 0.80, 0.10), *_sweep_rows("recall-lr0.003", "ssa", 0.85, 0.05),
            *_sweep_rows("recall-lr0.01", "ssa", 0.70, 0.40),  # none passes: the highest mean at N
            *_sweep_rows("first-lr0.001", "softmax", 1.0, 0.5), *_sweep_rows("first-lr0.003", "softmax", 1.0, 0.5),
            *_sweep_rows("first-lr0.01", "softmax", 1.0, 0.5004),  # equal to 3 decimals: the suite's 3e-3
            *_sweep_rows("first-lr0.001", "fox", 1.0, 0.4),
            *_sweep_rows("first-lr0.01", "fox", 1.0, 0.4)]  # no 3e-3: the lower rate
    assert synthetic.select_lr(rows) == {"recall": {"fox": 1e-3, "ssa": 3e-3},
                                         "first": {"softmax": 3e-3, "fox": 1e-3}}


def test_a_sweep_entry_trains_at_its_rate_and_records_the_rate_its_rule_picks(tmp_path, monkeypatch):
    tiny = ("max_iters=2", "eval_interval=2", "n_embd=16", "ffn_hidden=32", "batch_size=4")
    assert synthetic.overrides("recall-lr0.01", "fox") == ["learning_rate=0.01", "min_lr=0.001", "scorer=fox"]
    assert synthetic.SUITE["recall-lr0.001"].settings == synthetic.SWEPT["recall"]
    monkeypatch.setattr(synthetic, "REPO_OUT", str(tmp_path))
    for lr in synthetic.LRS:
        name = f"first-lr{lr:g}"
        e = synthetic.SUITE[name]
        monkeypatch.setitem(synthetic.SUITE, name, dataclasses.replace(e, extra=(*e.extra, *tiny), multiples=(1, 2)))
    synthetic.main(jobs=2, n_eval=2, settings=["softmax"], task_names=[f"first-lr{lr:g}" for lr in synthetic.LRS],
                   seeds=[0], name="sweep")
    ckpt = torch.load(tmp_path / "out-sweep" / "first-lr0.01-softmax-s0" / "ckpt.pt", weights_only=True)
    assert ckpt["config"]["learning_rate"] == 0.01 and ckpt["config"]["min_lr"] == 0.001
    res = tmp_path / "out-results" / "sweep"
    chosen = json.load(open(res / "selected.json"))
    assert (res / "sweep.png").stat().st_size > 0  # accuracy against the rate, every seed
    assert chosen == synthetic.select_lr(compare.read_csv(str(res / "accuracy.csv"))) and set(chosen) == {"first"}
    verdicts = json.load(open(res / "summary.json"))["tasks_summary"]["first-lr0.001"]["verdicts"]
    assert verdicts == [[]]  # softmax alone: its task's endpoint, no claim to test


def test_stage_twos_rates_are_what_the_committed_sweeps_rule_chose():
    results = os.path.join(synthetic.REPO, "results", "synthetic-lr")
    chosen = synthetic.select_lr(compare.read_csv(os.path.join(results, "accuracy.csv")))
    assert synthetic_suite.TUNED == chosen == json.load(open(os.path.join(results, "selected.json")))
    for task, rates in chosen.items():
        e = synthetic.SUITE[f"{task}-tuned"]
        assert e.settings == synthetic.SWEPT[task] and list(synthetic.plan([f"{task}-tuned"]))[0][2] == 10
        for setting, lr in rates.items():
            assert synthetic.overrides(f"{task}-tuned", setting)[-2:] == list(synthetic.recipe(lr))


def test_the_gpu_scale_runs_its_own_tasks_and_refuses_in_one_line_without_cuda(tmp_path, monkeypatch):
    for t in synthetic.GPU["tasks"]:
        e = synthetic.SUITE[t]
        assert e.seeds == 10 and e.multiples[-1] == 64 and e.settings == synthetic_suite.GPU_SETTINGS
        args = config.parse_args([os.path.join(synthetic.REPO, "configs", "tasks", f"{e.config}.py"), *e.extra])
        assert (args["n_layer"], args["n_embd"], args["block_size"], args["device"]) == (4, 256, 256, "cuda")
    monkeypatch.setattr(synthetic, "REPO_OUT", str(tmp_path))
    if not torch.cuda.is_available():
        with pytest.raises(runs.StepError, match="the GPU scale trains on CUDA, and this machine has none"):
            synthetic.main(scale="gpu")
    tiny = ("max_iters=2", "eval_interval=2", "n_embd=16", "ffn_hidden=32", "batch_size=4", "block_size=32")
    for t in synthetic.GPU["pilot"]:  # the same path on this machine's device, tiny
        over = tuple(o for o in synthetic.SUITE[t].extra if not o.startswith("device=")) + (
            f"device={'cuda' if torch.cuda.is_available() else 'cpu'}", *tiny)
        monkeypatch.setitem(synthetic.SUITE, t, dataclasses.replace(synthetic.SUITE[t], extra=over, multiples=(1, 2)))
    synthetic.main(scale="gpu", jobs=2, n_eval=2, seeds=[0], settings=["softmax", "softmax-qwen"])
    summary = json.load(open(tmp_path / "out-results" / "synthetic-gpu" / "summary.json"))
    assert summary["command"].startswith("python reproduce.py --suite synthetic --scale gpu")
    assert set(summary["tasks_summary"]) == {"first-gpu", "recall-gpu"} and summary["jobs"] == 2
    assert summary["ran"]["recall-gpu/softmax"][:3] == list(synthetic.SUITE["recall-gpu"].extra[:3])
    # the pilot: every rung of recall's ladder on seed 0, and the rung the rule picks (none: 2 iterations learn nothing)
    synthetic.main(scale="gpu", jobs=2, n_eval=2, seeds=[0], settings=["softmax"], task_names=synthetic.GPU["pilot"],
                   name="synthetic-gpu-pilot")
    pilot = tmp_path / "out-results" / "synthetic-gpu-pilot"
    assert set(json.load(open(pilot / "summary.json"))["tasks_summary"]) == set(synthetic.GPU["pilot"])
    assert json.load(open(pilot / "selected_budget.json")) == {"task": None, "batch_iters": None}


def test_recalls_budget_ladder_changes_only_the_budget_and_the_pilot_runs_every_rung():
    base = synthetic.SUITE["recall-gpu"]
    assert synthetic_suite.RUNGS["recall-gpu"] == synthetic_suite.LADDER[0] == (32, 1500)
    assert set(synthetic.GPU["pilot"]) == {"first-gpu", *synthetic_suite.RUNGS}
    for t, (batch, iters) in synthetic_suite.RUNGS.items():
        e = synthetic.SUITE[t]
        assert dataclasses.replace(e, extra=()) == dataclasses.replace(base, extra=())
        assert {o for o in e.extra if o.split("=")[0] not in synthetic_suite.BUDGET_KEYS} == {
            o for o in base.extra if o.split("=")[0] not in synthetic_suite.BUDGET_KEYS}
        args = config.parse_args([os.path.join(synthetic.REPO, "configs", "tasks", "recall.py"), *e.extra])
        assert (args["batch_size"], args["max_iters"], args["lr_decay_iters"]) == (batch, iters, iters)
        assert synthetic_report.primary(t) == synthetic_report.PRIMARY["recall"]  # its verdicts are recall's


def test_the_pilot_picks_the_fastest_rung_where_every_setting_passes_the_gate_at_n():
    def rows(task, acc):  # accuracy at N and at 2 N of each setting, seed 0 (the settings not named: 1.0)
        acc = {**dict.fromkeys(synthetic_suite.GPU_SETTINGS, 1.0), **acc}
        return [dict(task=task, setting=s, seed="0", length=str(m * 256), train_length="256", accuracy=str(a),
                     condition="", rope="nope") for s, a in acc.items() for m in (1, 2)]
    def steps(task, train_s):
        return [dict(task=task, setting=s, seed=0, train_s=train_s) for s in ("softmax", "ssmax")]
    slow, fast, half = "recall-gpu-b32-i4000", "recall-gpu-b128-i1500", "recall-gpu-b128-i4000"
    acc = rows("recall-gpu", {"softmax": 0.1, "ssmax": 0.2}) + rows(slow, {"softmax": 0.97, "ssmax": 0.99}) + rows(
        fast, {"softmax": 0.96, "ssmax": 1.0}) + rows(half, {"softmax": 1.0, "ssmax": 0.94})
    times = steps("recall-gpu", 30) + steps(slow, 80) + steps(fast, 60) + steps(half, 10)
    assert synthetic.select_budget(acc, times) == fast  # half is fastest, but one setting misses the gate
    # a resumed pilot records a reused run again at ~0 s: a run's time is its longest record
    assert synthetic.select_budget(acc, times + steps(slow, 0.1) + steps(fast, 0.1) + steps(slow, 50)) == fast
    tied = steps("recall-gpu", 30) + steps(slow, 60) + steps(fast, 60)
    assert synthetic.select_budget(acc, tied) == slow  # the same time: fewer tokens (32 x 4,000 < 128 x 1,500)
    assert synthetic.select_budget([r for r in acc if r["task"] in ("recall-gpu", half)], times) is None
    # plan.md: every setting reaches 0.95 at N; one evaluated nowhere (no rows) has not
    assert synthetic.select_budget([r for r in acc if (r["task"], r["setting"]) != (fast, "ssmax")], times) == slow
    assert synthetic.select_budget([r for r in acc if r["task"] == fast and r["setting"] != "ssmax"], times) is None


def test_the_sweeps_gate_takes_a_mean_of_0_95_and_reads_only_the_nope_evaluation():
    rows = [*_sweep_rows("first-lr0.001", "fox", 0.95, 0.6),  # eligible at exactly 0.95, best at 128 N
            *_sweep_rows("first-lr0.003", "fox", 0.90, 0.7), *_sweep_rows("first-lr0.01", "fox", 0.96, 0.5),
            *(dict(r, rope="theta") for r in _sweep_rows("first-lr0.003", "fox", 1.0, 1.0))]  # not the sweep's
    assert synthetic.select_lr(rows) == {"first": {"fox": 1e-3}}


def test_the_pilots_gate_is_each_settings_mean_over_seeds_at_n():
    rows = [dict(task="recall-gpu", setting="softmax", seed=str(seed), length=str(m * 256), train_length="256",
                 accuracy=str(a), condition="", rope="nope") for seed, at_n in ((0, 0.92), (1, 1.0))
            for m, a in ((1, at_n), (2, 0.1))]  # mean 0.96 at N; 2 N is not the gate's
    rows += [dict(rows[0], setting=s, accuracy="1.0") for s in synthetic_suite.GPU_SETTINGS if s != "softmax"]
    steps = [dict(task="recall-gpu", setting="softmax", seed=seed, train_s=10) for seed in (0, 1)]
    assert synthetic.select_budget(rows, steps) == "recall-gpu"
