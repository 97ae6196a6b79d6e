"""reproduce.py end to end at a toy scale: every variant trains, every evaluation writes its outputs, summary.json
gathers them, and a rerun skips every finished step. CPU, tiny models (the GPT-2 vocabulary of `english` stays)."""
import json

import pytest
import torch

import reproduce
from model import ssmax_s_for_switch

TOY = dict(
    model=dict(n_layer=1, n_head=2, n_embd=32, ffn_hidden=64, block_size=64),
    train=dict(batch_size=2, gradient_accumulation_steps=1, max_iters=8, learning_rate=1e-3, warmup_iters=2,
               lr_schedule="constant", eval_interval=4, eval_iters=1, log_interval=4, device="cpu"),
    sft=dict(examples=6, max_iters=2, batch_size=2, learning_rate=1e-3),
    eval=dict(num_seqs=2, needle_contexts=[96], samples=1, passkey_contexts=[96], passkey_samples=1, score_context=96,
              trials=2, batch_size=2))


def test_every_variant_and_evaluation_runs_and_a_rerun_skips_finished_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # data/, out-repro-toy/ and results/toy/ are written under the cwd
    monkeypatch.setitem(reproduce.SCALES, "toy", TOY)
    reproduce.main(["--scale", "toy"])
    res = tmp_path / "results" / "toy"
    steps = [json.loads(line)["step"] for line in open(res / "steps.jsonl")]
    assert {f"train {v}" for v in reproduce.VARIANTS if v not in ("softmax", "ssmax_e", "ssmax_f")} <= set(steps)
    assert {f"sft {v}" for v in reproduce.VARIANTS} <= set(steps) and "train softmax to the switch" in steps

    # the (f) branch starts from the softmax run at the switch, (e) from its end
    load = lambda v: torch.load(tmp_path / "out-repro-toy" / v / "ckpt.pt", map_location="cpu", weights_only=True)
    k = int(reproduce.SWITCH_AT * 8)
    assert load("softmax_at_switch")["iter_num"] == k and load("softmax")["iter_num"] == 8
    assert load("ssmax_f")["iter_num"] == 8 and load("ssmax_f")["model_args"]["scorer"] == "ssmax"
    e = load("ssmax_e")
    assert e["iter_num"] == 0 and e["model_args"]["ssmax_s_init"] == pytest.approx(ssmax_s_for_switch(64))

    summary = json.load(open(res / "summary.json"))
    assert set(summary["final_losses"]) == set(reproduce.VARIANTS)
    assert summary["tokens_per_variant"] == 2 * 64 * 8
    for method in ("theta", "dynamic_ntk"):
        assert set(summary[f"eval_long_{method}"]) == set(reproduce.VARIANTS)
        assert (res / f"eval_long_{method}" / "per_position.png").stat().st_size > 0
        assert (res / f"eval_long_{method}" / "per_sequence.csv").stat().st_size > 0  # paired CIs can be redone
        diffs = summary[f"eval_long_{method}_differences"]  # every variant against softmax, with its 95% CI
        assert {d["model"] for d in diffs} == set(reproduce.VARIANTS) - {"softmax"}
        assert all(d["baseline"] == "softmax" and d["ci_lo"] <= d["mean_diff"] <= d["ci_hi"] for d in diffs)
    for name, sub in (("needle", "sft/"), ("passkey", ""), ("needle_score_trials", "sft/")):  # passkey: pretrained
        assert {c["model"] for c in summary[name]} == {f"out-repro-toy/{sub}{v}" for v in reproduce.VARIANTS}
    for png in ("train_loss.png", "needle/needle.png", "needle/passkey.png", "needle/needle_score_heads.png"):
        assert (res / png).stat().st_size > 0
    rows = open(res / "train_loss.csv").read().splitlines()
    assert rows[0] == "variant,iter,train_loss,val_loss" and len(rows) > len(reproduce.VARIANTS)

    reproduce.main(["--scale", "toy"])  # everything is done: nothing runs again
    assert len(open(res / "steps.jsonl").readlines()) == len(steps)

