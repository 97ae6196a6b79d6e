"""needle.py's prompts in an imported SentencePiece-style tokenizer (Llama 2 / TinyLlama / Mistral: "▁" for a space,
prepended to every text the tokenizer encodes, byte fallback for a newline): the needle, its question, the pass key,
the filler and an SFT answer carry the ids their text has inside running text (no stray "▁" a text of its own gets),
and a token that starts a word ("▁The") is a word start for the needle's placement. Tiny tokenizers trained here on
real English, no download; every prompt starts with the tokenizer's <s> as transformers' does, and a synthetic SFT
example fits --sft_length with it. Skipped without requirements-hf.txt."""
import json
import os
import re
import types

import numpy as np
import pytest

pytest.importorskip("tokenizers")
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

from lib import retrieval, sft, vocab  # noqa: E402
from test_needle import TEXTS  # noqa: E402

BYTES = [f"<0x{i:02X}>" for i in range(256)]


@pytest.fixture(scope="module", params=["llama2", "metaspace"])
def enc(request):
    """A byte-fallback BPE over "▁"-words: <unk> 0, <s> 1, </s> 2 (the end of text), then the 256 bytes. llama2: HF's
    conversion of Llama 2 (a Prepend("▁") normalizer); metaspace: a Metaspace pre-tokenizer, prepend_scheme first."""
    text = open(os.path.join(TEXTS, "as_you_like_it_gut.txt"), encoding="utf-8").read()[:60000]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace("\n", " ")  # for training: no "\n" id, so a newline is <0x0A>
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>", *BYTES],
                                                        initial_alphabet=list("0123456789"), show_progress=False))
    if request.param == "llama2":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.pre_tokenizer = None
    else:
        tok.normalizer = None
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])  # Llama's BOS
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    enc = vocab.HFCodec(tok.to_str(), eot=2)
    assert enc.tok.id_to_token(enc.encode_ordinary("\n")[-1]) == "<0x0A>"
    assert enc.decode(enc.encode_ordinary("a\nb")) == "a\nb"
    return enc


def running(enc, text):
    """text's ids after a word, encoded whole with it."""
    return enc.encode_ordinary("x" + text)[len(enc.encode_ordinary("x")):]


def test_a_needle_and_its_question_have_the_ids_of_running_text(enc):
    hay = enc.encode_ordinary(open(os.path.join(TEXTS, "hamlet_gut.txt"), encoding="utf-8").read()[20000:40000])
    t = retrieval.needle_trial(enc, hay, 300, 50, "Paris", 4812046)
    ids, P = t["ids"].tolist(), retrieval.PROMPTS["bpe"]
    assert ids[t["pos"]:t["span"][1]] == running(enc, P["head"].format(city="Paris") + " 4812046.")
    assert ids[t["span"][0]:t["span"][1]] == running(enc, " 4812046.")  # "▁", 7 digits, ".": no "▁▁"
    assert [enc.tok.id_to_token(i) for i in t["lead"]] == ["▁"]  # the needle score reads the row after it
    assert ids[t["question"]:] == running(enc, P["question"].format(city="Paris"))  # "\nWhat": no "▁<0x0A>"
    assert "is: 4812046." in enc.decode(ids) and " \nWhat" not in enc.decode(ids)


def test_a_passkey_prompt_has_the_ids_of_running_text(enc):
    args = types.SimpleNamespace(mode="passkey", samples=2)
    t = next(retrieval.trials(args, enc, None, 400, np.random.default_rng(0)))
    ids, P, k = t["ids"].tolist(), retrieval.PROMPTS["bpe"], t["number"]
    start = [1] + enc.encode_ordinary(P["intro"])  # <s>, then the intro starts the text ("▁There")
    assert ids[:t["pos"]] == start + running(enc, P["filler"] * 40)[:t["pos"] - len(start)]  # the filler runs on
    key = running(enc, P["passkey"].format(k=k))
    assert ids[t["pos"]:t["pos"] + len(key)] == key and ids[-len(running(enc, P["passkey_question"])):] == running(
        enc, P["passkey_question"])
    assert "  " not in enc.decode(ids)  # no doubled space anywhere


def test_an_sft_answer_continues_its_prompt(enc, tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps({"prompt": "The special magic Paris number is:", "answer": " 4812047."}) + "\n")
    (ids, n_prompt), = sft.load_sft(str(path), 64, enc)
    assert ids.tolist() == [1] + enc.encode_ordinary("The special magic Paris number is: 4812047.") + [2]  # <s> first
    assert n_prompt == 1 + len(enc.encode_ordinary("The special magic Paris number is:"))


def test_a_word_start_is_a_word_start_and_a_needle_without_a_sentence_end_nearby_lands_on_one(enc):
    sentence_end, word_start = retrieval.boundaries(enc)
    hay = enc.encode_ordinary(" and the king and the queen went home" * 30)
    assert word_start[hay].tolist() == [enc.tok.id_to_token(i).startswith("▁") for i in hay]  # 8 of 15 a time
    insert = running(enc, " The code is 4812.")
    for depth in (10, 30, 50, 70, 90):
        ids, pos, _ = retrieval.build_prompt(enc, hay, insert, running(enc, " The code is"), 150, depth)
        assert enc.tok.id_to_token(int(ids[pos + len(insert)])).startswith("▁")  # the haystack resumes at a word


def test_prompts_start_with_the_tokenizers_bos_as_transformers_gives_it(enc, tmp_path):
    assert enc.bos == [1] and enc.tok.encode("a").ids == [1] + enc.encode_ordinary("a")
    hay = enc.encode_ordinary(open(os.path.join(TEXTS, "hamlet_gut.txt"), encoding="utf-8").read()[20000:40000])
    args = types.SimpleNamespace(mode="needle", samples=1, depths=[0, 50])
    for t in retrieval.trials(args, enc, np.array(hay), 200, np.random.default_rng(0)):
        assert t["ids"][0] == 1 and len(t["ids"]) == 200 and t["ids"][t["span"][0] - 1] != 1  # one <s>, at 0
    byte_level = Tokenizer(models.BPE())  # no post-processor (GPT-2-like, Qwen's): no BOS
    assert vocab.HFCodec(byte_level.to_str(), eot=0).bos == [] and vocab.bos(vocab.get_tokenizer()) == []


def test_sample_py_feeds_the_bos_and_prints_the_prompt_without_it(enc, tmp_path, monkeypatch, capsys):
    import sample
    from lib.checkpoint import save_checkpoint
    from model import GPT, GPTConfig
    model = GPT(GPTConfig(vocab_size=enc.n_vocab, n_layer=1, n_head=2, n_embd=32, ffn_hidden=64, block_size=32))
    save_checkpoint({"model": model.state_dict(), "model_args": vars(model.config), "config": {}, "iter_num": 0,
                     "codec": vocab.record(enc)}, str(tmp_path / "ckpt.pt"))
    fed = []
    monkeypatch.setattr(GPT, "generate", lambda self, x, n, **kw: fed.append(x[0].tolist()) or x)
    for start in ("To be", ""):
        sample.main(["--ckpt", str(tmp_path / "ckpt.pt"), "--start", start, "--max_new_tokens", "2",
                     "--num_samples", "1"])
        assert fed[-1] == [1] + enc.encode(start)  # <s> first, as transformers' tokenizer gives it
        assert capsys.readouterr().out.startswith(f"{start}\n")  # printed without it


def test_a_synthetic_sft_example_fits_sft_length_with_its_bos(enc, tmp_path):
    """<s> + prompt + answer, as load_sft reads them back, in at most --sft_length tokens: the BOS is counted in it and
    the text window loses tokens on its left until the prompt's text, encoded again (SentencePiece gives its first word
    a "▁"), fits; the needle and question stay whole."""
    hay = np.array(enc.encode_ordinary(open(os.path.join(TEXTS, "hamlet_gut.txt"), encoding="utf-8").read()[:40000]))
    path = tmp_path / "sft.jsonl"
    for length in (128, 200):
        rows = list(retrieval.synthetic_examples(enc, hay, 40, length, np.random.default_rng(length)))
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        examples = sft.load_sft(str(path), 10 ** 6, enc)  # no crop: each example's own length
        for (ids, n_prompt), row in zip(examples, rows):
            assert ids[0] == 1 and 1 not in ids[1:].tolist() and ids[-1] == enc.eot_token
            assert length - 3 <= len(ids) - 1 <= length  # the model reads all but the end of text
            city, = re.findall(r"The special magic (\w+) number is: \d{7}\.", row["prompt"])
            assert row["prompt"].endswith(retrieval.PROMPTS["bpe"]["question"].format(city=city))
        assert sum(len(ids) - 1 == length for ids, _ in examples) > len(examples) / 2  # the length is used
