"""convert_hf.py's command line: bad arguments, a missing or wrong checkpoint, a tokenizer without an end-of-text id, a
folder in use or a file given as --out are each one `error:` line (no usage dump, no traceback), run as a script too;
an export prints its folder and the files it wrote. Models: tiny random ones (test_hf.py, test_hf_scorers.py).
Skipped without requirements-hf.txt."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
import convert_hf  # noqa: E402
from conftest import one_line_error  # noqa: E402
from lib import folders  # noqa: E402
from test_hf import llama  # noqa: E402
from test_hf_scorers import nanoscorer_ckpt  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bad_arguments_are_one_error_line_without_a_usage_dump(capsys):
    for argv, words in ((["import", "src"], "error: the following arguments are required: --out"),
                        (["convert", "src", "--out", "o"], "error: argument direction: invalid choice: 'convert'"),
                        (["export"], "error: the following arguments are required: source, --out")):
        assert one_line_error(convert_hf.main, argv).startswith(words)
    assert capsys.readouterr() == ("", "")  # argparse's own error() had printed the usage to stderr


def test_an_export_prints_its_folder_and_the_files_it_wrote(tmp_path, capsys):
    _, path = nanoscorer_ckpt(tmp_path / "ckpt.pt", scorer="ssa")
    convert_hf.main(["export", path, "--out", str(tmp_path / "hf")])
    out = capsys.readouterr().out
    assert out == f"{tmp_path / 'hf'}: config.json, model.safetensors\n"  # no codec: no tokenizer files
    assert sorted(os.listdir(tmp_path / "hf")) == ["config.json", "model.safetensors"]


def test_a_missing_or_wrong_checkpoint_a_tokenizer_without_eot_and_a_busy_or_file_out_are_one_error_line(tmp_path):
    _, path = nanoscorer_ckpt(tmp_path / "ckpt.pt", scorer="ssa")
    run = lambda *argv: one_line_error(convert_hf.main, list(argv))
    assert run("export", str(tmp_path / "no.pt"), "--out", "o") == f"error: checkpoint {str(tmp_path / 'no.pt')!r} " \
                                                                   "does not exist"
    assert run("export", str(tmp_path), "--out", "o").endswith("is a directory, expected a checkpoint file")
    with folders.held(str(tmp_path / "busy"), "an export"):  # another export writing the same folder
        msg = run("export", path, "--out", str(tmp_path / "busy"))
    assert msg.startswith(f"error: {str(tmp_path / 'busy')!r} is in use: an export is being written by process ")
    assert not (tmp_path / "busy").exists()
    llama(str(tmp_path / "src"), False)
    (tmp_path / "a-file").write_text("")
    assert run("import", str(tmp_path / "src"), "--out", str(tmp_path / "a-file")) == \
        f"error: --out {str(tmp_path / 'a-file')!r} is a file, expected a folder for ckpt.pt"
    assert run("export", path, "--out", str(tmp_path / "a-file")) == \
        f"error: --out {str(tmp_path / 'a-file')!r} is a file, expected a folder for the results"
    cfg = json.load(open(tmp_path / "src" / "config.json"))  # tokenizer.json beside a config with no eos_token_id
    json.dump({**cfg, "eos_token_id": None}, open(tmp_path / "src" / "config.json", "w"))
    assert run("import", str(tmp_path / "src"), "--out", str(tmp_path / "r")).endswith(
        "tokenizer.json: no end-of-text id (its config.json's eos_token_id) to separate documents with")
    assert not os.path.exists(tmp_path / "r" / "ckpt.pt")


def test_convert_hf_py_run_as_a_script_exits_with_one_error_line(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(REPO, "convert_hf.py"), "export", str(tmp_path / "no.pt"),
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"error: checkpoint {str(tmp_path / 'no.pt')!r} does not "
                                                          "exist\n")


def test_a_broken_hugging_face_folder_is_one_error_line_naming_the_file_and_writes_nothing(tmp_path):
    """A download cut short or a file of another kind: config.json, an index, a shard, tokenizer.json or
    tokenizer_config.json that cannot be read says which file, in one line (they were tracebacks)."""
    src, sharded = tmp_path / "src", tmp_path / "sharded"
    llama(str(src), False)
    llama(str(sharded), True, "100KB")
    config = json.load(open(src / "config.json"))
    files = {f: (src / f).read_bytes() for f in os.listdir(src)}
    cases = [(src, "config.json", b"{\"vocab_size\": 2", "config.json is not readable JSON (JSONDecodeError: "),
             (src, "config.json", b"[1, 2]", "config.json holds a JSON list, not the object Hugging Face writes"),
             (src, "config.json", json.dumps({k: v for k, v in config.items() if k != "vocab_size"}).encode(),
              "config.json lacks 'vocab_size': not a Llama-family config"),
             (src, "model.safetensors", files["model.safetensors"][:1000], "model.safetensors is not a readable "
                                                                             "safetensors file (SafetensorError: "),
             (src, "tokenizer.json", b"{\"model\": 3}",
              "tokenizer.json is not a tokenizer the tokenizers library reads"),
             (src, "tokenizer_config.json", b"{bos", "tokenizer_config.json is not readable JSON (JSONDecodeError: "),
             (sharded, "model.safetensors.index.json", b"{\"metadata\": {}}",
              "model.safetensors.index.json has no weight_map (tensor name -> shard file)")]
    for i, (folder, name, broken, words) in enumerate(cases):
        kept = (folder / name).read_bytes()
        (folder / name).write_bytes(broken)
        msg = one_line_error(convert_hf.main, ["import", str(folder), "--out", str(tmp_path / f"run{i}")])
        assert msg.startswith(f"error: {folder}") and words in msg, (name, msg)
        assert not (tmp_path / f"run{i}").exists()
        (folder / name).write_bytes(kept)
    convert_hf.main(["import", str(sharded), "--out", str(tmp_path / "whole")])  # mended, the same folder imports
    assert (tmp_path / "whole" / "ckpt.pt").is_file()


def test_weights_of_layers_past_num_hidden_layers_are_named_when_dropped(tmp_path, capsys):
    llama(str(tmp_path / "src"), False)  # 2 layers of weights, a config.json that says 1: dropped without a word
    cfg = json.load(open(tmp_path / "src" / "config.json"))
    json.dump({**cfg, "num_hidden_layers": 1}, open(tmp_path / "src" / "config.json", "w"))
    convert_hf.main(["import", str(tmp_path / "src"), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert "warning: config.json's num_hidden_layers=1: 9 weights of later layers (from model.layers.1." in err, err


def test_an_export_onto_a_full_disk_is_one_error_line_and_leaves_no_folder(tmp_path, monkeypatch):
    """safetensors reports a full disk as its own SafetensorError, not an OSError: it was a traceback."""
    import safetensors
    import safetensors.torch
    _, path = nanoscorer_ckpt(tmp_path / "ckpt.pt", scorer="ssa")

    def full(*a, **k):
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    monkeypatch.setattr(safetensors.torch, "save_file", full)
    msg = one_line_error(convert_hf.main, ["export", path, "--out", str(tmp_path / "hf")])
    assert msg == f"error: {tmp_path / 'hf' / 'model.safetensors'}: not written (Error while serializing: I/O error: " \
                  "No space left on device (os error 28))"
    assert not (tmp_path / "hf").exists()
