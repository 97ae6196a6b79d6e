"""Task models, trained and evaluated: the NoPE model sees a permuted prefix as the same set, the real-valued model
(linear input, scalar head, non-NaN targets scored), training through train.py (resume exact, one-line errors),
eval_tasks.py's accuracy.csv, per_prompt.csv and attention.csv (--rope theta never below the trained θ), its
diagnosed entropy of the normalised row, and the Wilson interval. Tiny sizes, CPU only."""
import csv
import math
import os

import numpy as np
import pytest
import torch

import eval_tasks
import tasks
import train
from lib import compare
from lib.checkpoint import build_model
from model import GPT, GPTConfig
from lib.checkpoint import RealGPT
from test_tasks import cfg


def test_wilson_interval_matches_the_closed_form():
    lo, hi = compare.wilson(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    lo, hi = compare.wilson(0, 20)
    assert lo == 0.0 and hi == pytest.approx(0.1611, abs=1e-4)  # not -2.8e-17: within [0, 1]
    assert all(0.0 <= x <= 1.0 for k in range(65) for x in compare.wilson(k, 64))


# ----------------------------------------------------------------------------------------------------------------
# The model: NoPE, the real-valued input and scalar head


def test_nope_model_sees_a_permuted_prefix_as_the_same_set_and_rope_model_does_not():
    torch.manual_seed(0)
    x, y = torch.tensor([[1, 2, 3, 2, 2, 5]]), torch.tensor([[2, 3, 1, 2, 2, 5]])  # the same tokens before the last
    for pos in ("nope", "rope"):
        m = GPT(GPTConfig(vocab_size=8, n_layer=1, n_head=2, n_embd=16, ffn_hidden=32, block_size=8, pos=pos))
        with torch.no_grad():
            m.transformer.h[0].attn.c_attn.weight.mul_(30)  # sharp attention: position matters visibly with RoPE
        diff = (m(x, x)[0][0, -1] - m(y, y)[0][0, -1]).abs().max().item()
        assert diff < 1e-6 if pos == "nope" else diff > 1e-4, (pos, diff)


def test_real_valued_model_embeds_features_linearly_and_scores_only_non_nan_targets():
    c = cfg("linear")
    model = build_model(GPTConfig(vocab_size=1, n_layer=1, n_head=2, n_embd=16, ffn_hidden=32, block_size=16),
                              "linear")
    assert isinstance(model, RealGPT) and model.transformer.wte.in_features == 3
    x, y = tasks.get_batch(c, 0, torch.arange(4), 11)
    logits, loss = model(x, y)
    scored = ~torch.isnan(y)
    assert logits.shape == (4, 11, 1)
    assert loss.item() == pytest.approx(((logits[..., 0] - y)[scored] ** 2).mean().item(), rel=1e-5)
    every = build_model(GPTConfig(vocab_size=1, n_layer=1, n_head=2, n_embd=16, ffn_hidden=32), "every")
    x, y = tasks.get_batch(cfg("every"), 0, torch.arange(4), 9)
    logits, loss = every(x, y)
    want = torch.nn.functional.binary_cross_entropy_with_logits(logits[..., 0], y)
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# Through train.py, and the eval command


TINY = ["device=cpu", "n_layer=1", "n_head=2", "n_embd=16", "ffn_hidden=32", "batch_size=4", "eval_iters=1",
        "log_interval=1", "warmup_iters=2", "learning_rate=1e-2", "gradient_accumulation_steps=1"]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: tiny models, one thread


def run(out, *extra):
    train.main([*TINY, f"out_dir={out}", *extra])
    return torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)


def test_a_task_trains_through_train_py_and_resumes_exactly(tmp_path):
    whole = run(tmp_path / "whole", "task=recall", "task_pairs=2", "block_size=12", "max_iters=6", "eval_interval=3")
    assert whole["model_args"]["vocab_size"] == tasks.TASKS["recall"].vocab(cfg("recall"))  # set by the task
    run(tmp_path / "part", "task=recall", "task_pairs=2", "block_size=12", "max_iters=3", "eval_interval=3")
    part = run(tmp_path / "part", "task=recall", "task_pairs=2", "block_size=12", "max_iters=6", "eval_interval=3",
               "resume=True")
    assert all(torch.equal(v, part["model"][k]) for k, v in whole["model"].items())
    assert os.path.isfile(tmp_path / "whole" / "loss.png")


def test_real_valued_task_trains_and_bad_task_input_is_one_error_line(tmp_path):
    ck = run(tmp_path / "lin", "task=linear", "block_size=10", "max_iters=2", "eval_interval=2", "pos=nope")
    assert ck["model_args"]["vocab_size"] == 1 and ck["model_args"]["pos"] == "nope"
    for argv, words in ((["task=wat"], "unknown task 'wat'"), (["task=mqar", "block_size=8"], "too short"),
                        (["task=first", "vocab_size=9"], "does not match task 'first'"), (["pos=alibi"], "pos")):
        with pytest.raises(SystemExit) as e:
            train.main([*TINY, f"out_dir={tmp_path / 'x'}", "max_iters=1", *argv])
        assert str(e.value.code).startswith("error: ") and words in str(e.value.code), e.value.code
    ck["model_args"]["qk_clip"] = 30.0  # a checkpoint of another version or branch: one line, not a TypeError
    torch.save(ck, tmp_path / "other.pt")
    with pytest.raises(SystemExit) as e:
        eval_tasks.main([str(tmp_path / "other.pt"), "--lengths", "10", "--out_dir", str(tmp_path / "ev")])
    assert "other.pt' does not fit this model: TypeError" in str(e.value.code) and "qk_clip" in str(e.value.code)


def test_eval_writes_accuracy_with_wilson_intervals_and_attention_diagnostics(tmp_path, capsys):
    run(tmp_path / "first-softmax", "task=first", "block_size=8", "max_iters=2", "eval_interval=2", "pos=nope")
    run(tmp_path / "first-ssmax", "task=first", "block_size=8", "max_iters=2", "eval_interval=2", "pos=nope",
        "scorer=ssmax", "ssmax_learn_s=False")
    run(tmp_path / "flip", "task=flipflop", "block_size=8", "max_iters=1", "eval_interval=1")
    ckpts = [str(tmp_path / d / "ckpt.pt") for d in ("first-softmax", "first-ssmax", "flip")]
    eval_tasks.main([*ckpts, "--lengths", "8", "17", "--n", "6", "--out_dir", str(tmp_path / "ev"),
                     "--diagnose", "3", "--rope", "plain", "theta"])
    rows = list(csv.DictReader(open(tmp_path / "ev" / "accuracy.csv")))
    assert set(eval_tasks.ACC_COLUMNS) <= set(rows[0])
    first = [r for r in rows if r["task"] == "first"]
    assert {(r["model"], r["scorer"], r["length"], r["rope"]) for r in first} == {
        (m, s, L, "nope") for m, s in (("first-softmax", "softmax"), ("first-ssmax", "ssmax-fixed-s"))
        for L in ("8", "17")}
    for r in rows:
        acc, lo, hi = float(r["accuracy"]), float(r["ci_low"]), float(r["ci_high"])
        k = round(acc * 6)
        assert (lo, hi) == pytest.approx(compare.wilson(k, 6)) and lo <= acc <= hi and r["n"] == "6"
    prompts = list(csv.DictReader(open(tmp_path / "ev" / "per_prompt.csv")))  # one row per prompt, paired by id
    assert tuple(prompts[0]) == eval_tasks.PROMPT_COLUMNS
    ids = {}
    for p in prompts:
        ids.setdefault((p["run"], p["length"], p["condition"], p["rope"]), []).append(int(p["prompt_id"]))
    assert all(v == list(range(6)) for v in ids.values())
    assert {k[1:] for k in ids if k[0] == "first-softmax"} == {k[1:] for k in ids if k[0] == "first-ssmax"}
    for r in rows:  # each accuracy.csv row is the mean of its prompts
        mine = [p for p in prompts if (p["run"], p["length"], p["condition"], p["rope"]) ==
                (r["model"], r["length"], r["condition"], r["rope"])]
        assert float(r["accuracy"]) == pytest.approx(np.mean([int(p["correct"]) for p in mine]))
        assert float(r["loss"]) == pytest.approx(np.mean([float(p["answer_loss"]) for p in mine]), rel=1e-5)
    flip = {(r["condition"], r["rope"]) for r in rows if r["task"] == "flipflop"}
    assert flip == {(c, rope) for c, _ in tasks.TASKS["flipflop"].conditions for rope in ("plain", "theta")}
    att = list(csv.DictReader(open(tmp_path / "ev" / "attention.csv")))
    fixed = [r for r in att if r["scorer"] == "ssmax-fixed-s"]
    assert fixed and all(float(r["s"]) == 1.0 for r in fixed)  # the learned (here fixed) s per head is reported
    for r in att:
        if r["task"] == "first":
            assert 0 <= float(r["target_mass"]) <= 1 and float(r["uniform"]) == 1 / int(r["length"])
            assert 0 <= float(r["entropy"]) <= math.log(int(r["length"])) + 1e-5
    with pytest.raises(SystemExit) as e:  # a bad checkpoint stops before anything is evaluated
        bad = tmp_path / "bad.pt"
        bad.write_text("not a checkpoint")
        eval_tasks.main([ckpts[0], str(bad), "--lengths", "8", "--out_dir", str(tmp_path / "ev2")])
    assert "bad.pt" in str(e.value.code) and not (tmp_path / "ev2").exists()
    lm = tmp_path / "lm.pt"  # a language model's checkpoint: no task in its config
    ck = torch.load(ckpts[0], weights_only=True)
    torch.save({**ck, "config": {k: v for k, v in ck["config"].items() if k != "task"}}, lm)
    with pytest.raises(SystemExit) as e:
        eval_tasks.main([ckpts[0], str(lm), "--lengths", "8", "--out_dir", str(tmp_path / "ev3")])
    assert "is a language model, not a task run" in str(e.value.code) and not (tmp_path / "ev3").exists()
    if not torch.cuda.is_available():  # a device this machine lacks: one line, nothing written
        with pytest.raises(SystemExit) as e:
            eval_tasks.main([ckpts[0], "--lengths", "8", "--device", "cuda", "--out_dir", str(tmp_path / "ev4")])
        assert "ckpt.pt: --device cuda: CUDA is not available here" in str(e.value.code)
        assert not (tmp_path / "ev4").exists()


def test_eval_rope_theta_keeps_the_trained_theta_at_lengths_within_training(tmp_path):
    run(tmp_path / "flip", "task=flipflop", "block_size=16", "max_iters=1", "eval_interval=1")
    eval_tasks.main([str(tmp_path / "flip" / "ckpt.pt"), "--lengths", "8", "32", "--n", "4", "--rope", "plain",
                     "theta", "--out_dir", str(tmp_path / "ev")])
    prompts = list(csv.DictReader(open(tmp_path / "ev" / "per_prompt.csv")))
    loss = lambda rope, L: [p["answer_loss"] for p in prompts if (p["rope"], p["length"]) == (rope, L)]
    assert loss("theta", "8") == loss("plain", "8")  # θ x 1 at L = 8 < N = 16, never x 1/2
    assert loss("theta", "32") != loss("plain", "32")  # θ x 2 past N


@pytest.mark.parametrize("scorer", ["softmax", "sigmoid", "stickbreaking"])
def test_diagnosed_entropy_is_of_the_row_normalised_to_sum_1(scorer):
    # sigmoid's raw rows sum to more than 1: -sum w log w of them exceeded log L (9.42 nats at L = 4,096)
    torch.manual_seed(0)
    c = cfg("first")
    model = GPT(GPTConfig(vocab_size=tasks.TASKS["first"].vocab(c), n_layer=1, n_head=2, n_embd=16, ffn_hidden=32,
                          block_size=8, pos="nope", scorer=scorer))
    for L in (8, 64):
        rows = eval_tasks.diagnose(model, c, L, 4, 0)
        x = tasks.get_batch(c, 0, torch.arange(4), L, test=True)[0]
        P, tgt = model.attention_rows(x, rows=(-1,))[:, :, :, 0], tasks.target_positions(c, x)
        for r in rows:
            w = P[r["layer"], :, r["head"]].double()
            assert r["target_mass"] == pytest.approx(float(w[torch.arange(4), tgt].mean()), rel=1e-5)  # the target's
            p = w / w.sum(-1, keepdim=True)
            assert r["entropy"] == pytest.approx(float(-torch.special.xlogy(p, p).sum(-1).mean()), rel=1e-5)
            assert 0 <= r["entropy"] <= math.log(L) + 1e-5
            assert r["row_mass"] == pytest.approx(float(w.sum(-1).mean()), rel=1e-5)
            assert scorer != "softmax" or r["row_mass"] == pytest.approx(1.0, abs=1e-5)


def test_bytes_per_token_counts_heads_of_their_own_width():
    # head_dim 128 at width 64, 4 heads: q, k, v and y are 512 wide each, not 64 (measured on a CPU forward at 32,768
    # tokens: 18,012 bytes a token against 4,009 at head_dim None; the estimate said 3,136 for both)
    from eval_tasks import bytes_per_token
    base = dict(vocab_size=16, block_size=64, n_layer=2, n_head=4, n_embd=64, ffn_hidden=176)
    plain, wide = bytes_per_token(GPTConfig(**base)), bytes_per_token(GPTConfig(**base, head_dim=128))
    assert plain == 3136  # unchanged where heads split n_embd
    assert wide - plain >= 4 * (4 * 512 - 4 * 64)  # q, k, v, y: 512 floats each where 64 were counted
    assert bytes_per_token(GPTConfig(**base, head_dim=8)) == plain  # narrower heads: n_embd's count still bounds it


def test_a_task_drawing_a_token_past_its_vocabulary_stops_train_py_with_one_error_line(tmp_path, monkeypatch):
    # tasks.get_batch's TaskError, which train.py reports in a line (an IndexError in torch had not been)
    monkeypatch.setitem(tasks.TASKS, "induction", tasks.Task(lambda L, rng, c, test: (np.arange(L), np.arange(L)),
                                                             lambda c: 4))
    with pytest.raises(SystemExit) as e:
        train.main([*TINY, f"out_dir={tmp_path / 'x'}", "max_iters=1", "task=induction", "block_size=6"])
    assert str(e.value.code).startswith("error: task 'induction' drew token ids 0..5 at length 6"), e.value.code
