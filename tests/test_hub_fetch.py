"""The hub dataset (fineweb_edu) fetched on first use: offline, one error line naming dataset=english; local files
standing in for the hub are fetched to the budget and kept; a killed fetch leaves nothing that looks whole and the
next fetch completes. CPU only, never the hub."""
import json
import os

import pytest

import train
from lib import dataset
from test_configs import REPO


def test_offline_first_use_of_the_hub_dataset_is_one_error_line_naming_dataset_english(tmp_path):
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # conftest.py: the hub is never reached
    with pytest.raises(SystemExit) as e:
        train.main([os.path.join(REPO, "configs", "ssmax.py"), "allow_slow=True", f"data_dir={tmp_path / 'data'}",
                    f"out_dir={tmp_path / 'out'}"])
    msg = str(e.value.code)
    assert msg.startswith("error: cannot load 'hf:HuggingFaceFW/fineweb-edu:sample-10BT'") and "\n" not in msg
    assert msg.endswith("dataset=english")
    with pytest.raises(dataset.DataError):  # nothing that looks like a dataset
        dataset.check_prepared(str(tmp_path / "data" / "fineweb_edu"))


@pytest.fixture
def local_hub(tmp_path, monkeypatch):
    """fineweb_edu's source: 500 local jsonl documents of ~50 tokens (id before text, as FineWeb-Edu), 20,000 budget."""
    os.makedirs(tmp_path / "hub")
    with open(tmp_path / "hub" / "part-0.jsonl", "w") as f:
        for i in range(500):
            f.write(json.dumps({"id": f"doc{i}", "text": f"Document {i} says something about attention. " * 6}) + "\n")
    monkeypatch.setitem(dataset.NAMED, "fineweb_edu", (str(tmp_path / "hub" / "*.jsonl"), 20_000))
    return str(tmp_path / "data")


def test_first_use_fetches_the_named_dataset_to_its_budget_then_keeps_it(local_hub, capsys):
    dataset.fetch("fineweb_edu", local_hub)
    data_dir = os.path.join(local_hub, "fineweb_edu")
    dataset.check_prepared(data_dir)
    meta = json.load(open(os.path.join(data_dir, "meta.json")))
    assert meta["text_field"] == "text" and meta["args"]["max_tokens"] == 20_000
    assert 0 < meta["tokens"]["val"] and sum(meta["tokens"].values()) == 20_000  # the budget, exactly
    assert "first use" in capsys.readouterr().out
    mtime = os.stat(os.path.join(data_dir, "train.bin")).st_mtime_ns
    dataset.fetch("fineweb_edu", local_hub)  # whole: kept, not streamed again
    assert os.stat(os.path.join(data_dir, "train.bin")).st_mtime_ns == mtime and capsys.readouterr().out == ""
    os.remove(os.path.join(data_dir, "meta.json"))  # as a kill between the .bin renames and meta.json leaves it
    dataset.fetch("fineweb_edu", local_hub)
    dataset.check_prepared(data_dir)


def test_a_killed_fetch_leaves_nothing_that_looks_whole_and_the_next_fetch_completes(local_hub, monkeypatch):
    stream = dataset.stream_docs
    def killed(*args):  # Ctrl-C after 270 documents (~13k tokens): past the first batch of 256, before the budget
        docs, field = stream(*args)
        def gen():
            for i, doc in enumerate(docs):
                if i == 270:
                    raise KeyboardInterrupt
                yield doc
        return gen(), field
    monkeypatch.setattr(dataset, "stream_docs", killed)
    with pytest.raises(KeyboardInterrupt):
        dataset.fetch("fineweb_edu", local_hub)
    data_dir = os.path.join(local_hub, "fineweb_edu")
    assert not {"train.bin", "val.bin", "meta.json", "train.bin.tmp"} & set(os.listdir(data_dir))  # Ctrl-C: no .tmp
    with pytest.raises(dataset.DataError):
        dataset.check_prepared(data_dir)
    monkeypatch.setattr(dataset, "stream_docs", stream)
    dataset.fetch("fineweb_edu", local_hub)
    dataset.check_prepared(data_dir)
    assert not any(f.endswith(".tmp") for f in os.listdir(data_dir))
