"""The copy gate's arithmetic, without training: lib/longrange.py's draws (every distance and start a window holds,
a copy in exactly 2 x span tokens, random spans and text controls from their recorded draws, the seed), its config
check and gate (a mean at exactly the ratio passes); eval_copy.py reading each span at its offsets with RoPE and the
logit scale set for the sequence's length, a distance measured once, the gate's distance always added,
per_sequence.csv beside summary.json, and its out-of-range numbers. Tiny untrained models, CPU only."""
import json
import types
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch

import eval_copy
import test_eval_long
from conftest import PREPARED_AGAIN, one_line_error, trained_on_copy, warnings_of
from lib import compare, longrange, report, rescale
from lib.checkpoint import run_info, save_checkpoint
from model import GPT
from test_eval_long import tiny_config
from test_tracking_numbers import drawn

data_dir = test_eval_long.data_dir  # its fixture: real Shakespeare in GPT-2's tokens
N = 64  # the block_size eval_copy's model is given


# ----------------------------------------------------------------------------------------------------------------
# lib/longrange.py

def test_place_draws_every_distance_and_every_start_the_window_holds():
    T1, L = 20, 6
    rng, starts = np.random.default_rng(0), {}
    for _ in range(3000):
        a, b = longrange.place(rng, T1, L)
        starts.setdefault(b - a, set()).add(a)
    assert set(starts) == set(range(L, T1 - L + 1))  # d uniform in [L, T1 - L], both ends included
    assert all(starts[d] == set(range(T1 - L - d + 1)) for d in starts)  # a in [0, T1 - L - d]: the copy ends by T1


def test_a_copy_fits_a_window_of_exactly_two_spans_and_not_one_token_less():
    L = 8
    w = np.arange(5 * 2 * L).reshape(5, 2 * L)
    made = longrange.insert_copies(w, range(5), 1.0, L, seed=0)
    assert [(a, b) for _, a, b in made] == [(0, L)] * 5 and (w[:, L:] == w[:, :L]).all()
    with pytest.raises(ValueError, match=f"a span of {L} tokens and its copy do not fit in a window of {2 * L - 1}"):
        longrange.insert_copies(np.zeros((1, 2 * L - 1), np.int64), [0], 1.0, L, seed=0)


def test_random_copies_are_the_windows_draws_and_the_seed_changes_them():
    T1, L, frac, seed = 65, 8, 0.5, 3
    base = np.arange(200 * T1).reshape(200, T1)
    w = base.copy()
    made = longrange.insert_copies(w, range(200), frac, L, seed, kind="random")
    want = base.copy()
    for row in range(200):  # the draws of train.py's window (seed, offset), in their order
        rng = longrange.window_rng(seed, row)
        if rng.random() < frac:
            a, b = longrange.place(rng, T1, L)
            want[row, a:a + L] = want[row, b:b + L] = base[row, rng.integers(0, T1, L)]
    assert 60 < len(made) < 140 and (w == want).all()
    assert longrange.insert_copies(base.copy(), range(200), frac, L, seed + 1, kind="random") != made


def test_text_controls_are_the_drawn_text_and_a_split_of_exactly_one_sequence_is_enough():
    tokens, (d, L, num, lead) = np.arange(100_000), (32, 16, 40, longrange.LEAD)
    x, control, a, b = longrange.copy_sequences(tokens, d, L, num, seed=0)
    rng = np.random.default_rng([0, d])
    starts, others = (rng.integers(0, len(tokens) - k + 1, size=num) for k in (lead + d + L, L))
    assert (x[:, :b] == starts[:, None] + np.arange(b)).all() and (x[:, b:] == x[:, a:a + L]).all()
    assert (control[:, b:] == others[:, None] + np.arange(L)).all()
    x, _, _, _ = longrange.copy_sequences(np.arange(lead + d + L), d, L, 2, seed=0)  # the one place it fits
    assert (x[:, :b] == np.arange(b)).all()



def test_random_spans_and_their_controls_are_drawn_from_the_sequence_as_it_was_never_from_the_copy():
    tokens, (d, L, num, lead) = np.arange(100_000), (32, 16, 40, longrange.LEAD)
    x, control, a, b = longrange.copy_sequences(tokens, d, L, num, seed=0, kind="random")
    n = lead + d + L
    rng = np.random.default_rng([0, d])
    starts, _ = (rng.integers(0, len(tokens) - k + 1, size=num) for k in (n, L))
    window = starts[:, None] + np.arange(n)  # every token distinct: a drawn token tells where it was drawn from
    span, other = (np.take_along_axis(window, rng.integers(0, n, (num, L)), 1) for _ in range(2))
    assert (x[:, a:a + L] == span).all() and (x[:, b:] == span).all()
    # the control's draws at the span's or the copy's place read the text there, not the random span written over it
    assert (control[:, :b] == x[:, :b]).all() and (control[:, b:] == other).all()
def test_check_config_allows_two_spans_in_the_block_and_refuses_a_task_or_an_unknown_kind():
    cfg = dict(copy_kind="text", copy_frac=0.5, copy_span=32, block_size=64, task=None, sft_data=None)
    longrange.check_config(types.SimpleNamespace(**cfg))  # 2 x 32 = 64 tokens: both copies fit
    for change, message in ((dict(copy_span=33), "2 x copy_span <= block_size=64"), (dict(task="recall"), "no task"),
                            (dict(copy_kind="bytes"), "copy_kind='bytes' is not one of text, random")):
        with pytest.raises(ValueError, match=message):
            longrange.check_config(types.SimpleNamespace(**{**cfg, **change}))


def test_the_gate_passes_a_mean_at_exactly_the_ratio_and_reads_the_mean_not_the_median():
    assert longrange.gate([longrange.GATE_RATIO]) and longrange.gate([0.1, 0.6, 0.6])  # mean 0.43, median 0.6
    assert not longrange.gate([0.4, 0.4, 1.0])  # mean 0.6, median 0.4
    s, c = np.full((3, 5), longrange.GATE_RATIO), np.ones((3, 5))
    m = eval_copy.summarize("m", N, {longrange.GATE_DISTANCE: (N // 2, 2 * c, s, c)}, None)  # second / control
    assert m["gate_ratio"] == m["by_distance"]["0.5"]["ratio"] == longrange.GATE_RATIO and m["gate"] is True


# ----------------------------------------------------------------------------------------------------------------
# eval_copy.py

class Recorder(torch.nn.Module):
    """Records the lengths RoPE is set for; its losses (token_losses, patched) are the column's index."""
    def __init__(self):
        super().__init__()
        self.lengths = []

    def extend_rope(self, method, scale, L):
        self.lengths.append(L)


def test_evaluate_reads_each_span_at_its_offsets_for_its_length_and_a_distance_once(monkeypatch):
    calls, scaled = [], []
    def fake_losses(model, x, batch_size, bar=None):  # column t = t; the control's (every second call) t + 0.5
        calls.append(x)
        return np.tile(np.arange(x.shape[1] - 1, dtype=float), (len(x), 1)) + 0.5 * (len(calls) % 2 == 0)
    monkeypatch.setattr(eval_copy, "token_losses", fake_losses)
    monkeypatch.setattr(rescale, "apply", lambda model, kind, L, floor=None: scaled.append((kind, L, floor)))
    L, lead, model = 6, longrange.LEAD, Recorder()
    args = types.SimpleNamespace(distances=[0.5, 0.501, 2], span=L, num_seqs=2, seed=0, kind="text",
                                 rope_method="none", rope_scale=1.0, batch_size=2, logit_scale="qwen", llama4_floor=9)
    losses = eval_copy.evaluate(model, np.arange(10_000), N, args, ("none", 1.0))
    assert list(losses) == [0.5, 2]  # 0.501 N rounds to 0.5 N's distance: measured once
    for k, (d, first, second, control) in losses.items():
        b = lead + d
        assert d == round(k * N) and (first == np.arange(lead, lead + L - 1)).all()  # the span's tokens 1..L-1
        assert (second == np.arange(b, b + L - 1)).all() and (control == np.arange(b, b + L - 1) + 0.5).all()
    m = eval_copy.summarize("m", N, losses, args)  # the gate's distance by offset: means over the sequences
    b = lead + N // 2
    assert m["by_offset"] == dict(first=list(range(lead, lead + L - 1)), second=list(range(b, b + L - 1)),
                                  control=[t + 0.5 for t in range(b, b + L - 1)])
    lengths = [lead + d + L - 1 for d in (N // 2, 2 * N)]  # the inputs: every token but the last
    assert model.lengths == lengths and scaled == [("qwen", n, 9) for n in lengths]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.manual_seed(0)
    model = GPT(tiny_config(block_size=N))
    path = tmp_path_factory.mktemp("copy") / "ckpt.pt"
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": {}, "iter_num": 3,
                     "run_info": run_info(0)}, str(path))
    return path


def test_eval_copy_adds_the_gates_distance_and_writes_per_sequence_means_of_the_summarys(ckpt, data_dir, tmp_path,
                                                                                       monkeypatch):
    monkeypatch.chdir(ckpt.parent)  # a relative path: every row names the file whatever the folder
    monkeypatch.setattr(eval_copy.figures, "copy_gate", lambda *a: None)  # numbers only: test_longrange draws copy.png
    span = (N - longrange.LEAD) // 2  # two copies and the lead fill the training length exactly
    eval_copy.main(["ckpt.pt", "--data", data_dir, "--span", str(span), "--distances", "1", "--num_seqs", "2",
                    "--out_dir", str(tmp_path / "res")])
    (m,) = json.loads((tmp_path / "res" / "summary.json").read_text())["models"]
    assert list(m["by_distance"]) == ["0.5", "1"] and m["checkpoint"] == str(ckpt)
    rows = compare.read_csv(tmp_path / "res" / "per_sequence.csv")
    assert {r["checkpoint"] for r in rows} == {str(ckpt)} and len(rows) == 2 * 2
    for k, want in m["by_distance"].items():
        mine = [r for r in rows if float(r["distance_x"]) == float(k)]
        for col in ("first", "second", "control"):  # each row a sequence's mean over the same L-1 tokens
            assert np.mean([float(r[col]) for r in mine]) == pytest.approx(want[col], abs=1e-9)


def test_eval_copy_records_rope_none_for_a_nope_model_and_titles_it_nope(ckpt, data_dir, tmp_path, monkeypatch):
    torch.manual_seed(0)  # a NoPE model with the RoPE one: theta x8 reaches the RoPE model only
    nope = GPT(replace(tiny_config(block_size=N), pos="nope"))
    save_checkpoint({"model": nope.state_dict(), "model_args": asdict(nope.config), "config": {}, "iter_num": 3,
                     "run_info": run_info(0)}, str(tmp_path / "nope.pt"))
    made = drawn(monkeypatch)
    span = str((N - longrange.LEAD) // 2)
    eval_copy.main([str(ckpt), str(tmp_path / "nope.pt"), "--labels", "r", "n", "--data", data_dir, "--span", span,
                    "--num_seqs", "1", "--rope_method", "theta", "--rope_scale", "8", "--out_dir", str(tmp_path / "a")])
    models = json.loads((tmp_path / "a" / "summary.json").read_text())["models"]
    assert [(m["pos"], m["rope_method"], m["rope_scale"]) for m in models] == [("rope", "theta", 8),
                                                                                  ("nope", "none", 1)]
    assert made[0].get_suptitle().endswith("tokens, RoPE theta x8, NoPE: n")
    eval_copy.main([str(tmp_path / "nope.pt"), "--data", data_dir, "--span", span, "--num_seqs", "1",
                    "--rope_method", "theta", "--rope_scale", "8", "--out_dir", str(tmp_path / "b")])
    assert "RoPE" not in made[1].get_suptitle() and "NoPE: softmax #1" in made[1].get_suptitle()


def test_eval_copy_records_each_models_logit_scale_and_keeps_the_label_the_lm_report_pairs_by(ckpt, data_dir, tmp_path,
                                                                                             monkeypatch):
    monkeypatch.setattr(eval_copy.figures, "copy_gate", lambda *a: None)  # the record only
    summaries = []
    for how in ([], ["--logit_scale", "qwen"]):  # reproduce.py's copy and copy_qwen folders
        out = tmp_path / f"res{len(how)}"
        eval_copy.main([str(ckpt), "--labels", "softmax", "--data", data_dir, "--span", str((N - longrange.LEAD) // 2),
                        "--distances", "0.5", "--num_seqs", "1", "--out_dir", str(out), *how])
        summaries.append(json.loads((out / "summary.json").read_text()))
    native, qwen = (s["models"][0] for s in summaries)
    # only args said it: a model's record read as unrescaled
    assert (native["label"], native["logit_scale"], qwen["label"], qwen["logit_scale"]) == (
        "softmax", None, "softmax", "qwen")
    base = report.copy_gate(summaries[:1])["softmax"]["ratio_per_seed"]
    assert "minus_softmax" in report.copy_gate(summaries[1:], base)["softmax"]  # paired with the native by label


def test_eval_copy_says_and_records_the_distances_it_skips_and_names_a_huge_one_in_g(ckpt, data_dir, tmp_path,
                                                                                         capsys):
    span = (N - longrange.LEAD) // 2  # 24: 0.25 N = 16 tokens overlaps; 0.501 N rounds to 0.5 N's 32
    eval_copy.main([str(ckpt), "--data", data_dir, "--span", str(span), "--distances", "0.25", "0.501", "--num_seqs",
                    "1", "--out_dir", str(tmp_path / "res")])
    (m,) = json.loads((tmp_path / "res" / "summary.json").read_text())["models"]
    assert list(m["by_distance"]) == ["0.5"] and m["skipped"] == [
        dict(distance_x=0.25, distance=16, why="d = 16 < --span 24: the copies would overlap"),
        dict(distance_x=0.501, distance=32, why="d = 32, measured at 0.5 N")]
    assert "note: softmax #1: skipped 0.25 N (d = 16 < --span 24: the copies would overlap), 0.501 N" in (
        capsys.readouterr().out)
    msg = one_line_error(eval_copy.main, [str(ckpt), "--data", data_dir, "--span", str(span), "--distances", "1e300",
                                          "--out_dir", str(tmp_path / "huge")])
    assert "--distances 1e+300: d = 6.4e+301 tokens" in msg and len(msg) < 200  # not a 300-digit number


def test_a_rope_scale_given_with_rope_method_none_is_refused_and_the_default_is_not(tmp_path):
    msg = one_line_error(eval_copy.main, ["ckpt.pt", "--rope_scale", "4"])  # it was recorded, never applied
    assert "--rope_scale 4 is not read: --rope_method none keeps the trained θ" in msg
    assert "not read" not in one_line_error(eval_copy.main, [str(tmp_path / "missing.pt"), "--out_dir", str(tmp_path)])


@pytest.mark.parametrize("flag,value", [("--span", "1"), ("--distances", "0"), ("--rope_scale", "inf")])
def test_out_of_range_numbers_are_one_error_line(flag, value):
    v = int(value) if flag == "--span" else float(value)
    assert f"{flag} {v:g}" in one_line_error(eval_copy.main, ["ckpt.pt", flag, value])  # before any file is read


def test_eval_copy_warns_and_records_a_dataset_prepared_again_since_the_checkpoint_trained(ckpt, data_dir, tmp_path,
                                                                                          monkeypatch, capsys):
    monkeypatch.setattr(eval_copy.figures, "copy_gate", lambda *a: None)  # the record only
    folder, path = trained_on_copy(data_dir, tmp_path, ckpt, sha256=PREPARED_AGAIN)
    eval_copy.main([path, "--data", folder, "--span", str((N - longrange.LEAD) // 2), "--distances", "0.5",
                    "--num_seqs", "2", "--out_dir", str(tmp_path / "res")])
    (line,) = warnings_of(capsys.readouterr().err)
    assert path in line and folder in line and "val documents may have been trained on" in line
    (m,) = json.loads((tmp_path / "res" / "summary.json").read_text())["models"]
    assert m["data_prepared_again"] is True and m["data_sha256"] == PREPARED_AGAIN != m["trained_sha256"]
