"""lib/dataset.py's readers on tiny hand-written splits: check_ids refuses an id equal to the vocabulary's size, at
any position of its chunks; draw_starts ranges over every whole window and none past the split; the unigram entropy
is train's, in nats."""
import math

import numpy as np
import pytest

from lib import dataset
from lib.dataset import DataError


def write_split(d, split, ids):
    d.mkdir(parents=True, exist_ok=True)
    np.asarray(ids, dtype=np.uint16).tofile(d / f"{split}.bin")  # no meta.json: GPT-2's uint16, as nanoGPT's
    return str(d)


def test_check_ids_refuses_an_id_equal_to_the_vocabulary_size_at_a_chunks_last_token(tmp_path):
    d = write_split(tmp_path / "ids", "train", [9] * 12)
    dataset.check_ids(d, "train", 10, chunk=4)  # 9: the largest id a vocabulary of 10 holds
    for at in (3, 7, 11):  # the last token of each chunk of 4
        ids = np.full(12, 9)
        ids[at] = 10
        write_split(tmp_path / "ids", "train", ids)
        with pytest.raises(DataError, match=f"holds id 10 at token {at}, not below the model's vocabulary of 10"):
            dataset.check_ids(d, "train", 10, chunk=4)


def test_drawn_starts_reach_the_last_whole_window_and_never_pass_it():
    n_tokens, L = 20, 9  # windows of L + 1 = 10 tokens: starts 0 .. 10
    starts = dataset.draw_starts(n_tokens, L, 2000, seed=0)
    assert starts.min() == 0 and starts.max() == n_tokens - L - 1


def test_unigram_entropy_is_trains_in_nats(tmp_path):
    d = write_split(tmp_path / "ids", "train", [0, 0, 1, 1, 2, 2, 2, 2])
    write_split(tmp_path / "ids", "val", [5] * 8)  # entropy 0: never read
    p = np.array([0.25, 0.25, 0.5])
    assert dataset.unigram_entropy(d) == pytest.approx(-(p * np.log(p)).sum()) == pytest.approx(1.5 * math.log(2))
