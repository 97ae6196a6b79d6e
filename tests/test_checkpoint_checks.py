"""lib/checkpoint.py's checks, called directly: --device's choice and its errors, what out_dir may hold before a run
writes there (a file, results, overwrite), what a run's results are in words, the temp files a resume clears, a
file that is no checkpoint, the config a resume continues, the start values a checkpoint's weights load over and
when an evaluation's data is the run's own dataset prepared again since, and what run_info records."""
import json, os, subprocess, sys
from dataclasses import asdict

import pytest
import torch

from lib import checkpoint
from lib.checkpoint import CheckpointError, check_out_dir, finished_part
from lib.provenance import data_provenance
from model import GPT, GPTConfig


def test_device_auto_is_cuda_only_where_there_is_one_and_a_bad_device_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert checkpoint.pick_device("auto") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert checkpoint.pick_device("auto") == torch.device("cpu")
    assert checkpoint.pick_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"^--device cuda:1: CUDA is not available here$"):
        checkpoint.pick_device("cuda:1")
    with pytest.raises(ValueError, match=r"^--device 'gpu' is not a device: use auto, cpu, cuda or cuda:N$"):
        checkpoint.pick_device("gpu")


def a_run(out_dir, evals, best=False):
    """out_dir with a log.jsonl of two steps and `evals` evaluations (and best.pt), no ckpt.pt."""
    out_dir.mkdir()
    rows = [{"config": {}, "start_iter": 0}, {"iter": 0, "loss": 5.0}, {"iter": 1, "loss": 4.0}]
    rows += [{"iter": i, "train_loss": 4.0, "val_loss": 4.5} for i in range(evals)]
    (out_dir / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if best:
        (out_dir / "best.pt").write_bytes(b"w")
    return str(out_dir)


def test_finished_part_counts_evaluations_not_steps(tmp_path):
    assert finished_part(a_run(tmp_path / "a", evals=2, best=True)) == "best.pt, log.jsonl with 2 evaluation(s)"
    assert finished_part(a_run(tmp_path / "b", evals=0)) == ""  # killed before its first eval: nothing to keep
    assert finished_part(str(tmp_path / "none")) == ""


def test_out_dir_checks_refuse_a_file_keep_results_and_let_a_run_without_results_start_afresh(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(CheckpointError, match="is a file, not a folder"):
        check_out_dir(str(tmp_path / "f"), resuming=False, resume=True, overwrite=True)
    done = a_run(tmp_path / "done", evals=1, best=True)
    with pytest.raises(CheckpointError, match=r"already holds a run \(best.pt, log.jsonl\): continue it"):
        check_out_dir(done, resuming=False, resume=False, overwrite=False)  # a new run: not a resume's words
    with pytest.raises(CheckpointError, match=r"resume=True, but .* \(best.pt, log.jsonl with 1 evaluation\(s\)\)"):
        check_out_dir(done, resuming=False, resume=True, overwrite=False)
    check_out_dir(done, resuming=False, resume=True, overwrite=True)  # replaced, as asked
    check_out_dir(done, resuming=True, resume=True, overwrite=False)  # its ckpt.pt continues it
    check_out_dir(a_run(tmp_path / "cut", evals=0), resuming=False, resume=True, overwrite=False)  # no results


def test_clearing_out_dir_removes_every_killed_writes_temp_file_and_a_new_runs_old_files(tmp_path):
    names = ["ckpt.pt", "best.pt", "log.jsonl", "ckpt.pt.tmp-123", "best.pt.tmp", "log.jsonl.tmp", "notes.txt"]
    for name in names:
        (tmp_path / name).write_text("{}\n")
    checkpoint.clear_out_dir(str(tmp_path), resuming=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "ckpt.pt", "log.jsonl", "notes.txt"]
    checkpoint.clear_out_dir(str(tmp_path), resuming=False)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_a_file_that_is_no_checkpoint_is_named_with_what_it_lacks(tmp_path):
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"not a torch.save zip archive \(0 bytes"):
        checkpoint.read_checkpoint(str(tmp_path / "empty.pt"))
    torch.save({"model": {}}, tmp_path / "weights.pt")
    with pytest.raises(CheckpointError, match=r"is not a nanoscorer checkpoint \(no model or model_args\)"):
        checkpoint.read_checkpoint(str(tmp_path / "weights.pt"))
    torch.save({"model": {}, "model_args": {}, "iter_num": 3}, tmp_path / "best.pt")
    with pytest.raises(CheckpointError, match=r"holds no optimizer or rng state, which a resume needs"):
        checkpoint.read_checkpoint(str(tmp_path / "best.pt"), need=("optimizer", "iter_num", "rng"))
    with pytest.raises(CheckpointError, match=r"is a directory, expected a checkpoint file"):
        checkpoint.read_checkpoint(str(tmp_path))


def test_a_checkpoint_with_damaged_weight_bytes_is_refused_naming_its_entry(tmp_path):
    import struct, zipfile
    model = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=2, n_embd=8, ffn_hidden=16))
    path = tmp_path / "best.pt"
    torch.save({"model": model.state_dict(), "model_args": asdict(model.config)}, path)
    with zipfile.ZipFile(path) as z:  # the largest weight: the bytes a bad disk or copy flips
        entry = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(entry.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        f.seek(entry.header_offset + 30 + name_len + extra_len + entry.file_size // 2)
        f.write(struct.pack("<4f", 1.0, 2.0, 3.0, 4.0))
    checkpoint.read_checkpoint(str(path), mmap=True)  # a cheap look at its config is not the place to check
    with pytest.raises(CheckpointError, match=rf"damaged: entry {entry.filename} fails its CRC check .* use another "
                                              r"checkpoint of the run \(best.pt or ckpt.pt\) or train it again$"):
        checkpoint.read_checkpoint(str(path))


def test_saved_config_gives_a_field_the_run_predates_the_value_it_ran_with():
    assert checkpoint.saved_config({"config": {"max_iters": 5}}) == {"sft_val_frac": 0.0, "max_iters": 5}
    assert checkpoint.saved_config({"config": {"sft_val_frac": 0.1}}) == {"sft_val_frac": 0.1}  # its own wins
    assert checkpoint.saved_config({"model": {}}) == {"sft_val_frac": 0.0}  # no stored config at all


@pytest.mark.parametrize("options, want", [({"scorer": "softmax"}, ()), ({"scorer": "ssmax"}, ("ssmax_s_init",)),
                                           ({"scorer": "ssmax", "ssmax_bias": True}, ("ssmax_s_init", "ssmax_b_init")),
                                           ({"scorer": "ssa"}, ("ssa_b_init", "ssa_n")),
                                           ({"scorer": "fox"}, ("fgate_bias_init",))])
def test_loaded_inits_are_the_start_values_of_weights_the_checkpoint_holds(options, want):
    model = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=2, n_embd=8, ffn_hidden=16, **options))
    assert checkpoint.loaded_inits({"model_args": asdict(model.config), "model": model.state_dict()}) == want


def test_run_info_names_the_gpu_a_run_had(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert checkpoint.run_info(5)["device"] == "NVIDIA H200" and checkpoint.run_info(5)["seed"] == 5


def test_run_info_records_the_cpu_kernels_instruction_set_on_every_device(tmp_path, monkeypatch):
    # AVX2 and AVX512 kernels train to other weights: a record must say which ran (a CUDA run's CPU ops too)
    assert checkpoint.run_info(0)["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    info = checkpoint.run_info(0)
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    torch.save({"run_info": info}, tmp_path / "r.pt")  # a plain str: weights_only reads it
    assert torch.load(tmp_path / "r.pt", weights_only=True)["run_info"] == info
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("no AVX2 here: ATEN_CPU_CAPABILITY=avx2 cannot be chosen")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}  # how results/synthetic's AVX2 runs are repeated
    show = "from lib.checkpoint import run_info; print(run_info()['cpu_capability'])"
    got = subprocess.run([sys.executable, "-c", show], cwd=checkpoint.REPO, env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert got[-1:] == ["AVX2"]


def test_run_info_takes_the_commit_from_the_environment_only_where_git_has_none(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOSCORER_GIT_SHA", "abc123")  # a lent device's copy has no .git: the command passes it
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # tmp_path: no repository above it either
    info = checkpoint.run_info(0, repo=str(tmp_path))
    assert (info["git_sha"], info["git_dirty"], info["git_diff_sha256"]) == ("abc123", None, None)
    assert checkpoint.run_info(0)["git_sha"] == checkpoint._git(checkpoint.REPO, "rev-parse", "HEAD").strip()


def test_data_provenance_warns_only_where_a_runs_own_folder_was_prepared_again(tmp_path, monkeypatch, capsys):
    for name, sha in (("docs", "new"), ("other", "new"), ("plain", None)):  # plain: another tool's files, no meta
        (tmp_path / "data" / name).mkdir(parents=True)
        if sha:
            (tmp_path / "data" / name / "meta.json").write_text(json.dumps({"sha256": {"val": sha}}))
    run = {"config": {"data_dir": "data", "dataset": "docs"}, "data_state": {"sha256": {"val": "old"}}}
    monkeypatch.chdir(tmp_path)  # the run's data_dir is relative, the evaluation's folder absolute: the same folder
    assert data_provenance("a.pt", run, str(tmp_path / "data" / "docs")) == dict(
        data_sha256={"val": "new"}, trained_sha256={"val": "old"}, data_prepared_again=True)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"warning: a.pt trained on {tmp_path / 'data' / 'docs'} before it was prepared again")
    same = {**run, "data_state": {"sha256": {"val": "new"}}}
    older = {"config": run["config"]}  # before checkpoints kept the splits' sha256
    for ckpt, folder in ((run, "data/other"), (run, "data/plain"), (same, "data/docs"), (older, "data/docs")):
        assert data_provenance("a.pt", ckpt, folder)["data_prepared_again"] is False
    assert capsys.readouterr().err == ""
    # an init_from's parent trained on the folder as first prepared: the child's own sha256 alone is today's
    child = {**run, "data_state": {"sha256": {"val": "new"}, "earlier_sha256": [{"val": "old"}]}}
    assert data_provenance("a.pt", child, "data/docs")["data_prepared_again"] is True
    assert "before it was prepared again" in capsys.readouterr().err
