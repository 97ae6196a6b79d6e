"""needle.py end to end, every mode (needle, passkey, score): the CSV, JSON and PNG outputs agree with each other, each
row and cell records the asked and the actual depth, every checkpoint sees the same prompts, the score's summary per
model and its wandb table, RoPE extended to each context, the defaults (the papers' protocol). Tiny models and real
English, CPU only."""
import csv
import json
import os
import shutil
from dataclasses import asdict

import numpy as np
import pytest

import needle
import test_needle
from lib import retrieval
from lib.checkpoint import run_info, save_checkpoint
from model import GPT, GPTConfig
from test_needle import read_csv

def spy(loaded, calls):
    model = loaded[0]
    extend = model.extend_rope
    model.extend_rope = lambda method, scale, L: calls.append((method, scale, L)) or extend(method, scale, L)
    return loaded


# test_needle's module fixtures, bound here by name for pytest (a `from` import of a fixture reads as unused)
enc, data_dir, ckpts = test_needle.enc, test_needle.data_dir, test_needle.ckpts


def test_needle_end_to_end_csv_json_png_consistent(ckpts, data_dir, tmp_path):
    needle.main(["needle", "--ckpt", *ckpts, "--data", data_dir, "--context_sizes", "96", "160", "--depths", "10", "50",
                 "90", "--samples", "3", "--batch_size", "4", "--out_dir", str(tmp_path)])
    rows, result = read_csv(tmp_path / "needle.csv"), json.load(open(tmp_path / "needle.json"))
    assert len(rows) == 2 * 2 * 3 * 3 and {r["score"] for r in rows} <= {"exact", "first_digit", "wrong"}
    assert {"git_sha", "torch", "triton", "device", "seed"} <= set(result["run_info"])
    assert result["run_info"]["seed"] == result["args"]["seed"] == 1337
    assert result["args"]["context_sizes"] == [96, 160] and result["args"]["rope_scale"] == 50.0
    assert len(result["cells"]) == 2 * 2 * 3
    for c in result["cells"]:
        key = (c["model"], c["context"], c["depth"])
        scores = [r["score"] for r in rows if (r["model"], int(r["context"]), int(r["depth"])) == key]
        assert c["n"] == len(scores) == 3 and c["accuracy"] == scores.count("exact") / 3
        assert c["first_digit"] == 1 - scores.count("wrong") / 3
    assert all(retrieval.score_answer(r["output"], int(r["number"])) == r["score"] for r in rows)
    # the grid is the asked depth; each row and cell also says where its needles went
    assert list(rows[0])[3:5] == ["depth", "actual_depth"]
    assert all(abs(float(r["actual_depth"]) - int(r["depth"])) <= 100 * retrieval.DEPTH_TOLERANCE for r in rows)
    for c in result["cells"]:
        depths = [float(r["actual_depth"]) for r in rows if (r["model"], int(r["context"]), int(r["depth"])) ==
                  (c["model"], c["context"], c["depth"])]
        assert c["actual_depth"] == pytest.approx(np.mean(depths), abs=0.05)
    by_model = [[(r["context"], r["depth"], r["city"], r["number"]) for r in rows if r["model"] == m]
                for m in {r["model"] for r in rows}]
    assert by_model[0] == by_model[1]  # every checkpoint sees the same prompts
    per_context = [[(r["city"], r["number"]) for r in rows if r["model"] == rows[0]["model"] and r["context"] == L]
                   for L in ("96", "160")]
    assert per_context[0] != per_context[1]  # each context its own needles (seeded by seed and context), no repeats
    assert all(r["city"] in retrieval.EVAL_CITIES and int(r["number"]) % 2 == 0 for r in rows)
    assert (tmp_path / "needle.png").stat().st_size > 1000


def test_passkey_end_to_end(ckpts, tmp_path, monkeypatch):
    extended, extend = [], needle.load_checkpoint  # RoPE extended to each context, as --rope_method/--rope_scale say
    monkeypatch.setattr(needle, "load_checkpoint", lambda *a, **kw: spy(extend(*a, **kw), extended))
    needle.main(["passkey", "--ckpt", ckpts[0], "--context_sizes", "64", "128", "--samples", "3",
                 "--out_dir", str(tmp_path), "--labels", "softmax"])
    rows, result = read_csv(tmp_path / "passkey.csv"), json.load(open(tmp_path / "passkey.json"))
    assert len(rows) == 6 and all(10000 <= int(r["number"]) <= 99999 for r in rows)
    assert {r["model"] for r in rows} == {"softmax"}  # --labels names the model
    assert [(c["context"], c["n"]) for c in result["cells"]] == [(64, 3), (128, 3)]
    assert extended == [("theta", 50.0, 64), ("theta", 50.0, 128)]
    assert (tmp_path / "passkey.png").stat().st_size > 1000


def test_score_end_to_end(ckpts, data_dir, tmp_path, capsys):
    needle.main(["score", "--ckpt", *ckpts, "--data", data_dir, "--context", "128", "--trials", "5",
                 "--out_dir", str(tmp_path)])
    heads, trials = read_csv(tmp_path / "needle_score_heads.csv"), read_csv(tmp_path / "needle_score_trials.csv")
    fig7 = json.load(open(tmp_path / "needle_score_heads.json"))["fig7"]
    assert len(heads) == 2 * 2 * 2 and len(trials) == 2 * 5  # 2 models x 2 layers x 2 heads; 5 trials per model
    for m in {h["model"] for h in heads}:
        scores = [float(h["score"]) for h in heads if h["model"] == m]
        assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
        top7, = [f for f in fig7 if f["model"] == m]
        assert (top7["city"], top7["number"], top7["depth"]) == ("Tokyo", 8106422, 50)
        assert top7["top_score"] == pytest.approx(scores[0])
    assert all(float(t["top_score"]) > 0 and t["score"] in needle.MARKERS for t in trials)
    for t in trials:  # the baselines: uniform = span tokens / keys, a control span as long and off the needle
        a, n, c = int(t["span_start"]), int(t["span_tokens"]), int(t["control_start"])
        assert int(t["keys"]) == 128 and float(t["uniform"]) == pytest.approx(n / 128)
        assert c + n <= a or c >= a + n
        assert float(t["top_score"]) >= float(t["mean_score"]) and float(t["control_top_score"]) >= float(
            t["control_mean_score"])
    scores, cells = (json.load(open(tmp_path / "needle_score_trials.json"))[k] for k in ("scores", "cells"))
    assert [c["n"] for c in cells] == [5, 5]  # Fig. 8's trials only, not Fig. 7's fixed needle
    for s in scores:  # per model: the means over its trials
        rows = [t for t in trials if t["model"] == s["model"]]
        assert s["n"] == len(rows) == 5
        for k in ("top_score", "mean_score", "control_top_score", "control_mean_score", "uniform"):
            assert s[k] == pytest.approx(np.mean([float(t[k]) for t in rows]))
    out = capsys.readouterr().out  # one summary line per model, named by its run folder, not its path
    for ckpt in ckpts:
        assert f"\n{os.path.basename(os.path.dirname(ckpt))}: needle score " in "\n" + out
    for s in scores:  # each model's line: its own numbers
        assert f": needle score {s['top_score']:.3f} best head, {s['mean_score']:.4f} mean head;" in out
    assert (tmp_path / "needle_score_heads.png").exists() and (tmp_path / "needle_score_trials.png").exists()


def test_score_wandb_table_holds_the_csv_columns(ckpts, data_dir, tmp_path, monkeypatch):
    logged = []  # tracking.log_table's cells must be scalars: a per-head tensor made it fail after every result
    monkeypatch.setattr(needle.tracking, "log_table", lambda project, name, rows, out_dir: logged.extend(rows))
    needle.main(["score", "--ckpt", ckpts[0], "--data", data_dir, "--context", "128", "--trials", "2", "--wandb",
                 "--out_dir", str(tmp_path)])
    header = next(csv.reader(open(tmp_path / "needle_score_trials.csv")))
    assert len(logged) == 3 and all(list(r) == header for r in logged)
    assert all(isinstance(v, (int, float, str)) for r in logged for v in r.values())


def test_cells_count_exact_answers_as_accuracy_and_every_answer_with_its_first_digit_right_as_first_digit():
    rows = [dict(model="m", context=64, score=s, actual_depth=d)
            for s, d in (("exact", 10.0), ("first_digit", 20.0), ("wrong", 30.0), ("wrong", 40.0))]
    (c,) = retrieval.cells(rows, ("model", "context"))
    assert (c["n"], c["accuracy"], c["first_digit"], c["actual_depth"]) == (4, 0.25, 0.5, 25.0)  # exact ones included


@pytest.mark.parametrize("mode, contexts", [("needle", [1024, 2048, 4096, 6144, 8192, 10240]),
                                            ("passkey", [1024, 1536, 2048, 4096, 8192])])
def test_defaults_are_the_papers_protocol(mode, contexts, tmp_path, monkeypatch):
    got = {}  # SSMax Fig. 6 (depths, contexts; Figs. 7-8: context 8000, depth 50), LSSAR Fig. 3 (contexts), θ x 50
    monkeypatch.setattr(needle, "run", lambda args, folder: (got.update(vars(args)), ""))  # (table, line)
    needle.main([mode, "--out_dir", str(tmp_path)])
    assert got["context_sizes"] == contexts and got["depths"] == [10, 30, 50, 70, 90] and got["samples"] == 100
    assert (got["context"], got["depth"], got["trials"]) == (8000, 50, 100)
    assert (got["rope_method"], got["rope_scale"], got["max_new_tokens"], got["seed"]) == ("theta", 50.0, 10, 1337)


def test_two_runs_whose_folders_share_a_name_are_titled_by_their_paths(ckpts, data_dir, tmp_path, monkeypatch):
    paths, titles = [tmp_path / d / "run" / "ckpt.pt" for d in ("a", "b")], []
    for src, dst in zip(ckpts, paths):
        dst.parent.mkdir(parents=True)
        shutil.copy(src, dst)
    monkeypatch.setattr(needle, "report", lambda args, folder, rows, models, labels, seen: titles.append(labels))
    needle.main(["passkey", "--ckpt", *map(str, paths), "--data", data_dir, "--context_sizes", "64", "--samples", "1",
                 "--max_new_tokens", "1", "--out_dir", str(tmp_path / "res")])
    assert titles[-1] == [str(p.parent) for p in paths]  # not "run" twice in the legends


def test_one_checkpoint_given_twice_gets_two_model_names_in_the_csv_and_json(ckpts, data_dir, tmp_path):
    # both models' rows had one name: a CSV whose rows of two models could not be told apart
    needle.main(["passkey", "--ckpt", ckpts[0], ckpts[0], "--data", data_dir, "--context_sizes", "64", "--samples", "1",
                 "--max_new_tokens", "1", "--out_dir", str(tmp_path / "res")])
    run = os.path.dirname(ckpts[0])
    names = [run, f"{run} #2 ({os.path.basename(run)})"]  # compare.unique_labels, as eval_long's
    assert [r["model"] for r in read_csv(tmp_path / "res" / "passkey.csv")] == names
    assert [m["model"] for m in json.load(open(tmp_path / "res" / "passkey.json"))["models"]] == names


def test_needle_records_each_models_iteration_and_the_rope_it_ran_at_each_context_none_for_a_nope_model(
        ckpts, data_dir, tmp_path):
    nope = tmp_path / "out-nope" / "ckpt.pt"  # a NoPE model, at another iteration: its rows name no θ
    nope.parent.mkdir()
    model = GPT(GPTConfig(block_size=64, n_layer=2, n_head=2, n_embd=32, ffn_hidden=64, pos="nope"))
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": {}, "iter_num": 7,
                     "best_val_loss": float("nan"), "run_info": run_info(0)}, str(nope))
    needle.main(["passkey", "--ckpt", ckpts[0], str(nope), "--data", data_dir, "--context_sizes", "64", "128",
                 "--samples", "1", "--max_new_tokens", "1", "--rope_method", "dynamic_ntk", "--rope_scale", "2",
                 "--out_dir", str(tmp_path / "res")])
    rope, nope = json.loads((tmp_path / "res" / "passkey.json").read_text())["models"]
    assert (rope["iter_num"], rope["rope_method"], rope["rope_scale"]) == (0, "dynamic_ntk", 2.0)
    assert [r["context"] for r in rope["rope"]] == [64, 128]
    assert rope["rope"][0]["rope_theta_effective"] == pytest.approx(1e4)  # within the training length: its own θ
    assert rope["rope"][1]["rope_theta_effective"] > 10000.0  # Dynamic NTK's θ grows past the training length
    assert (nope["iter_num"], nope["rope_method"], nope["rope_scale"]) == (7, "none", 1.0)
    assert all(r["rope_theta"] is None and r["rope_theta_effective"] is None for r in nope["rope"])
