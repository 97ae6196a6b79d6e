"""lib/vocab.py's size rules, on hand-written meta.json files: a model of GPT-2's padded 50,304 ids reads a GPT-2
dataset (train.py's vocab_size=, an older checkpoint without a codec), a character model reads only its own
vocabulary's size; an older character checkpoint is never decoded with a dataset of another size; a meta.json
naming an unknown tokenizer, or malformed, is one line naming it."""
import json
import re

import pytest

import train
from lib import dataset, vocab
from lib.dataset import DataError


def write_meta(d, **meta):
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps(meta))
    return str(d)


def char_meta(d, chars):
    itos = list(chars) + [vocab.EOT_TEXT]
    return write_meta(d, tokenizer="char", vocab_size=len(itos), itos=itos, stoi={c: i for i, c in enumerate(itos)})


def with_vocab(data_root, size):
    explicit = train.parse_args([f"vocab_size={size}", f"data_dir={data_root}", "dataset=d"])
    return vocab.data_vocab(train.TrainConfig(**explicit), explicit, None, str(data_root / "d"))


def test_gpt2_data_takes_a_padded_model_and_character_data_only_its_own_size(tmp_path):
    write_meta(tmp_path / "gpt2" / "d", tokenizer="gpt2", vocab_size=vocab.VOCAB_SIZE, eot_token=vocab.EOT)
    assert with_vocab(tmp_path / "gpt2", 50304).vocab_size == 50304  # nanoGPT's padding to a multiple of 64
    with pytest.raises(DataError, match="vocab_size=50000 does not match"):
        with_vocab(tmp_path / "gpt2", 50000)
    char_meta(tmp_path / "char" / "d", "abc")
    assert with_vocab(tmp_path / "char", 4).vocab_size == 4
    with pytest.raises(DataError, match="vocab_size=8 does not match"):
        with_vocab(tmp_path / "char", 8)  # ids 4..7 would mean nothing: characters are never padded
    old = {"model_args": {"vocab_size": 50304}, "config": {}}  # written before checkpoints stored their codec
    assert vocab.language_model("old.pt", old, str(tmp_path / "gpt2" / "d")) is old


def test_an_older_character_checkpoint_is_not_decoded_with_a_dataset_of_another_size(tmp_path):
    d = char_meta(tmp_path / "d", "abcdefghijk")  # 12 ids
    old = lambda n: {"model_args": {"vocab_size": n}, "config": {}}  # no stored codec
    assert vocab.checkpoint_codec(old(12), d).itos[:3] == ["a", "b", "c"]  # same size: the data's, as before
    with pytest.raises(DataError, match="this model reads 10 tokens"):
        vocab.checkpoint_codec(old(10), d)


def test_a_meta_json_naming_an_unknown_tokenizer_is_refused_not_read_as_gpt2(tmp_path):
    write_meta(tmp_path / "d", tokenizer="foo", vocab_size=vocab.VOCAB_SIZE)
    says = r"meta.json names tokenizer 'foo', which this code does not read \(gpt2, char, hf\); re-prepare it with"
    with pytest.raises(DataError, match=says):
        vocab.data_record(str(tmp_path / "d"))  # the evaluations', needle's and sample's
    with pytest.raises(DataError, match=says):
        with_vocab(tmp_path, vocab.VOCAB_SIZE)  # train.py's


@pytest.mark.parametrize("meta, says", [
    ([1], "holds a JSON list, not an object"), ("gpt2", "holds a JSON str, not an object"),
    ({"tokenizer": "char"}, r"names tokenizer 'char' but holds no character list \(itos\)"),
    ({"dtype": "float9"}, "names dtype 'float9', not one of uint16, uint32"),
    ({"tokenizer": "hf"}, "names tokenizer 'hf' but holds no vocab_size or eot_token"),
    ({"tokenizer": "hf", "vocab_size": 8, "eot_token": 7}, "names tokenizer 'hf', but no tokenizer.json is beside it")])
def test_a_malformed_meta_json_is_one_line_naming_it_and_how_to_re_prepare(tmp_path, meta, says):
    # each was an AttributeError, KeyError, TypeError or FileNotFoundError traceback
    d = tmp_path / "d"
    d.mkdir()
    (d / "meta.json").write_text(json.dumps(meta))
    (d / "val.bin").write_bytes(bytes(8))
    for read in (vocab.data_record, vocab.vocab_size, lambda d: dataset.load_split(d, "val")):
        with pytest.raises(DataError, match=f"^{re.escape(str(d / 'meta.json'))} {says}; re-prepare it with `python "):
            read(str(d))
