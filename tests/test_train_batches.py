"""train.py's language-model batches: a window's inputs are its split's own tokens and its targets the same tokens
one later, the starts range over every whole window of a split (a split of block_size + 1 tokens is one window),
training draws them over train's range and evaluation over each split's own. Tiny files, no model."""
import contextlib
import types

import numpy as np
import pytest
import torch

import train

T = 8


@pytest.fixture
def data(tmp_path):
    """train.bin: ids 0..49, val.bin: ids 1000..1019 (GPT-2's uint16 without meta.json): every window tells where
    it came from, and no window of one split equals one of the other."""
    d = tmp_path / "data" / "ids"
    d.mkdir(parents=True)
    np.arange(0, 50, dtype=np.uint16).tofile(d / "train.bin")
    np.arange(1000, 1020, dtype=np.uint16).tofile(d / "val.bin")
    return d


def test_inputs_are_the_splits_tokens_and_targets_the_same_shifted_by_one_up_to_the_last_start(data):
    cfg = types.SimpleNamespace(block_size=T, task=None, sft_data=None, copy_frac=0.0)
    batch = types.SimpleNamespace(dir=str(data), inode={"train": None, "val": None})
    for split, first, n in (("train", 0, 50), ("val", 1000, 20)):
        ix = torch.tensor([0, 3, n - T - 1])  # n - T - 1: the last start whose target window is whole
        x, y = train.get_batch(cfg, batch, split, ix, "cpu")
        assert x.dtype == y.dtype == torch.long and x.shape == y.shape == (3, T)
        for row, i in enumerate(ix.tolist()):
            assert x[row].tolist() == list(range(first + i, first + i + T))
            assert y[row].tolist() == list(range(first + i + 1, first + i + T + 1))


def test_a_split_of_block_size_plus_one_tokens_holds_exactly_one_window(data):
    np.arange(1000, 1000 + T + 1, dtype=np.uint16).tofile(data / "val.bin")
    explicit = train.parse_args(["device=cpu", "vocab_size=2048", f"block_size={T}", f"data_dir={data.parent}",
                                 "dataset=ids"])
    run = types.SimpleNamespace(master=True, ddp=False, resuming=False, source="scratch")
    _, loaded = train.load_data(train.TrainConfig(**explicit), run, explicit, None)
    assert loaded.size == {"train": 50 - T, "val": 1}  # starts 0 .. len - T - 1: every whole window, no more


def test_training_starts_cover_trains_whole_range_not_vals():
    cfg = types.SimpleNamespace(sft_data=None)
    data = types.SimpleNamespace(size={"train": 100, "val": 5}, g=torch.Generator().manual_seed(0))
    ix = train.next_indices(cfg, data, 0, 2000)
    assert ix.min() == 0 and ix.max() == 99  # seeded: 2,000 draws reach both ends of [0, 100)


def test_eval_batches_of_each_split_are_drawn_over_that_splits_own_range(monkeypatch):
    seen = {"train": [], "val": []}
    monkeypatch.setattr(train, "get_batch", lambda cfg, data, split, ix, device: (ix, split))
    monkeypatch.setattr(train, "batch_loss", lambda cfg, ctx, model, ix, split: seen[split].extend(ix.tolist())
                        or torch.tensor(0.0))
    cfg = types.SimpleNamespace(eval_iters=20, batch_size=4, seed=0)
    data = types.SimpleNamespace(size={"train": 1000, "val": 10})
    run = types.SimpleNamespace(ctx=contextlib.nullcontext(), device="cpu")
    train.estimate_loss(cfg, data, run, torch.nn.Linear(1, 1))
    assert max(seen["val"]) < 10 and max(seen["train"]) >= 10  # train's eval reaches past val's 10 starts
