"""Character-level data and long-range structure (issue #32): the char codec's round trip and its meta.json, train.py
sizing the model from the dataset's vocabulary, copy_frac's repeated spans (their share, layout and determinism,
training windows only), sample.py decoding characters, and the copy gate (eval_copy.py) on a toy model whose answer
is known by hand."""
import json
import math
import os

import numpy as np
import pytest
import torch

import eval_copy
import sample
import train
from conftest import one_line_error
from lib import corpora, dataset, longrange, vocab
from lib.checkpoint import load_checkpoint
from lib.dataset import DataError
from lib.vocab import CharCodec

TEXT = "To be, or not to be: that is the question.\nWhether 'tis nobler in the mind to suffer\n" * 40
TINY = ["device=cpu", "n_layer=1", "n_head=2", "n_embd=32", "ffn_hidden=64", "block_size=64", "batch_size=2",
        "gradient_accumulation_steps=1", "eval_iters=2", "log_interval=1", "warmup_iters=2", "learning_rate=1e-2"]


@pytest.fixture(scope="module")
def char_data(tmp_path_factory):
    """A local .txt prepared in characters: <dir>/play/{train,val}.bin + meta.json."""
    d = tmp_path_factory.mktemp("chardata")
    (d / "play.txt").write_text(TEXT, encoding="utf-8")
    dataset.prepare(str(d / "play.txt"), out_dir=str(d), tokenizer="char")
    return str(d)


# ----------------------------------------------------------------------------------------------------------------
# the codec

def test_char_codec_round_trips_text_and_the_endoftext_separator():
    enc = CharCodec(sorted(set("hello world\n")) + [vocab.EOT_TEXT])
    assert enc.n_vocab == 10 and enc.eot_token == 9 and enc.itos[:3] == ["\n", " ", "d"]
    assert enc.decode(enc.encode_ordinary("hello\nworld")) == "hello\nworld"
    ids = enc.encode("he<|endoftext|>lo", allowed_special={vocab.EOT_TEXT})
    assert ids == [enc.stoi["h"], enc.stoi["e"], 9, enc.stoi["l"], enc.stoi["o"]]
    assert enc.decode(ids) == "he<|endoftext|>lo"
    with pytest.raises(DataError, match=r"character 'é' is not in this vocabulary of 9 characters"):
        enc.encode_ordinary("hé")
    with pytest.raises(DataError, match="'<'"):  # not allowed: the separator's text is just characters
        enc.encode("<|endoftext|>")


def test_prepare_in_characters_writes_itos_stoi_and_ids_that_decode_to_the_text(char_data):
    d = os.path.join(char_data, "play")
    meta = json.load(open(os.path.join(d, "meta.json")))
    chars = sorted(set(TEXT))
    assert meta["tokenizer"] == "char" and meta["itos"] == chars + ["<|endoftext|>"]
    assert meta["vocab_size"] == len(chars) + 1 == vocab.vocab_size(d) and meta["eot_token"] == len(chars)
    assert meta["stoi"] == {c: i for i, c in enumerate(meta["itos"])}
    enc = vocab.codec(d)
    train_ids, val_ids = (dataset.load_split(d, s).tolist() for s in ("train", "val"))
    # one document, split by characters: train's text, then val's, each closed by <|endoftext|>
    assert train_ids[-1] == val_ids[-1] == enc.eot_token
    assert enc.decode(train_ids[:-1] + val_ids[:-1]) == TEXT
    assert vocab.codec(os.path.join(char_data, "nowhere")).n_vocab == vocab.VOCAB_SIZE  # no meta: GPT-2's


def test_embedded_char_names_prepare_in_characters_and_streamed_sources_are_refused(tmp_path):
    assert "shakespeare_char" in corpora.EMBEDDED and "english_char" in corpora.EMBEDDED
    with pytest.raises(DataError, match="whole corpus"):
        dataset.prepare("hf:some/corpus", out_dir=str(tmp_path), tokenizer="char")
    with pytest.raises(DataError, match="unknown tokenizer 'bytes'"):
        dataset.prepare(str(tmp_path / "x.txt"), out_dir=str(tmp_path), tokenizer="bytes")


# ----------------------------------------------------------------------------------------------------------------
# copy_frac: repeated spans in training windows

def test_copies_repeat_a_span_of_the_window_at_a_distance_it_holds_and_touch_nothing_else():
    T1, L = 65, 8
    base = np.arange(1000 * T1).reshape(1000, T1)  # every token distinct: a copy is visible
    w = base.copy()
    made = longrange.insert_copies(w, list(range(1000)), 0.25, L, seed=7)
    assert 200 < len(made) < 300  # the share: 0.25 of 1,000 windows
    copied = {row for row, _, _ in made}
    assert all((w[r] == base[r]).all() for r in range(1000) if r not in copied)
    distances = []
    for row, a, b in made:
        assert L <= b - a <= T1 - L and 0 <= a and b + L <= T1
        want = base[row].copy()
        want[b:b + L] = base[row, a:a + L]
        assert (w[row] == want).all()
        distances.append(b - a)
    assert min(distances) < 16 and max(distances) > 48  # distances spread over the window
    again = base.copy()
    assert longrange.insert_copies(again, list(range(1000)), 0.25, L, seed=7) == made  # same (seed, offset): same copy
    assert (again == w).all()


def test_copy_frac_changes_training_windows_only_and_the_same_batch_twice(char_data, tmp_path):
    cfg = train.TrainConfig(**train.parse_args(["block_size=64", "copy_frac=1.0", "copy_span=16", "seed=3"]))
    data = type("D", (), dict(dir=os.path.join(char_data, "play"), sft=None, inode={"train": None, "val": None}))
    ix = torch.tensor([0, 100, 250])  # val holds 341 characters
    x1, y1 = train.get_batch(cfg, data, "train", ix, "cpu")
    x2, _ = train.get_batch(cfg, data, "train", ix, "cpu")
    tokens = dataset.load_split(data.dir, "train")
    plain = torch.from_numpy(np.stack([tokens[i:i + 64] for i in ix.tolist()]).astype(np.int64))
    assert torch.equal(x1, x2) and not torch.equal(x1, plain) and torch.equal(x1[:, 1:], y1[:, :-1])
    xv, _ = train.get_batch(cfg, data, "val", ix, "cpu")
    val = dataset.load_split(data.dir, "val")
    assert torch.equal(xv, torch.from_numpy(np.stack([val[i:i + 64] for i in ix.tolist()]).astype(np.int64)))
    msg = one_line_error(train.main, [*TINY, "copy_frac=0.5", "copy_span=40", f"out_dir={tmp_path}/r"])
    assert "2 x copy_span <= block_size=64" in msg


# ----------------------------------------------------------------------------------------------------------------
# train.py and sample.py read the dataset's vocabulary

def test_a_char_dataset_sizes_the_model_and_sample_decodes_characters(char_data, tmp_path, capsys):
    out = str(tmp_path / "run")
    train.main([*TINY, f"data_dir={char_data}", "dataset=play", f"out_dir={out}", "max_iters=4", "eval_interval=4",
                "copy_frac=0.5", "copy_span=8"])
    size = vocab.vocab_size(os.path.join(char_data, "play"))
    model, ckpt = load_checkpoint(os.path.join(out, "ckpt.pt"), "cpu")
    assert ckpt["model_args"]["vocab_size"] == size == model.lm_head.weight.shape[0]
    capsys.readouterr()
    sample.main(["--ckpt", os.path.join(out, "ckpt.pt"), "--start", "To be", "--num_samples", "1",
                 "--max_new_tokens", "20", "--temperature", "0"])
    text = capsys.readouterr().out.split("\n" + sample.SEP)[0]
    assert text.startswith("To be") and len(text) == 25 and set(text) <= set(TEXT)  # 20 new characters
    msg = one_line_error(train.main, [*TINY, f"data_dir={char_data}", "dataset=play", f"out_dir={tmp_path}/v",
                                      "vocab_size=50257"])
    assert f"does not match dataset='play', whose meta.json has {size}" in msg
    msg = one_line_error(sample.main, ["--ckpt", os.path.join(out, "ckpt.pt"), "--start", "é"])
    assert "'é' is not in this vocabulary" in msg


# ----------------------------------------------------------------------------------------------------------------
# the copy gate

class InductionOracle(torch.nn.Module):
    """Predicts the token that followed the last earlier occurrence of the current 3-token context (probability
    ~1), else uniform: on random tokens, a perfect copier from the copy's 3rd token on."""
    def __init__(self, vocab, n=3):
        super().__init__()
        self.vocab, self.n, self.lm_head = vocab, n, torch.nn.Linear(1, 1)

    def extend_rope(self, method, scale, L):
        pass

    config = type("C", (), dict(scorer="softmax", block_size=64))  # what rescale.apply reads
    transformer = type("T", (), dict(h=[]))

    def forward(self, x, y, reduction="none"):
        logits = torch.zeros(*x.shape, self.vocab)
        for r, row in enumerate(x.tolist()):
            for t in range(self.n - 1, len(row)):
                ctx = row[t - self.n + 1:t + 1]
                for s in range(t - 1, self.n - 2, -1):
                    if row[s - self.n + 1:s + 1] == ctx:
                        logits[r, t, row[s + 1]] = 50.0
                        break
        return logits, torch.nn.functional.cross_entropy(logits.transpose(1, 2), y, reduction=reduction)


def test_the_copy_gate_measures_the_second_copy_against_a_control_span_at_the_right_positions():
    V, L, N = 256, 12, 64  # 256**3 trigrams: no chance repeat in a sequence
    tokens = np.random.default_rng(0).integers(0, V, 20_000)
    args = type("A", (), dict(distances=[0.5, 2], span=L, num_seqs=6, seed=0, rope_method="none", rope_scale=1.0,
                              kind="text", batch_size=4, logit_scale=None, llama4_floor=8192))
    losses = eval_copy.evaluate(InductionOracle(V), tokens, N, args, ("none", 1.0))
    m = eval_copy.summarize("oracle", N, losses, args)
    uniform = math.log(V)
    first, second, control = (np.array(m["by_offset"][k]) for k in ("first", "second", "control"))
    assert np.allclose(first, uniform, atol=0.02) and np.allclose(control, uniform, atol=0.02)  # nothing to copy
    # offset 1 (and 2, unless the token before the copy repeats the one before the span: chance 1/V) still has text
    # from before the copy in its 3-token context; from offset 3 on, 3 copied tokens: copied exactly
    assert second[0] == pytest.approx(uniform, abs=0.02) and second[1] <= uniform + 0.02 and (second[2:] < 1e-6).all()
    want = (second[0] + second[1]) / ((L - 1) * control.mean())  # by hand: at most 2 of the L-1 tokens cost
    assert m["gate_ratio"] == pytest.approx(want, abs=1e-3) and 1 / (L - 1) - 0.01 < want <= 2 / (L - 1) + 0.01
    assert m["gate"] is bool(want <= longrange.GATE_RATIO)
    d, f2, s2, c2 = losses[2]  # beyond N: the same, for a model without positions
    assert d == 2 * N and m["by_distance"]["2"]["distance"] == 2 * N and (s2[:, 2:] < 1e-6).all()
    assert m["by_distance"]["2"]["ratio"] == pytest.approx(s2.mean() / c2.mean()) and s2.mean() / c2.mean() < 0.2
    assert longrange.gate([0.3, 0.6]) and not longrange.gate([0.6, 0.5])


def test_eval_copy_writes_its_results_for_a_char_model_and_refuses_a_model_of_other_tokens(char_data, tmp_path):
    out = str(tmp_path / "run")
    train.main([*TINY, f"data_dir={char_data}", "dataset=play", f"out_dir={out}", "max_iters=2", "eval_interval=2"])
    res = str(tmp_path / "copy")
    eval_copy.main([os.path.join(out, "ckpt.pt"), "--data", os.path.join(char_data, "play"), "--span", "8",
                    "--distances", "0.5", "2", "--num_seqs", "3", "--out_dir", res, "--labels", "tiny"])
    summary = json.load(open(os.path.join(res, "summary.json")))
    (m,) = summary["models"]
    assert m["label"] == "tiny" and set(m["by_distance"]) == {"0.5", "2"} and len(m["by_offset"]["second"]) == 7
    assert os.path.getsize(os.path.join(res, "copy.png")) > 0
    rows = open(os.path.join(res, "per_sequence.csv")).read().splitlines()
    assert rows[0] == ",".join(eval_copy.COLUMNS) and len(rows) == 1 + 2 * 3
    x, control, a, b = longrange.copy_sequences(np.arange(1000), 40, 8, 5, seed=0)
    assert (x[:, b:] == x[:, a:a + 8]).all() and (x[:, :b] == control[:, :b]).all()  # the control: other text at b
    assert (np.diff(control[:, b:], axis=1) == 1).all() and not (control[:, b:] == x[:, b:]).all(1).any()
    bpe = tmp_path / "bpe"  # a dataset of GPT-2's tokens: the char model cannot read it
    bpe.mkdir()
    np.zeros(4096, np.uint16).tofile(bpe / "val.bin")
    (bpe / "meta.json").write_text(json.dumps(dict(tokenizer="gpt2", vocab_size=vocab.VOCAB_SIZE)))
    msg = one_line_error(eval_copy.main, [os.path.join(out, "ckpt.pt"), "--data", str(bpe), "--out_dir",
                                          str(tmp_path / "c2")])
    assert "reads another vocabulary than" in msg and "24 characters" in msg and "gpt2 (50,257 ids)" in msg, msg
    missing = str(tmp_path / "no-such-data")  # was read as GPT-2's ids: "reads another vocabulary"
    msg = one_line_error(eval_copy.main, [os.path.join(out, "ckpt.pt"), "--data", missing, "--out_dir",
                                          str(tmp_path / "c2")])
    assert msg == f"error: --data {missing!r} does not exist: name a dataset folder prepare_data.py wrote", msg
    assert not os.path.exists(tmp_path / "c2" / "summary.json")


def test_eval_copy_rescales_only_softmax_and_refuses_another_scorer_in_one_line(char_data, tmp_path):
    out = str(tmp_path / "run")
    train.main([*TINY, f"data_dir={char_data}", "dataset=play", f"out_dir={out}", "max_iters=0", "scorer=ssmax"])
    msg = one_line_error(eval_copy.main, [os.path.join(out, "ckpt.pt"), "--data", os.path.join(char_data, "play"),
                                          "--span", "8", "--logit_scale", "qwen", "--out_dir", str(tmp_path / "c")])
    assert "--logit_scale qwen rescales softmax models; got one with scorer='ssmax'" in msg


def test_eval_copy_labels_each_distance_by_where_it_measured_and_refuses_a_span_past_the_gate(char_data, tmp_path):
    # k N below the span was measured at the span's length under k's label (0.125 N reported at 0.25 N's distance)
    out = str(tmp_path / "run")
    train.main([*TINY, f"data_dir={char_data}", "dataset=play", f"out_dir={out}", "max_iters=2", "eval_interval=2"])
    res, N = str(tmp_path / "copy"), 64  # TINY's block_size
    span = N // 4
    eval_copy.main([os.path.join(out, "ckpt.pt"), "--data", os.path.join(char_data, "play"), "--span", str(span),
                    "--distances", "0.125", "0.25", "0.5", "--num_seqs", "2", "--out_dir", res])
    (m,) = json.load(open(os.path.join(res, "summary.json")))["models"]
    assert {k: r["distance"] for k, r in m["by_distance"].items()} == {"0.25": N // 4, "0.5": N // 2}
    msg = one_line_error(eval_copy.main, [os.path.join(out, "ckpt.pt"), "--data", os.path.join(char_data, "play"),
                                          "--span", str(N), "--out_dir", str(tmp_path / "c2")])
    assert f"--span {N} is longer than the copy gate's distance 0.5 N" in msg


def test_random_copies_draw_the_span_and_its_control_from_the_sequence_as_it_was():
    tokens, (d, L, num, lead) = np.arange(100_000), (32, 16, 40, longrange.LEAD)
    x, control, a, b = longrange.copy_sequences(tokens, d, L, num, seed=0, kind="random")
    rng = np.random.default_rng([0, d])  # its draws, in its order
    starts, _ = (rng.integers(0, len(tokens) - k + 1, size=num) for k in (lead + d + L, L))
    was = starts[:, None] + np.arange(lead + d + L)  # the sequences before any span was written
    span, other = (np.take_along_axis(was, rng.integers(0, lead + d + L, (num, L)), 1) for _ in range(2))
    assert (x[:, a:a + L] == span).all() and (x[:, b:] == span).all()
    assert (control[:, b:] == other).all()  # it was drawn from the copied sequence: the span twice in it
