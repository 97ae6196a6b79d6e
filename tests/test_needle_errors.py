"""needle.py's one-line errors: bad arguments and options, every checkpoint and --out_dir checked before the first
model runs, a failed evaluation leaves no file and the out_dir free, the script itself exits with one stderr line, a
val.bin of a cut id or none is one line naming it. Tiny models, CPU only."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import needle
import test_needle
from conftest import code_carrying_copy
from test_needle import one_line_error, read_csv

# test_needle's module fixtures, bound here by name for pytest (a `from` import of a fixture reads as unused)
enc, data_dir, ckpts = test_needle.enc, test_needle.data_dir, test_needle.ckpts


@pytest.mark.parametrize("argv, named", [
    (["needle", "--context_sizes", "20"], "context size 20 is too short"),
    (["bogus"], "'bogus'"),
    (["needle", "--ckpt", "nowhere/ckpt.pt"], "'nowhere/ckpt.pt' does not exist"),
    (["score", "--data", "no/such/dataset"], "--data 'no/such/dataset' does not exist"),
    (["passkey", "--data", "no/such", "--context_sizes", "64", "--samples", "1"], "--data 'no/such' does not exist"),
    (["sft_data", "--data", "no/such", "--synthetic", "1"], "--data 'no/such' does not exist"),
    (["passkey", "--labels", "a", "b"], "--labels a b: give one distinct name per --ckpt (1 checkpoints)"),
    (["passkey", "--samples", "0", "--context_sizes", "64"], "--samples 0: counts and sizes must be >= 1"),
    (["passkey", "--seed", "-1", "--context_sizes", "64", "--samples", "1"], "--seed -1: counts and sizes"),
    (["needle", "--depths", "0", "101", "--context_sizes", "96", "--samples", "1"], "--depths/--depth: counts"),
    # options another mode reads were recorded in the JSON as if run (passkey draws its own depths)
    (["passkey", "--depths", "0", "50", "--context_sizes", "64"], "--depths: mode passkey does not read it"),
    (["score", "--context_sizes", "999", "--samples", "7"], "--context_sizes, --samples: mode score does not read"),
    # summary JSONs recorded a project nothing was logged to
    (["passkey", "--wandb_project", "p", "--context_sizes", "64"], "--wandb_project p is not read: nothing is logged"),
])
def test_bad_input_is_one_error_line(ckpts, data_dir, argv, named, tmp_path):
    argv = argv + ["--data", data_dir] * ("--data" not in argv) + ["--ckpt", ckpts[0]] * ("--ckpt" not in argv)
    argv += ["--out_dir", str(tmp_path / "out")]  # not out-needle: another worker may hold its lock
    with pytest.raises(SystemExit) as e:
        needle.main(argv)
    message = e.value.code
    assert isinstance(message, str) and message.startswith("error: ") and "\n" not in message and named in message


def test_sft_data_refuses_the_options_only_a_model_reads_when_given(data_dir, tmp_path):
    # sft_data.json recorded them in its args as if a model had run with them
    argv = ["sft_data", "--synthetic", "2", "--sft_length", "200", "--data", data_dir]
    msg = one_line_error(argv + ["--rope_scale", "4", "--labels", "a", "--batch_size", "2", "--device", "meta",
                                 "--backend", "torch", "--max_new_tokens", "3", "--wandb"])
    assert ("--labels, --rope_scale, --max_new_tokens, --batch_size, --device, --backend, --wandb: mode sft_data "
            "--synthetic does not read it") in msg
    needle.main(argv + ["--rope_method", "theta", "--out_dir", str(tmp_path / "out")])  # a default: never refused
    assert json.load(open(tmp_path / "out" / "sft_synthetic.json"))["examples"] == 2


def test_sft_data_from_squad_refuses_the_options_only_the_synthetic_path_reads_when_given(ckpts, data_dir, tmp_path):
    # sft_squad.json recorded --data and --ckpt in its args as if its examples came from them
    path = tmp_path / "squad.jsonl"
    path.write_text(json.dumps(dict(context="Denver is in Colorado.", question="Where is Denver?",
                                    answers=dict(text=["Colorado"]))) + "\n")
    argv = ["sft_data", "--squad", str(path)]
    msg = one_line_error(argv + ["--data", data_dir, "--ckpt", ckpts[0], "--seed", "3", "--sft_length", "200"])
    assert ("--ckpt, --data, --seed, --sft_length: mode sft_data without --synthetic does not read it (it reads "
            "squad)") in msg
    assert "--squad: mode sft_data --synthetic does not read it" in one_line_error(
        argv + ["--synthetic", "2", "--data", data_dir])  # the other path: SQuAD's file, never read
    needle.main(argv + ["--seed", "1337", "--out_dir", str(tmp_path / "out")])  # a default: never refused
    record = json.load(open(tmp_path / "out" / "sft_squad.json"))
    assert (record["examples"], record["args"]["data"], record["args"]["ckpt"]) == (1, None, [])


def test_two_different_modes_or_none_is_one_error_line():
    # `passkey --mode needle` ran passkey and said nothing of the needle asked for
    assert "give one mode of sft_data, needle, passkey, score; got ['needle', 'passkey']" in one_line_error(
        ["passkey", "--mode", "needle"])
    assert "got []" in one_line_error([])


def test_a_mode_without_a_checkpoint_or_a_label_given_twice_is_one_error_line(ckpts, data_dir):
    assert "mode passkey needs --ckpt" in one_line_error(["passkey", "--data", data_dir])
    argv = ["passkey", "--ckpt", *ckpts, "--labels", "a", "a", "--context_sizes", "64", "--samples", "1"]
    assert "--labels a a: give one distinct name per --ckpt (2 checkpoints)" in one_line_error(argv)


@pytest.mark.parametrize("scale", ["0", "-2", "inf", "nan"])
def test_rope_scale_zero_negative_or_not_finite_is_one_error_line(ckpts, scale):
    assert f"--rope_scale {float(scale)}" in one_line_error(["passkey", "--ckpt", ckpts[0], "--rope_scale", scale])


def test_needle_refuses_a_rope_scale_with_rope_method_none_only_when_given(ckpts, data_dir, tmp_path):
    argv = ["passkey", "--ckpt", ckpts[0], "--data", data_dir, "--context_sizes", "64", "--samples", "1"]
    # passkey.json recorded 4, never applied
    msg = one_line_error(argv + ["--rope_method", "none", "--rope_scale", "4"])
    assert "--rope_scale 4 is not read: --rope_method none keeps the trained θ" in msg
    needle.main(argv + ["--rope_method", "none", "--out_dir", str(tmp_path / "out")])  # the default: never refused
    record = json.load(open(tmp_path / "out" / "passkey.json"))
    # the default stays in args; the model's record says what ran: the trained θ, at 1.0
    assert record["args"]["rope_scale"] == 50.0
    assert (record["models"][0]["rope_method"], record["models"][0]["rope_scale"]) == ("none", 1.0)


def test_sft_length_too_small_names_the_option_not_a_context_size(tmp_path, data_dir):
    msg = one_line_error(["sft_data", "--synthetic", "3", "--sft_length", "10", "--data", data_dir, "--out_dir",
                          str(tmp_path)])
    assert "--sft_length 10 is too short" in msg and "context size" not in msg


def no_model_runs(*args, **kwargs):
    pytest.fail("a model was evaluated")


@pytest.mark.parametrize("flag, values", [("--context_sizes", "64 128 64"), ("--depths", "50 10 50")])
def test_a_context_or_depth_given_twice_is_one_error_line_before_any_model_runs(ckpts, data_dir, flag, values,
                                                                                tmp_path, monkeypatch):
    monkeypatch.setattr(needle, "evaluate", no_model_runs)  # a repeat: one cell counted twice
    argv = ["needle", "--ckpt", ckpts[0], "--data", data_dir, "--out_dir", str(tmp_path), "--context_sizes", "64",
            flag, *values.split()]
    assert f"{flag} {values}: give each value once" in one_line_error(argv)


BAD_SECOND = {"carries code": "cannot be loaded safely: it refers to io.open", "directory": "is a directory",
              "truncated": "not a torch.save zip archive"}


@pytest.mark.parametrize("kind", BAD_SECOND)
def test_bad_second_checkpoint_fails_before_any_model_is_evaluated(kind, ckpts, tmp_path, monkeypatch):
    monkeypatch.setattr(needle, "evaluate", no_model_runs)
    bad = tmp_path / "second.pt"
    if kind == "carries code":
        code_carrying_copy(ckpts[1], bad, tmp_path / "pwned")
    elif kind == "truncated":
        bad.write_bytes(open(ckpts[1], "rb").read()[:2000])
    else:
        bad.mkdir()
    msg = one_line_error(["passkey", "--ckpt", ckpts[0], str(bad), "--out_dir", str(tmp_path / "res")])
    assert repr(str(bad)) in msg and BAD_SECOND[kind] in msg
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "res" / "passkey.csv").exists()


def test_out_dir_that_is_a_file_is_one_error_line_before_any_model_runs(ckpts, tmp_path, monkeypatch):
    monkeypatch.setattr(needle, "evaluate", no_model_runs)
    (tmp_path / "res").write_text("a file")
    msg = one_line_error(["passkey", "--ckpt", ckpts[0], "--out_dir", str(tmp_path / "res")])
    assert f"--out_dir {str(tmp_path / 'res')!r} is a file, expected a folder for the results" in msg


def test_a_checkpoint_that_fails_to_load_leaves_no_partial_results_and_the_out_dir_free(ckpts, tmp_path):
    c = torch.load(ckpts[1], weights_only=True)  # a readable checkpoint whose weights are not its model_args'
    torch.save({**c, "model_args": {**c["model_args"], "n_layer": 3}}, tmp_path / "misfit.pt")
    common = ["--context_sizes", "64", "--samples", "2", "--out_dir", str(tmp_path / "res")]
    msg = one_line_error(["passkey", "--ckpt", ckpts[0], str(tmp_path / "misfit.pt"), *common])
    assert "misfit.pt" in msg and "does not fit this model" in msg
    assert sorted(os.listdir(tmp_path)) == ["misfit.pt"]  # no out_dir, no staging folder beside it
    needle.main(["passkey", "--ckpt", ckpts[0], *common])  # the rerun without it
    rows = read_csv(tmp_path / "res" / "passkey.csv")
    assert len(rows) == 2 and {r["model"] for r in rows} == {os.path.dirname(ckpts[0])}
    assert [c["n"] for c in json.load(open(tmp_path / "res" / "passkey.json"))["cells"]] == [2]


def test_bad_input_exits_nonzero_with_one_stderr_line(tmp_path):
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "needle.py")
    r = subprocess.run([sys.executable, script, "passkey", "--ckpt", str(tmp_path / "missing.pt")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)  # its out-needle: not the repo's
    assert r.returncode != 0 and r.stderr.strip().count("\n") == 0 and "missing.pt" in r.stderr


@pytest.mark.parametrize("size, says", [(1001, "is 1,001 bytes, not a whole number of 2-byte ids"), (0, "is empty")])
def test_a_val_bin_of_a_cut_id_or_none_is_one_error_line_naming_it(ckpts, data_dir, tmp_path, size, says):
    # numpy's ValueError, a traceback: needle.py catches DataError, not ValueError
    folder = tmp_path / "data"
    shutil.copytree(data_dir, folder)
    os.truncate(folder / "val.bin", size)
    msg = one_line_error(["needle", "--ckpt", ckpts[0], "--data", str(folder), "--depths", "50", "--context_sizes",
                          "96", "--samples", "1", "--out_dir", str(tmp_path / "res")])
    assert f"{folder / 'val.bin'} {says}; re-prepare it with" in msg
