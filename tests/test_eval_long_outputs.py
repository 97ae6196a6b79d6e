"""eval_long.py's outputs checked against their inputs, on untrained tiny models: differences.csv resampled with the
run's --seed and --n_boot, per_sequence.csv's start and rope_scale of each row, summary.json's overlapping pairs, its
smoothing and each model's training run; a length that is no window's end under Dynamic NTK per length; the default
length from the first checkpoint and the length check against the longest N; a logit rescaling for each pass's
length; the window rule naming the passes that ran; the warning and record of a dataset prepared again since the
checkpoint trained on it; a val.bin cut short of meta.json, one line naming it. CPU only."""
import json
import os
import shutil
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch

import eval_long
import test_eval_long
from lib import compare, dataset, figures, rescale
from lib.checkpoint import load_checkpoint, run_info, save_checkpoint
from model import GPT
from conftest import PREPARED_AGAIN, trained_on_copy, warnings_of
from test_eval_long import N, one_line_error, read_csv, tiny_config

data_dir = test_eval_long.data_dir  # its fixture: real Shakespeare, written directly
TRAIN_SEED = 11  # the training run's seed, told apart from the evaluation's


def save(tmp_path_factory, name, block_size=N, sharp=False):
    torch.manual_seed(0)
    model = GPT(tiny_config(block_size=block_size))
    if sharp:  # attention that uses positions: the RoPE and the logit scale move its loss
        with torch.no_grad():
            for block in model.transformer.h:
                block.attn.c_attn.weight[:2 * model.config.n_embd] *= 16
                block.attn.c_proj.weight *= 16
            model.lm_head.weight *= 8
    path = str(tmp_path_factory.mktemp(name) / "ckpt.pt")
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": {}, "iter_num": 7,
                     "best_val_loss": float("nan"), "run_info": run_info(TRAIN_SEED)}, path)
    return path


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return {name: save(tmp_path_factory, name, **kw) for name, kw in (("plain", {}), ("sharp", dict(sharp=True)),
                                                                      ("short", dict(block_size=N // 2)))}


def test_differences_resample_with_the_runs_seed_and_n_boot_and_rows_name_their_start_and_scale(
        ckpts, data_dir, tmp_path):
    out = tmp_path / "res"
    eval_long.main([ckpts["plain"], ckpts["sharp"], "--labels", "a", "b", "--data", data_dir, "--length", str(2 * N),
                    "--rope_scale", "4", "--num_seqs", "5", "--n_boot", "30", "--seed", "7", "--out_dir", str(out)])
    rows = compare.read_csv(out / "per_sequence.csv")
    summary = json.loads((out / "summary.json").read_text())
    starts = summary["sequences"]["starts"]
    assert starts == dataset.draw_starts(len(np.fromfile(f"{data_dir}/val.bin", np.uint16)), 2 * N, 5, 7).tolist()
    assert all(int(r["start"]) == starts[int(r["sequence"])] for r in rows)
    assert {(r["rope"], float(r["rope_scale"])) for r in rows} == {("extended", 4.0), ("native", 1.0)}
    want = compare.paired_differences(rows, "a", 30, 7)  # the CSV's rows, resampled as the run was asked to
    got = compare.read_csv(out / "differences.csv")
    assert len(got) == len(want) == len(summary["differences"]) == 2 * 4  # RoPE settings x windows
    for g, s, w in zip(got, summary["differences"], want):
        assert (g["rope"], g["window"]) == (s["rope"], s["window"]) == (w["rope"], w["window"])
        for k in ("mean_diff", "ci_lo", "ci_hi"):
            assert float(g[k]) == pytest.approx(w[k], abs=1e-12) and s[k] == pytest.approx(w[k], abs=1e-12)
    for m in summary["models"]:  # each model's training run beside the evaluation's
        assert m["iter_num"] == 7 and m["train_run_info"]["seed"] == TRAIN_SEED and m["model_args"]["block_size"] == N
    assert summary["run_info"]["seed"] == 7


def test_overlapping_pairs_count_windows_that_share_their_last_token(ckpts, data_dir, tmp_path, monkeypatch):
    L = N  # windows of L+1 tokens at 0 and L share token L; the one at 3L shares none
    monkeypatch.setattr(dataset, "draw_starts", lambda *a, **k: np.array([0, L, 3 * L]))
    eval_long.main([ckpts["plain"], "--data", data_dir, "--rope_method", "none", "--length", str(L), "--num_seqs",
                    "3", "--out_dir", str(tmp_path / "res")])
    seqs = json.loads((tmp_path / "res" / "summary.json").read_text())["sequences"]
    assert seqs["starts"] == [0, L, 3 * L] and seqs["overlapping_pairs"] == 1


def test_dynamic_ntk_per_length_writes_the_curve_to_a_length_that_ends_no_window(ckpts, data_dir, tmp_path):
    L = 20 * N + 5  # windows end at 1, 2, 4, 8, 10, 16 and 20 N: the last 5 positions in none but the curve
    eval_long.main([ckpts["plain"], "--data", data_dir, "--rope_method", "dynamic_ntk", "--rope_scale", "4",
                    "--length", str(L), "--num_seqs", "1", "--out_dir", str(tmp_path / "res")])
    header, table = read_csv(tmp_path / "res" / "per_position.csv")
    assert table.shape == (L, 3) and (table[:, 0] == np.arange(1, L + 1)).all() and np.isfinite(table).all()
    summary = json.loads((tmp_path / "res" / "summary.json").read_text())
    (m,) = summary["models"]
    assert m["mean_loss"] == pytest.approx(table[:, 1].mean()) and m["native"]["mean_loss"] == pytest.approx(
        table[:, 2].mean())
    assert summary["smoothing"] == f"moving average over {L // 200} positions (plot only)"  # L / 200: 2


def test_the_first_checkpoint_sets_the_default_length_and_the_longest_n_the_shortest_allowed(ckpts, data_dir,
                                                                                            tmp_path, monkeypatch):
    common = ["--data", data_dir, "--rope_method", "none", "--num_seqs", "1"]
    eval_long.main([ckpts["short"], ckpts["plain"], *common, "--out_dir", str(tmp_path / "res")])
    summary = json.loads((tmp_path / "res" / "summary.json").read_text())
    assert summary["args"]["length"] == 10 * N // 2 and [m["train_len"] for m in summary["models"]] == [N // 2, N]
    monkeypatch.setattr(eval_long, "per_position_loss", test_eval_long.no_model_runs)
    msg = one_line_error([ckpts["short"], ckpts["plain"], *common, "--length", str(N - 1), "--out_dir",
                          str(tmp_path / "res2")])
    assert f"--length {N - 1} is shorter than the training length {N} of {ckpts['plain']!r}" in msg


def test_a_logit_rescaling_follows_each_passs_length_under_dynamic_ntk_per_length(ckpts, data_dir, tmp_path):
    """Window k runs at kN tokens: its RoPE factor and YaRN's logit factor both for kN (1 at N), not for L."""
    eval_long.main([ckpts["sharp"], "--data", data_dir, "--rope_method", "dynamic_ntk", "--rope_scale", "4",
                    "--logit_scale", "yarn", "--length", str(4 * N), "--num_seqs", "2", "--out_dir",
                    str(tmp_path / "res")])
    summary = json.loads((tmp_path / "res" / "summary.json").read_text())
    windows, starts = summary["models"][0]["windows"], summary["sequences"]["starts"]
    val = np.fromfile(f"{data_dir}/val.bin", np.uint16).astype(np.int64)
    model, _ = load_checkpoint(ckpts["sharp"])
    for k in (1, 2):
        model.extend_rope("dynamic_ntk", 4.0, k * N)
        rescale.apply(model, "yarn", k * N)
        xy = torch.from_numpy(np.stack([val[s:s + k * N + 1] for s in starts]))
        with torch.no_grad():
            _, want = model.eval()(xy[:, :-1], xy[:, 1:])
        assert windows[f"prefix_{k}x"]["mean_loss"] == pytest.approx(want.item(), abs=1e-4)
        model.extend_rope("none", 1.0, k * N)  # the native pass too: it scored prefix_1x at L's temperature
        with torch.no_grad():
            _, want = model(xy[:, :-1], xy[:, 1:])
        assert summary["models"][0]["native"]["windows"][f"prefix_{k}x"]["mean_loss"] == pytest.approx(want.item(),
                                                                                                       abs=1e-4)


@pytest.mark.parametrize("flag,passes", [("--ntk_per_length", "from k*N-token passes with the factor for k*N; "
                                          "the native pass: one L-token pass"),
                                         ("--no-ntk_per_length", "every window from one L-token pass, Dynamic NTK "
                                          "or YaRN's logit temperature with the factor for L (--no-ntk_per_length)")])
def test_the_window_rule_says_the_passes_dynamic_ntk_ran(ckpts, data_dir, tmp_path, flag, passes):
    eval_long.main([ckpts["plain"], "--data", data_dir, "--rope_method", "dynamic_ntk", flag, "--length", str(2 * N),
                    "--num_seqs", "1", "--out_dir", str(tmp_path / "res")])
    rule = json.loads((tmp_path / "res" / "summary.json").read_text())["window_rule"]
    assert rule.endswith(passes)  # one L-token pass was said to be k*N-token passes


def test_eval_long_warns_and_records_a_dataset_prepared_again_since_the_checkpoint_trained(ckpts, data_dir, tmp_path,
                                                                                          capsys):
    # the checkpoint's own dataset made again (another seed): its val split may hold documents the run trained on
    folder, path = trained_on_copy(data_dir, tmp_path, ckpts["plain"], sha256=PREPARED_AGAIN)
    eval_long.main([path, ckpts["plain"], "--data", folder, "--length", str(2 * N), "--num_seqs", "2", "--n_boot",
                    "10", "--out_dir", str(tmp_path / "res")])
    (line,) = warnings_of(capsys.readouterr().err)  # the untracked fixture's checkpoint: no warning
    assert path in line and folder in line and "val documents may have been trained on" in line
    again, older = json.loads((tmp_path / "res" / "summary.json").read_text())["models"]
    assert again["data_prepared_again"] is True and again["data_sha256"] == PREPARED_AGAIN != again["trained_sha256"]
    assert older["data_prepared_again"] is False and older["trained_sha256"] is None


def test_a_rescaled_models_label_names_its_logit_scale_in_every_csv_and_summary_record(ckpts, data_dir, tmp_path):
    # "softmax" with and without --logit_scale qwen: concatenated rows would mix two settings of one name
    run = lambda out, *extra: eval_long.main([ckpts["plain"], ckpts["sharp"], "--data", data_dir, "--length",  # noqa
                                              str(2 * N), "--num_seqs", "2", "--n_boot", "10", "--logit_scale", "qwen",
                                              "--out_dir", str(tmp_path / out), *extra])
    run("res")
    first = "softmax-qwen"  # as eval_tasks names the setting; the second softmax told apart by its place and folder
    labels = [m["label"] for m in json.loads((tmp_path / "res" / "summary.json").read_text())["models"]]
    assert labels[0] == first and labels[1].startswith(f"{first} #2 (")
    assert {r["model"] for r in compare.read_csv(tmp_path / "res" / "per_sequence.csv")} == set(labels)
    diffs = compare.read_csv(tmp_path / "res" / "differences.csv")
    assert {(d["model"], d["baseline"]) for d in diffs} == {(labels[1], first)}
    assert read_csv(tmp_path / "res" / "per_position.csv")[0][1:] == [*labels, *(f"{m} [native]" for m in labels)]
    run("named", "--labels", "a", "b", "--baseline", "b")  # the baseline as --labels names it
    summary = json.loads((tmp_path / "named" / "summary.json").read_text())
    assert [m["label"] for m in summary["models"]] == ["a-qwen", "b-qwen"] and summary["baseline"] == "b-qwen"


def test_a_nope_models_rows_and_record_name_rope_none_at_scale_1_beside_an_extended_rope_model(ckpts, data_dir,
                                                                                                tmp_path):
    torch.manual_seed(0)
    nope = GPT(replace(tiny_config(), pos="nope"))  # NoPE: no table to extend, so "none" whatever was asked
    path = str(tmp_path / "nope.pt")
    save_checkpoint({"model": nope.state_dict(), "model_args": asdict(nope.config), "config": {}, "iter_num": 3,
                     "best_val_loss": float("nan"), "run_info": run_info(0)}, path)
    eval_long.main([ckpts["plain"], path, "--labels", "r", "n", "--data", data_dir, "--length", str(2 * N),
                    "--rope_scale", "4", "--num_seqs", "2", "--n_boot", "10", "--out_dir", str(tmp_path / "res")])
    r, n = json.loads((tmp_path / "res" / "summary.json").read_text())["models"]
    assert [(m["iter_num"], m["rope_method"], m["rope_scale"]) for m in (r, n)] == [(7, "theta", 4.0), (3, "none", 1.0)]
    rows = compare.read_csv(tmp_path / "res" / "per_sequence.csv")
    assert {(x["rope"], x["rope_method"], x["rope_scale"]) for x in rows if x["model"] == "n"} == {
        ("extended", "none", "1.0"), ("native", "none", "1.0")}


def test_a_checkpoint_whose_run_changed_theta_records_it_and_names_its_native_pass_the_checkpoints_theta(
        ckpts, data_dir, tmp_path, monkeypatch, capsys):
    torch.manual_seed(0)
    model = GPT(replace(tiny_config(), rope_theta=40000.0))  # as train.py init_from=... rope_theta=40000.0 writes it
    path, changed = str(tmp_path / "th.pt"), {"rope_theta": [10000.0, 40000.0]}
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": {}, "iter_num": 0,
                     "best_val_loss": float("nan"), "run_info": run_info(0), "changed": changed}, path)
    drawn = []
    monkeypatch.setattr(figures, "plot_per_position", lambda *a: drawn.append((a[1], a[-1])))
    eval_long.main([ckpts["plain"], path, "--labels", "old", "th", "--data", data_dir, "--length", str(2 * N),
                    "--rope_scale", "4", "--num_seqs", "2", "--n_boot", "10", "--out_dir", str(tmp_path / "res")])
    old, th = json.loads((tmp_path / "res" / "summary.json").read_text())["models"]
    assert old["changed"] == {} and "rope_theta_trained" not in old["native"]  # an older checkpoint: none
    assert th["changed"] == changed and th["rope_theta_effective"] == pytest.approx(160000.0)  # x4 of an extended θ
    assert th["native"]["rope_theta_effective"] == pytest.approx(40000.0)
    assert th["native"]["rope_theta_trained"] == 10000.0
    assert th["native"]["described"] == "the checkpoint's θ=40,000; its weights trained at θ=10,000"
    assert "th [native]: " in (out := capsys.readouterr().out) and "its weights trained at θ=10,000" in out
    curves, title = drawn[-1]
    assert "th [native] (θ=40,000, trained at θ=10,000)" in [c[0] for c in curves] and "checkpoint's θ" in title


def test_eval_long_refuses_a_val_bin_cut_short_of_its_meta_json(ckpts, data_dir, tmp_path):
    # a truncated val.bin was evaluated from the tokens left, without a word
    folder = tmp_path / "cut"
    shutil.copytree(data_dir, folder)
    n = (folder / "val.bin").stat().st_size // 2
    (folder / "meta.json").write_text(json.dumps({"tokens": {"train": (folder / "train.bin").stat().st_size // 2,
                                                             "val": n}}))
    os.truncate(folder / "val.bin", n)  # half its tokens
    msg = one_line_error([ckpts["plain"], "--data", str(folder), "--length", str(2 * N), "--num_seqs", "2",
                          "--out_dir", str(tmp_path / "res")])
    assert f"{folder / 'val.bin'} is truncated: {n // 2:,} tokens on disk vs {n:,} in meta.json; re-prepare" in msg

