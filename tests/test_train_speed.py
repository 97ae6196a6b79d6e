"""bench/train_speed.py reads a config file as train.py does: its base first, and its scorer's own options only for
its own scorer (lssar's re-weighting had made the softmax baseline a re-weighted softmax on another kernel)."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("train_speed", os.path.join(ROOT, "bench", "train_speed.py"))
train_speed = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train_speed)


def test_a_config_files_scorer_options_apply_to_its_own_scorer_only():
    path = os.path.join(ROOT, "configs", "lssar.py")
    own, _ = train_speed.model_config(path, "lssar")
    assert own.scorer == "lssar" and own.p == 15.0
    for other in ("softmax", "sigmoid"):  # sigmoid with p = 15 was refused: its rows need not sum to 1
        cfg, _ = train_speed.model_config(path, other)
        assert cfg.scorer == other and cfg.reweight_p is None and cfg.p is None


def test_a_config_files_base_is_read_first(tmp_path):
    (tmp_path / "tiny.py").write_text("n_layer = 1\nn_embd = 32\nn_head = 2\nblock_size = 32\nbatch_size = 2\n")
    (tmp_path / "child.py").write_text('base = "tiny.py"\nscorer = "ssmax"\n')
    cfg, assigned = train_speed.model_config(str(tmp_path / "child.py"), "ssmax")
    assert (cfg.n_layer, cfg.n_embd, cfg.block_size, assigned["batch_size"]) == (1, 32, 32, 2)  # was the 162M model


def test_tokens_per_s_is_at_the_configs_accumulation_one_update_per_g_micro_batches(tmp_path):
    (tmp_path / "tiny.py").write_text("n_layer = 1\nn_embd = 32\nn_head = 2\nblock_size = 16\nbatch_size = 2\n"
                                      "vocab_size = 64\ngradient_accumulation_steps = 4\n")
    for accum, g in ((None, 4), (2, 2)):  # the config's g, or --accum's
        (_, r), = train_speed.measure(str(tmp_path / "tiny.py"), ["softmax"], 2, 1, None, "cpu", accum=accum)
        assert r["accum"] == g and r["update_ms"] > 0
        step_ms = g * r["ms"] + r["update_ms"]  # g micro-batches, 1 update
        assert r["tokens_per_s"] == pytest.approx(g * 2 * 16 / step_ms * 1e3)
