"""tasks.py and eval_tasks.py: every generator's labels equal a brute-force checker's (small sizes, odd lengths, train
and test layouts), generation is a pure function of (seed, stream, index), training through train.py (resume exact,
NoPE, the real-valued model), eval_tasks.py's accuracy.csv and attention.csv, and the Wilson interval. Tiny sizes,
CPU only."""
import csv
import math
import os
from types import SimpleNamespace

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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cfg(task, **kw):
    return SimpleNamespace(**{**vars(tasks.TaskConfig()), "task": task, "seed": 3, **kw})


# ----------------------------------------------------------------------------------------------------------------
# Brute-force checkers: each recomputes a sequence's labels from its tokens (or reals) alone, reading left to right


def check_first(x, y, c):
    assert x[0] == 2 and set(x[1:].tolist()) <= {0, 1}
    return [-1] + [int(x[1])] * (len(x) - 1)


def check_recall(x, y, c):
    K, want, seen, queried = c.task_keys, [], {}, set()
    for tok in x.tolist():
        if tasks.FILL <= tok < tasks.FILL + K * K:  # a pair token "key:value"
            key, val = divmod(tok - tasks.FILL, K)
            seen.setdefault(key, []).append(val)
            want.append(-1)
        elif tasks.FILL + K * K <= tok < tasks.FILL + K * K + K:  # a query: its key is in exactly one earlier pair
            key = tok - tasks.FILL - K * K
            assert len(seen[key]) == 1 and key not in queried
            queried.add(key)
            want.append(tasks.FILL + K * K + K + seen[key][0])
        else:
            assert 0 <= tok < tasks.FILL and c.task_filler == "noise"
            want.append(-1)
    assert len(queried) == c.task_pairs and all(len(seen[k]) == 1 for k in queried)  # no distractor has its key
    return want


def check_mqar(x, y, c):
    D, K = c.task_pairs, c.task_keys
    store = {}
    for i in range(D):
        k, v = int(x[2 * i]) - tasks.FILL, int(x[2 * i + 1]) - tasks.FILL - K
        assert 0 <= k < K and 0 <= v < K and k not in store
        store[k] = v
    want = [-1] * (2 * D)
    for tok in x[2 * D:].tolist():
        want.append(tasks.FILL + K + store[tok - tasks.FILL] if tok >= tasks.FILL else -1)
    assert sum(w != -1 for w in want) == D  # every key queried once
    return want


def check_flipflop(x, y, c):
    want, last = [], None
    for i, tok in enumerate(x.tolist()):
        if i % 2:  # a bit
            assert tok in (3, 4)
            want.append(-1)
            continue
        if i == len(x) - 1:  # an odd length ends with a lone ignore
            assert tok == 2
            want.append(-1)
            continue
        if tok == 0:
            last = int(x[i + 1])
        want.append(last if tok == 1 else -1)
        if tok == 1:
            assert x[i + 1] == last  # a read repeats the last write
    assert x[0] == 0 and want[2 * (len(x) // 2) - 2] != -1  # starts with a write, ends with a read
    return want


def check_every(x, y, c):
    return [float(all(v > 0 for v in x[:t + 1, 0])) for t in range(len(x))]


def check_some(x, y, c):
    return [float(any(v > 0 for v in x[:t + 1, 0])) for t in range(len(x))]


def check_linear(x, y, c):
    xs, ys = x[0::2, 0], x[1::2, 1]
    assert np.all(x[0::2, 2] == 1) and np.all(x[1::2, 2] == 0)
    a = (ys[1] - ys[0]) / (xs[1] - xs[0]) if len(ys) > 1 else None  # the line through the first two points
    want = [math.nan] * len(x)
    for k in range(2, len(xs)):
        want[2 * k] = a * xs[k] + ys[0] - a * xs[0]
    return want


CHECKERS = {"first": check_first, "recall": check_recall, "mqar": check_mqar, "flipflop": check_flipflop,
            "every": check_every, "some": check_some, "linear": check_linear}


@pytest.mark.parametrize("task", sorted(tasks.TASKS))
def test_labels_hold_at_each_tasks_shortest_length(task):  # flipflop at 2 had a read before any write
    c = cfg(task)
    for L in (tasks.min_length(c), tasks.min_length(c) + 1):
        x, y = tasks.get_batch(c, 2, torch.arange(40), L, True)
        for xi, yi in zip(x.numpy(), y.numpy()):
            want = np.array(CHECKERS[task](xi, yi, c), dtype=np.float64)
            np.testing.assert_allclose(yi.astype(np.float64), want, rtol=1e-4, atol=1e-4, equal_nan=True)


def test_every_task_has_a_checker():
    assert set(CHECKERS) == set(tasks.TASKS)


@pytest.mark.parametrize("task", sorted(tasks.TASKS))
@pytest.mark.parametrize("L", [13, 31, 64])
@pytest.mark.parametrize("test", [False, True], ids=["train", "test"])
def test_labels_equal_the_brute_force_checker(task, L, test):
    c = cfg(task)
    variants = [("noise", {"task_filler": "noise"})] if task == "recall" else []
    for condition, over in [*tasks.TASKS[task].conditions, *variants]:
        cc = cfg(task, **over)
        x, y = tasks.get_batch(cc, 2, torch.arange(40), L, test)
        assert x.shape[:2] == y.shape == (40, L)
        for xi, yi in zip(x.numpy(), y.numpy()):
            want = np.array(CHECKERS[task](xi, yi, cc), dtype=np.float64)
            np.testing.assert_allclose(yi.astype(np.float64), want, rtol=1e-4, atol=1e-4, equal_nan=True)
    if task in ("recall", "mqar") and test:  # at test, the queries are the last task_pairs positions
        assert ((y[:, -c.task_pairs:] != -1).all() and (y[:, :-c.task_pairs] == -1).all())


def test_quantifier_sequences_are_balanced_and_flipflop_keeps_its_ignore_rate():
    x, y = tasks.get_batch(cfg("every"), 0, torch.arange(2000), 16)
    assert 0.45 < y[:, -1].mean() < 0.55  # half hold no counterexample
    x, _ = tasks.get_batch(cfg("flipflop", task_p_ignore=0.98), 0, torch.arange(200), 200)
    ops = x[:, 2:-2:2]  # between the forced first write and last read
    assert 0.97 < (ops == 2).float().mean() < 0.99


def test_a_batch_is_a_pure_function_of_seed_stream_and_index_so_any_slice_is_the_same_data():
    c = cfg("recall")
    a = tasks.get_batch(c, 0, torch.arange(8), 33)
    assert all(torch.equal(u, v) for u, v in zip(a, tasks.get_batch(c, 0, torch.arange(8), 33)))
    part = tasks.get_batch(c, 0, torch.arange(4, 8), 33)  # a DDP rank's slice
    assert torch.equal(part[0], a[0][4:]) and torch.equal(part[1], a[1][4:])
    assert not torch.equal(tasks.get_batch(c, 1, torch.arange(8), 33)[0], a[0])  # val is another stream
    assert not torch.equal(tasks.get_batch(cfg("recall", seed=4), 0, torch.arange(8), 33)[0], a[0])


def test_bad_task_settings_are_one_clear_message():
    for c, words in ((cfg("nope"), "unknown task 'nope'"), (cfg("recall", task_pairs=16), "task_pairs=16"),
                     (cfg("flipflop", task_p_ignore=1.0), "task_p_ignore"), (cfg("recall", task_filler="x"), "pairs")):
        with pytest.raises(ValueError, match=words):
            tasks.check_config(c)


def test_wilson_interval_matches_the_closed_form():
    lo, hi = compare.wilson(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    lo, hi = compare.wilson(0, 20)
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(0.1611, abs=1e-4)


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


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


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


@pytest.mark.parametrize("scorer", ["softmax", "sigmoid", "stickbreaking"])
def test_diagnosed_entropy_is_of_the_row_normalised_to_sum_1(scorer):
    # sigmoid's raw rows sum to more than 1: -sum w log w of them exceeded log L (9.42 nats at L = 4,096)
    torch.manual_seed(0)
    c = cfg("first")
    model = GPT(GPTConfig(vocab_size=tasks.TASKS["first"].vocab(c), n_layer=1, n_head=2, n_embd=16, ffn_hidden=32,
                          block_size=8, pos="nope", scorer=scorer))
    for L in (8, 64):
        rows = eval_tasks.diagnose(model, c, L, 4, 0)
        P = model.attention_rows(tasks.get_batch(c, 0, torch.arange(4), L, test=True)[0], rows=(-1,))[:, :, :, 0]
        for r in rows:
            w = P[r["layer"], :, r["head"]].double()
            p = w / w.sum(-1, keepdim=True)
            assert r["entropy"] == pytest.approx(float(-torch.special.xlogy(p, p).sum(-1).mean()), rel=1e-5)
            assert 0 <= r["entropy"] <= math.log(L) + 1e-5
            assert r["row_mass"] == pytest.approx(float(w.sum(-1).mean()), rel=1e-5)
            assert scorer != "softmax" or r["row_mass"] == pytest.approx(1.0, abs=1e-5)
