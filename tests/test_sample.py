"""sample.py: num_samples samples of prompt + max_new_tokens tokens, greedy output equals a rollout without the KV
cache (past the training length, for scorers that use n_i) of the eval model (dropout off), --top_k 1 is greedy,
seeds, FILE: prompts, an imported tokenizer's <s> fed and not shown, a padded vocabulary's extra ids never
sampled, --rope_theta changes the rotary tables and nothing else, one-line errors;
lib.checkpoint.read_checkpoint (weights_only: a file carrying code is refused, old checkpoints still load, corrupt files
are one line). Tiny random models, CPU only."""
import os
import subprocess
import sys
import pickle
from dataclasses import asdict

import pytest
import torch

from lib import vocab
import sample
from conftest import WritesAFile, code_carrying_copy, one_line_error
from lib.checkpoint import load_checkpoint, read_checkpoint, run_info, save_checkpoint
from model import GPT, GPTConfig, precompute_rope

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 16  # training length of the tiny models
PROMPT = "ROMEO: But, soft!"


def write_ckpt(path, scorer="softmax", **kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=N, n_layer=2, n_head=2, n_embd=32, ffn_hidden=64, scorer=scorer, **kw))
    with torch.no_grad():  # sharper attention and logits than the init: positions (RoPE, cache offsets) matter
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(8)
        model.lm_head.weight.mul_(5)
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": {}, "iter_num": 0,
                     "best_val_loss": float("nan"), "run_info": run_info(0)}, str(path))
    return str(path)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_ckpt(tmp_path_factory.mktemp("out") / "ckpt.pt")


def run(capsys, *argv):
    """sample.main's samples, split at the separator lines."""
    sample.main(list(argv))
    out = capsys.readouterr().out
    assert out.endswith(f"\n{sample.SEP}\n")
    return out[:-len(sample.SEP) - 2].split(f"\n{sample.SEP}\n")


def greedy_rollout(model, ids, n):
    """Argmax decoding without the KV cache: the whole sequence through the model at every step."""
    idx = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            logits, _ = model.eval()(idx)
            idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx[0].tolist()


@pytest.mark.parametrize("scorer", ["softmax", "ssmax", "lssar"])
def test_greedy_samples_equal_the_models_rollout_without_cache_past_the_training_length(scorer, tmp_path, capsys):
    path = write_ckpt(tmp_path / "ckpt.pt", scorer)
    enc = vocab.get_tokenizer()
    ids, n = enc.encode(PROMPT), 2 * N  # prompt + new tokens > N: the rotary tables must grow
    samples = run(capsys, "--ckpt", path, "--start", PROMPT, "--num_samples", "2", "--max_new_tokens", str(n),
                  "--temperature", "0")
    want = greedy_rollout(load_checkpoint(path)[0], ids, n)
    assert len(want) == len(ids) + n and len(set(want[len(ids):])) > 1  # a real rollout, not one repeated token
    assert samples == [enc.decode(want)] * 2


def test_top_k_1_samples_the_greedy_tokens(ckpt, capsys):
    args = ["--ckpt", ckpt, "--start", PROMPT, "--num_samples", "1", "--max_new_tokens", "8"]
    assert run(capsys, *args, "--temperature", "1", "--top_k", "1") == run(capsys, *args, "--temperature", "0")


def test_a_checkpoint_trained_with_dropout_samples_its_eval_model(tmp_path, capsys):
    path = write_ckpt(tmp_path / "ckpt.pt", dropout=0.5)  # load_checkpoint leaves dropout on: sample.py turns it off
    enc = vocab.get_tokenizer()
    want = enc.decode(greedy_rollout(load_checkpoint(path)[0], enc.encode(PROMPT), 8))
    args = ["--ckpt", path, "--start", PROMPT, "--num_samples", "1", "--max_new_tokens", "8", "--temperature", "0"]
    assert [run(capsys, *args, "--seed", seed)[0] for seed in "12"] == [want] * 2


def test_empty_prompt_starts_from_endoftext_and_prints_only_the_new_tokens(ckpt, capsys):
    samples = run(capsys, "--ckpt", ckpt, "--start", "", "--num_samples", "1", "--max_new_tokens", "5",
                  "--temperature", "0")
    want = greedy_rollout(load_checkpoint(ckpt)[0], [vocab.EOT], 5)
    assert samples == [vocab.get_tokenizer().decode(want[1:])]


def test_same_seed_same_samples_other_seed_other_samples(ckpt, capsys):
    args = ["--ckpt", ckpt, "--start", PROMPT, "--num_samples", "3", "--max_new_tokens", "8", "--temperature", "1"]
    a, b, c = (run(capsys, *args, "--seed", seed) for seed in ("1", "1", "2"))
    assert len(a) == 3 and all(s.startswith(PROMPT) and len(s) > len(PROMPT) for s in a)
    assert a == b and a != c
    assert len(set(a)) == 3  # the generator runs on across samples: they differ from each other


def test_file_prompt_equals_the_same_text_given_inline(ckpt, tmp_path, capsys):
    text = "First Citizen:\nBefore we proceed any further, hear me speak.<|endoftext|>ROMEO:"
    (tmp_path / "prompt.txt").write_text(text, encoding="utf-8")
    args = ["--ckpt", ckpt, "--num_samples", "1", "--max_new_tokens", "6", "--temperature", "0"]
    from_file = run(capsys, *args, "--start", f"FILE:{tmp_path / 'prompt.txt'}")
    assert from_file == run(capsys, *args, "--start", text) and from_file[0].startswith(text)


def test_rope_theta_changes_the_rotary_tables_and_outputs_not_the_weights(ckpt, capsys, monkeypatch):
    loaded = []  # the model sample.main samples from, to inspect afterwards

    def load(*args, **kwargs):
        loaded.append(load_checkpoint(*args, **kwargs))
        return loaded[-1]
    monkeypatch.setattr(sample, "load_checkpoint", load)
    n = 2 * N
    samples = run(capsys, "--ckpt", ckpt, "--start", PROMPT, "--num_samples", "1", "--max_new_tokens", str(n),
                  "--temperature", "0", "--rope_theta", "500000")
    model, saved = loaded[0]
    ids = vocab.get_tokenizer().encode(PROMPT)
    assert model.rope_theta == 500000 and model.rope_cos.size(0) >= len(ids) + n  # long enough for the whole sample
    cos, sin = precompute_rope(model.rope_cos.size(0), 16, theta=500000.0)
    assert torch.equal(model.rope_cos, cos) and torch.equal(model.rope_sin, sin)
    assert model.state_dict().keys() == saved["model"].keys()
    assert all(torch.equal(v, saved["model"][k]) for k, v in model.state_dict().items())
    want = greedy_rollout(model, ids, n)  # the sample is the θ = 500,000 model's own greedy rollout...
    assert samples == [vocab.get_tokenizer().decode(want)]
    base = load_checkpoint(ckpt)[0].eval()  # ...and θ changes what the model computes
    x = torch.tensor([want])
    with torch.no_grad():
        assert not torch.allclose(model(x, x)[0], base(x, x)[0], atol=1e-3)


BAD = [(["--ckpt", "nope/ckpt.pt"], "does not exist"),
       (["--start", "FILE:nope/prompt.txt"], "prompt file"),
       (["--max_new_tokens", "0"], "--max_new_tokens 0"),
       (["--temperature", "-0.5"], "--temperature -0.5"),
       (["--top_k", "0"], "--top_k 0"),
       (["--num_samples", "0"], "--num_samples 0"),
       (["--rope_theta", "-1"], "--rope_theta -1"),
       (["--num_samples", "two"], "invalid int value"),
       (["--backend", "cuda"], "invalid choice"),
       (["--data", "no/such/dataset"], "--data 'no/such/dataset' does not exist")]  # was: "another vocabulary"


@pytest.mark.parametrize("argv,words", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_error_line(argv, words, ckpt):
    assert words in one_line_error(sample.main, ["--ckpt", ckpt, *argv])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs the Triton kernels")
def test_triton_backend_without_a_gpu_is_one_error_line_not_a_traceback(ckpt, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")  # conftest's test-only interpreter; a user's CPU has none
    assert "need a CUDA GPU" in one_line_error(sample.main, ["--ckpt", ckpt, "--backend", "triton"])


def test_a_backend_that_does_not_run_the_scorer_is_named_as_the_bad_value_not_the_checkpoint(tmp_path):
    # it read "'.../ckpt.pt' does not fit this model: ValueError: backend='sdpa' ...": the checkpoint blamed
    msg = one_line_error(sample.main, ["--ckpt", write_ckpt(tmp_path / "ckpt.pt", "ssa"), "--backend", "sdpa"])
    assert "backend='sdpa' does not run scorer='ssa'; its backends: torch, cpu" in msg
    assert "does not fit" not in msg and "ckpt.pt" in msg  # which model, still


def one_error_line(argv):  # sample.main's
    return one_line_error(sample.main, argv)


def test_a_checkpoint_carrying_code_is_refused_and_the_code_never_runs(ckpt, tmp_path):
    code_carrying_copy(ckpt, tmp_path / "evil.pt", tmp_path / "pwned")
    msg = one_error_line(["--ckpt", str(tmp_path / "evil.pt"), "--max_new_tokens", "1"])
    assert "evil.pt" in msg and "cannot be loaded safely: it refers to io.open, which weights_only=True refuses" in msg
    assert not (tmp_path / "pwned").exists()
    pickle.loads(pickle.dumps(WritesAFile(str(tmp_path / "pwned")))).close()  # the payload is real: unpickling runs it
    assert (tmp_path / "pwned").exists()


def test_old_checkpoint_with_a_torchversion_in_run_info_still_loads(ckpt, tmp_path, capsys):
    assert type(run_info()["torch"]) is str  # new checkpoints: a plain str, no class to allow
    old = torch.load(ckpt, weights_only=True)  # loads with no class allowed
    old["run_info"]["torch"] = torch.__version__  # a TorchVersion, as run_info stored it before
    torch.save(old, tmp_path / "old.pt")
    with pytest.raises(Exception, match="TorchVersion"):  # what read_checkpoint allows, by name
        torch.load(tmp_path / "old.pt", weights_only=True)
    assert type(read_checkpoint(str(tmp_path / "old.pt"))["run_info"]["torch"]) is torch.torch_version.TorchVersion
    args = ["--start", PROMPT, "--num_samples", "1", "--max_new_tokens", "4", "--temperature", "0"]
    assert run(capsys, "--ckpt", str(tmp_path / "old.pt"), *args) == run(capsys, "--ckpt", ckpt, *args)


def corrupt(kind, ckpt, d):
    """A path that is not a usable checkpoint, of the given kind."""
    path = d / "ckpt.pt"
    if kind == "text file":
        path.write_text("not a checkpoint")
    elif kind == "empty file":
        path.write_bytes(b"")
    elif kind == "directory":
        path.mkdir()
    elif kind == "truncated zip":
        data = open(ckpt, "rb").read()
        path.write_bytes(data[:len(data) // 2])
    elif kind == "foreign pickle":
        torch.save({"weights": torch.zeros(2)}, path)
    else:  # weights of another model: model_args say 3 layers, the weights have 2
        c = torch.load(ckpt, weights_only=True)
        torch.save({**c, "model_args": {**c["model_args"], "n_layer": 3}}, path)
    return str(path)


CORRUPT = {"text file": "not a torch.save zip archive", "empty file": "(0 bytes",
           "directory": "is a directory, expected a checkpoint file", "truncated zip": "not a torch.save zip archive",
           "foreign pickle": "not a nanoscorer checkpoint (no model or model_args)",
           "weights of another model": "does not fit this model: RuntimeError"}


@pytest.mark.parametrize("kind", CORRUPT)
def test_a_file_that_is_not_a_checkpoint_is_one_error_line(kind, ckpt, tmp_path):
    path = corrupt(kind, ckpt, tmp_path)
    msg = one_error_line(["--ckpt", path])
    assert repr(path) in msg and CORRUPT[kind] in msg


def test_temperature_so_small_it_overflows_is_refused_and_zero_is_greedy(ckpt, capsys):
    for t in ("1e-40", "1e-4", "inf", "nan"):
        assert f"--temperature {float(t)} must be 0 (greedy) or in [0.001, inf)" in one_error_line(
            ["--ckpt", ckpt, "--temperature", t])
    for t in ("0", "0.001"):  # the smallest allowed temperature samples finite, ordinary text
        assert len(run(capsys, "--ckpt", ckpt, "--start", PROMPT, "--num_samples", "1", "--max_new_tokens", "3",
                       "--temperature", t)) == 1


def test_command_line_errors_are_one_stderr_line_without_traceback(ckpt):
    cases = [BAD[0], BAD[2]]  # a missing checkpoint, an argument check: every case is checked in-process above
    procs = [subprocess.Popen([sys.executable, os.path.join(REPO, "sample.py"), "--ckpt", ckpt, *argv], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for argv, _ in cases]
    for p, (_, words) in zip(procs, cases):
        out, err = p.communicate(timeout=60)
        assert p.returncode == 1 and out == "" and "Traceback" not in err
        assert err.startswith("error: ") and err.count("\n") == 1 and words in err


def test_an_imported_tokenizers_prompt_starts_with_its_bos_hidden_and_padded_ids_are_never_sampled(tmp_path, capsys,
                                                                                                    monkeypatch):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.train_from_iterator([PROMPT * 20], tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    enc = vocab.HFCodec(tok.to_str(), eot=0)  # Llama's way: <s> before every text
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=N, vocab_size=enc.n_vocab + 20, n_layer=1, n_head=2, n_embd=32, ffn_hidden=64))
    with torch.no_grad():
        model.lm_head.weight[:enc.n_vocab] *= 0.01  # the 20 padded ids: by far the likeliest
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": {}, "iter_num": 0,
                     "codec": vocab.record(enc)}, str(tmp_path / "ckpt.pt"))
    calls, generate = [], GPT.generate
    monkeypatch.setattr(GPT, "generate", lambda self, x, *a, **k: calls.append((x, generate(self, x, *a, **k))) or
                        calls[-1][1])
    samples = run(capsys, "--ckpt", str(tmp_path / "ckpt.pt"), "--start", "ROMEO", "--num_samples", "1",
                  "--max_new_tokens", "6", "--temperature", "0")
    (x, y), = calls
    assert x[0].tolist() == [1] + enc.encode("ROMEO") and y.max() < enc.n_vocab
    assert samples == [enc.decode(y[0, 1:].tolist())] and samples[0].startswith("ROMEO")  # <s> fed, not shown


def test_a_task_run_is_named_as_one_and_rope_theta_on_a_nope_model_is_refused(tmp_path):
    from lib.checkpoint import build_model
    model = build_model(GPTConfig(block_size=N, n_layer=1, n_head=2, n_embd=16, ffn_hidden=32, vocab_size=1), "linear")
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": {"task": "linear"},
                     "iter_num": 0, "best_val_loss": float("nan"), "run_info": run_info(0)}, str(tmp_path / "t.pt"))
    msg = one_error_line(["--ckpt", str(tmp_path / "t.pt")])  # was load_state_dict's size-mismatch dump
    assert "is a run of task 'linear' (eval_tasks.py evaluates it), not a language model" in msg, msg
    nope = write_ckpt(tmp_path / "nope.pt", pos="nope")
    assert "--rope_theta 500: this model has no RoPE (pos='nope')" in one_error_line(["--ckpt", nope, "--rope_theta",
                                                                                      "500"])


def test_a_dataset_naming_an_imported_tokenizer_without_its_tokenizer_json_is_one_error_line(ckpt, tmp_path):
    # FileNotFoundError's traceback
    (tmp_path / "meta.json").write_text('{"tokenizer": "hf", "vocab_size": 8, "eot_token": 7}')
    msg = one_error_line(["--ckpt", ckpt, "--data", str(tmp_path)])
    assert f"{tmp_path / 'meta.json'} names tokenizer 'hf', but no tokenizer.json is beside it; re-prepare" in msg
