"""The synthetic suite (synthetic.py, synthetic_report.py): softmax-logN is softmax with every row's logits times
log N, the seed-level summary (paired differences, t intervals, sign-flip p, horizons) and its verdict rule, a tiny
end-to-end run that writes every file into the untracked folder (the committed one only when asked) and skips
finished runs, and reproduce.py's one-line argument errors. CPU only."""
import csv
import dataclasses
import gzip
import json
import math
import os
import subprocess

import pytest
import torch

import eval_tasks
import reproduce
from lib import compare, config, runs, synthetic, synthetic_report, synthetic_suite
from model import GPT, GPTConfig, attention


def test_softmax_logN_multiplies_every_rows_logits_by_log_N_against_the_float64_reference():
    over = synthetic.overrides("first", "softmax-logN")  # N = 32
    args = config.parse_args(over)
    model = GPT(GPTConfig(**{k: v for k, v in args.items() if k in GPTConfig.__dataclass_fields__},
                          n_layer=1, n_head=2, n_embd=16, vocab_size=8))
    params = model.transformer.h[0].attn.scorer_params()
    assert torch.equal(params["s"], torch.zeros(2)) and torch.allclose(params["b"], torch.full((2,), math.log(32)))
    assert not any(p.requires_grad for n, p in model.named_parameters() if "ssmax" in n)  # fixed, never trained
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 70, 8, dtype=torch.float64) for _ in range(3))  # rows far past N too
    z = q @ k.transpose(-2, -1) / math.sqrt(8) * math.log(32)
    want = torch.softmax(z.masked_fill(torch.ones(70, 70, dtype=torch.bool).triu(1), float("-inf")), -1) @ v
    for backend in ("torch", "sdpa", "auto"):
        got = attention(q.float(), k.float(), v.float(), "ssmax", s=params["s"], b=params["b"], backend=backend)
        assert (got.double() - want).abs().max() < 1e-5, backend


def test_a_bias_option_without_the_bias_is_one_clear_error():
    with pytest.raises(ValueError, match="ssmax_b_init=2.0 needs ssmax_bias=True"):
        GPTConfig(scorer="ssmax", ssmax_b_init=2.0)


def _rows(setting, seed, accs, task="first"):
    return [dict(task=task, base="first", setting=setting, seed=seed, length=32 * m, train_length=32, accuracy=a,
                 mse="", loss=0.1, condition="", rope="nope") for m, a in zip((1, 2, 4), accs)]


def test_summary_pairs_by_seed_with_t_interval_sign_flip_p_and_horizons():
    acc = [r for seed in range(6) for r in _rows("softmax", seed, (1.0, 0.9, 0.5 + 0.05 * seed))
           + _rows("ssmax", seed, (1.0, 1.0, 0.97 if seed else 0.8))]
    t = synthetic_report.summarize(acc)["first"]
    cell = next(c for c in t["cells"] if (c["setting"], c["multiple"]) == ("ssmax", 4))
    d = [(0.97 if s else 0.8) - (0.5 + 0.05 * s) for s in range(6)]
    assert cell["vs_softmax"]["diffs"] == pytest.approx(d) and cell["per_seed"][0] == 0.8
    mean, sd, lo, hi = compare.seed_interval(d)
    assert (cell["vs_softmax"]["ci_lo"], cell["vs_softmax"]["ci_hi"]) == pytest.approx((lo, hi))
    assert cell["vs_softmax"]["sign_flip_p"] == pytest.approx(2 / 64)  # every seed better: 2 of 64 assignments
    assert t["horizons"]["|nope"]["softmax"] == {s: 1 for s in range(6)}  # 0.9 at 2 N fails
    assert t["horizons"]["|nope"]["ssmax"] == {0: 2, **{s: 4 for s in range(1, 6)}}
    (v,) = t["verdicts"][0]
    assert v["verdict"] == "reproduced" and v["multiple"] == 4 and t["gate"]["passed"]


@pytest.mark.parametrize("ssmax_at_n,ssmax_long,softmax_long,verdict", [
    (0.5, 1.0, 0.5, "not testable"),  # ssmax misses the gate at N
    (1.0, 0.2, 0.6, "contradicted"),  # worse on every seed
    (1.0, 1.0, 1.0, "not testable"),  # softmax solves the length: no room to show the claim
    (1.0, None, 0.5, "inconclusive"),  # better on half the seeds, worse on the other half
])
def test_the_verdict_rule(ssmax_at_n, ssmax_long, softmax_long, verdict):
    acc = [r for seed in range(6) for r in _rows("softmax", seed, (1.0, 1.0, softmax_long))
           + _rows("ssmax", seed, (ssmax_at_n, 1.0, ssmax_long if ssmax_long is not None else (0.9 if seed % 2
                                                                                                else 0.1)))]
    (v,) = synthetic_report.summarize(acc)["first"]["verdicts"][0]
    assert v["verdict"] == verdict, v


def test_every_and_some_are_never_contradicted_they_do_not_test_length():
    acc = [r for seed in range(6) for r in _rows("softmax", seed, (1.0, 1.0, 0.9), task="every")
           + _rows("ssa", seed, (1.0, 1.0, 0.2), task="every")]
    for r in acc:
        r.update(base="every", condition="sigma=10")
    (v,) = synthetic_report.summarize(acc)["every"]["verdicts"][0]
    assert v["verdict"] == "not reproduced at this scale" and "not length" in v["why"]


def test_verdict_and_control_tables_report_holm_over_their_rows_and_say_at_ceiling_instead_of_an_interval():
    acc = [r for seed in range(6) for s, accs in (("softmax", (1.0, 0.9, 0.5)), ("ssmax", (1.0, 1.0, 1.0)),
                                                  ("lssa", (1.0, 1.0, 0.9 if seed else 0.4)),
                                                  ("ssmax-s2", (1.0, 1.0, 1.0)), ("ssmax-fixed-s", (1.0, 1.0, 1.0)))
           for r in _rows(s, seed, accs)]
    t = synthetic_report.summarize(acc)["first"]
    ssmax, fixed, lssa = (next(v for v in t["verdicts"][0] if v["setting"] == s) for s in ("ssmax", "ssmax-fixed-s",
                                                                                          "lssa"))
    # p: 2/64, 2/64 and 4/64 (lssa's seed 0 is worse): Holm over 3 rows 3 x 2/64, 3 x 2/64, max(that, 1 x 4/64)
    assert (ssmax["holm_p"], fixed["holm_p"], lssa["holm_p"]) == pytest.approx((6 / 64, 6 / 64, 6 / 64))
    assert ssmax["verdict"] == "reproduced"  # the rule, uncorrected, stands as ruled; Holm is reported beside it
    same = next(k for k in t["contrasts"] if (k["a"], k["b"]) == ("ssmax-s2", "ssmax-fixed-s"))
    assert same["accuracy"]["at_bound"] == 1.0 and same["reading"] == "at ceiling"  # not "the same within ±0.05"
    assert same["log2_horizon"]["at_bound"] == 2  # both at the longest length tested, 4 N
    table = synthetic_report.tables({"first": t})
    assert "| ssmax-s2 − ssmax-fixed-s | at ceiling (both 1.000 on every seed) (1) | 1 | at ceiling (both 4 N on " \
           "every seed) (1) | at ceiling |" in table
    assert "| Holm p |" in table and f"| {ssmax['sign_flip_p']:.4f} | 0.0938 | 6 |" in table


def test_a_results_folder_re_reports_from_its_own_accuracy_csv(tmp_path):
    import shutil
    shutil.copytree(os.path.join(synthetic.REPO, "results", "synthetic-first-long"), tmp_path / "r")
    before = json.load(open(tmp_path / "r" / "summary.json"))
    synthetic_report.rereport(str(tmp_path / "r"))
    after = json.load(open(tmp_path / "r" / "summary.json"))
    assert after["tasks_summary"] == before["tasks_summary"] and after["run_info"] == before["run_info"]
    committed = os.path.join(synthetic.REPO, "results", "synthetic-first-long", "tables.md")
    assert (tmp_path / "r" / "tables.md").read_text() == open(committed).read()  # the committed tables: this code's
    assert after["rereport_run_info"]["git_sha"]


def test_the_suite_trains_evaluates_reports_and_skips_finished_runs(tmp_path, monkeypatch):
    tiny = ("max_iters=2", "eval_interval=2", "n_embd=16", "ffn_hidden=32", "batch_size=4")
    monkeypatch.setattr(synthetic, "REPO_OUT", str(tmp_path))
    monkeypatch.setitem(synthetic.SUITE, "first", dataclasses.replace(synthetic.SUITE["first"], extra=tiny,
                                                                      multiples=(1, 2)))
    settings = ["softmax", "softmax-logN", "softmax-qwen"]  # qwen: the softmax runs evaluated rescaled, not trained
    synthetic.main(jobs=2, n_eval=4, settings=settings, task_names=["first"], seeds=[0, 1])
    assert not (tmp_path / "out-synthetic" / "first-softmax-qwen-s0" / "ckpt.pt").exists()
    res = tmp_path / "out-results" / "synthetic"  # untracked by default
    assert not (tmp_path / "results").exists()
    rows = list(csv.DictReader(open(res / "accuracy.csv")))
    assert {(r["task"], r["setting"], r["seed"], r["length"]) for r in rows} == {
        ("first", s, str(seed), str(L)) for s in settings for seed in (0, 1) for L in (32, 64)}
    with gzip.open(res / "per_prompt.csv.gz", "rt") as f:
        prompts = list(csv.DictReader(f))
    assert set(eval_tasks.PROMPT_COLUMNS) <= set(prompts[0])
    ids = {}
    for p in prompts:
        ids.setdefault((p["seed"], p["length"]), {}).setdefault(p["setting"], []).append(p["prompt_id"])
    assert all(v["softmax"] == v["softmax-logN"] == v["softmax-qwen"] == ["0", "1", "2", "3"] for v in ids.values())
    acc = {(r["setting"], r["seed"], r["length"]): r["accuracy"] for r in rows}
    assert all(acc["softmax-qwen", s, "32"] == acc["softmax", s, "32"] for s in ("0", "1"))  # factor 1 up to N
    summary = json.load(open(res / "summary.json"))
    first = summary["tasks_summary"]["first"]
    assert first["gate"]["rule"] and summary["tasks"]["first"]["seeds"] == [0, 1]
    assert summary["command"] == ("python reproduce.py --suite synthetic --tasks first --settings softmax softmax-logN "
                                  "softmax-qwen --seeds 0 1")  # the subset as run: how to rerun it
    assert first["contrasts"][0]["a"] == "softmax-logN" and first["contrasts"][0]["b"] == "softmax"
    for f in ("horizons.png", "accuracy.png", "attention.png", "tables.md"):
        assert (res / f).stat().st_size > 0
    steps = (res / "steps.jsonl").read_text().splitlines()
    with pytest.raises(runs.StepError, match="results/synthetic/plan.md is missing"):  # the committed results
        synthetic.main(jobs=2, n_eval=4, settings=settings, task_names=["first"], seeds=[0, 1], commit=True)
    plan = tmp_path / "results" / "synthetic" / "plan.md"  # their rule, committed before the run (a repo of its own)
    plan.parent.mkdir(parents=True)
    plan.write_text("rule\n")
    for cmd in (["init", "-q"], ["add", str(plan)], ["commit", "-q", "-m", "plan"]):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *cmd], check=True)
    synthetic.main(jobs=2, n_eval=4, settings=settings, task_names=["first"], seeds=[0, 1], commit=True)
    again = [json.loads(line) for line in (tmp_path / "results" / "synthetic" / "steps.jsonl").read_text().splitlines()]
    assert len(again) == 6 and not any(r["ran"] for r in again)  # every run was done: nothing trains again
    assert (res / "steps.jsonl").read_text().splitlines() == steps
    summary = json.load(open(tmp_path / "results" / "synthetic" / "summary.json"))
    assert summary["ran"]["first/softmax-qwen"] == [*tiny, "scorer=softmax"]  # what the runs recorded
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert summary["plan"]["commit"] == head.strip() and summary["plan"]["run_started"]
    # other settings for a finished run: refused in one line before it trains, or made again with redo
    monkeypatch.setitem(synthetic.SUITE, "first", dataclasses.replace(synthetic.SUITE["first"], extra=(
        *tiny[:-1], "batch_size=2"), multiples=(1, 2)))
    with pytest.raises(runs.StepError, match=r"overrides.4 \"batch_size=4\" -> \"batch_size=2\".*--redo"):
        synthetic.main(jobs=1, n_eval=4, settings=["softmax"], task_names=["first"], seeds=[0])
    synthetic.main(jobs=1, n_eval=4, settings=["softmax"], task_names=["first"], seeds=[0], redo=True)
    ckpt = torch.load(tmp_path / "out-synthetic" / "first-softmax-s0" / "ckpt.pt", weights_only=True)
    assert ckpt["config"]["batch_size"] == 2
    last = json.loads((res / "steps.jsonl").read_text().splitlines()[-1])
    assert last["ran"] and json.load(open(res / "summary.json"))["ran"]["first/softmax"][-2] == "batch_size=2"


def test_an_entrys_own_prompt_count_and_a_constant_temperature_evaluate_the_softmax_runs(tmp_path, monkeypatch):
    tiny = ("max_iters=2", "eval_interval=2", "n_embd=16", "ffn_hidden=32", "batch_size=4")
    monkeypatch.setattr(synthetic, "REPO_OUT", str(tmp_path))
    monkeypatch.setitem(synthetic.SUITE, "first-control", dataclasses.replace(
        synthetic.SUITE["first-control"], extra=tiny, multiples=(1, 2), n_eval=3))  # 3 prompts, not the suite's 4
    synthetic.main(jobs=1, n_eval=4, settings=["softmax", "softmax-x2"], task_names=["first-control"], seeds=[0])
    runs = tmp_path / "out-synthetic"
    assert not (runs / "first-control-softmax-x2-s0" / "ckpt.pt").exists()  # not trained: softmax's, rescaled
    evals = json.load(open(runs / "first-control-softmax-x2-s0" / "eval_settings.json"))["eval"]
    assert evals[evals.index("--n") + 1] == "3" and evals[-2:] == ["--logit_scale", "2"]
    rows = list(csv.DictReader(open(tmp_path / "out-results" / "synthetic" / "accuracy.csv")))
    assert {r["n"] for r in rows} == {"3"} and {r["setting"] for r in rows} == {"softmax", "softmax-x2"}
    summary = json.load(open(tmp_path / "out-results" / "synthetic" / "summary.json"))
    assert summary["tasks"]["first-control"]["n_eval"] == 3
    assert [(c["a"], c["b"]) for c in summary["tasks_summary"]["first-control"]["contrasts"]] == [
        ("softmax-x2", "softmax")]


@pytest.mark.parametrize("argv,words", [
    (["--quick"], "--quick does nothing with --suite lm"),
    (["--suite", "synthetic", "--variants", "ssa", "--scale", "cpu_char"],
     "--scale, --variants do nothing with --suite synthetic"),  # once silently ignored
    (["--suite", "synthetic", "--max_iters", "5", "--skip", "needle"], "--max_iters, --skip do nothing"),
    (["--suite", "synthetic", "--tasks", "first", "first"], "--tasks first: given twice"),
    (["--seeds", "1", "-2"], "--seeds -2: seeds must be in [0, 2**63)"),
    (["--seeds", "3", "3"], "--seeds 3: given twice"),  # two runs of one seed would write one folder at once
    (["--suite", "synthetic", "--tasks", "nosuch"], "--tasks nosuch: unknown"),
    (["--suite", "synthetic", "--settings", "first", "--jobs", "2"], "--settings first: unknown"),
    (["--suite", "synthetic", "--jobs", "0"], "--jobs 0: must be >= 1"),
    (["--suite", "synthetic", "--scale", "gpu", "--quick"], "--quick with --scale gpu"),
])
def test_reproduce_argument_errors_name_the_argument(argv, words):
    with pytest.raises(SystemExit) as e:
        reproduce.main(argv)
    assert str(e.value.code).startswith("error: ") and words in str(e.value.code)


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


def test_an_entrys_own_recipes_and_first_seed_decide_its_runs():
    e = synthetic.Entry("recall", ("max_iters=9",), settings=("softmax", "fox"), seeds=2, first_seed=10,
                        recipes=(("fox", synthetic.recipe(1e-2)),))
    synthetic.SUITE["t-tuned"] = e
    try:
        assert synthetic.overrides("t-tuned", "fox")[-2:] == ["learning_rate=0.01", "min_lr=0.001"]
        assert "learning_rate=0.01" not in synthetic.overrides("t-tuned", "softmax")
        assert synthetic.plan(["t-tuned"]) == [("t-tuned", s, seed) for s in ("softmax", "fox") for seed in (10, 11)]
    finally:
        del synthetic.SUITE["t-tuned"]


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
    def rows(task, acc):  # accuracy at N and at 2 N of each setting, seed 0
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


def test_a_run_that_fails_is_one_error_line_naming_its_log_and_the_queued_runs_do_not_start(tmp_path, monkeypatch):
    monkeypatch.setattr(synthetic, "REPO_OUT", str(tmp_path))
    tiny = ("max_iters=2", "eval_interval=2", "n_embd=16", "ffn_hidden=32", "batch_size=4")
    monkeypatch.setitem(synthetic.SUITE, "first", dataclasses.replace(synthetic.SUITE["first"], extra=tiny, recipes=(
        ("softmax", ("fgate_bias_init=1.0",)),)))  # refused by train.py: softmax has no forget gate
    with pytest.raises(runs.StepError) as e:
        synthetic.main(jobs=1, n_eval=2, settings=["softmax", "ssmax"], task_names=["first"], seeds=[0, 1, 2])
    # one "error: " (reproduce.py adds it), the run's log named
    assert str(e.value).startswith("option fgate_bias_init=1.0 applies only") and "(log: " in str(e.value)
    started = {p.name for p in (tmp_path / "out-synthetic").glob("*.train.log")}
    assert "first-ssmax-s2.train.log" not in started  # queued runs are cancelled, not run before the error shows


def test_stage_twos_rates_are_what_the_committed_sweeps_rule_chose():
    results = os.path.join(synthetic.REPO, "results", "synthetic-lr")
    chosen = synthetic.select_lr(compare.read_csv(os.path.join(results, "accuracy.csv")))
    assert synthetic_suite.TUNED == chosen == json.load(open(os.path.join(results, "selected.json")))
    for task, rates in chosen.items():
        e = synthetic.SUITE[f"{task}-tuned"]
        assert e.settings == synthetic.SWEPT[task] and list(synthetic.plan([f"{task}-tuned"]))[0][2] == 10
        for setting, lr in rates.items():
            assert synthetic.overrides(f"{task}-tuned", setting)[-2:] == list(synthetic.recipe(lr))
