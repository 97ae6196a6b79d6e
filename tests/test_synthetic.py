"""The synthetic suite (synthetic.py): softmax-logN is softmax with every row's logits times log N, a bias option
needs its bias, a tiny end-to-end run that writes every file into the untracked folder (the committed one only when
asked) and skips finished runs, an entry's own prompt count, recipes and seeds, a failed run is one error line, and
reproduce.py's one-line argument errors. CPU only."""
import csv
import dataclasses
import gzip
import json
import math
import subprocess

import pytest
import torch

import eval_tasks
import reproduce
from lib import config, runs, synthetic
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
