"""compile=True (#33) on the CPU: a compiled run's losses equal eager's on the SDPA path (softmax), the CPU fused path
(lssa) and the reference path, its checkpoint has plain parameter names (no `_orig_mod.`), resumes, and loads in
sample.py and eval_long.py; the Triton backend runs outside the compiled graph and says so. Tiny models: the first
compile still takes ~10-30 s each."""
import json
import os

import numpy as np
import pytest
import torch

import eval_long
from lib import vocab
import sample
import train

V = vocab.VOCAB_SIZE  # GPT-2's: sample.py and eval_long.py read only language models
TINY = ["device=cpu", f"vocab_size={V}", "n_layer=1", "n_head=2", "n_embd=32", "ffn_hidden=64", "block_size=16",
        "batch_size=2", "gradient_accumulation_steps=1", "eval_iters=1", "log_interval=1", "warmup_iters=1",
        "learning_rate=1e-2", "dataset=rand"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    os.makedirs(d / "rand")
    rng = np.random.default_rng(0)
    for split, n in (("train", 4096), ("val", 1024)):
        rng.integers(0, V, n).astype(np.uint16).tofile(d / "rand" / f"{split}.bin")
    return str(d)


def losses(out):
    return {r["iter"]: r["loss"] for r in map(json.loads, open(os.path.join(out, "log.jsonl"))) if "loss" in r}


def run(data_dir, out, *extra):
    train.main([*TINY, f"data_dir={data_dir}", f"out_dir={out}", *extra])
    return losses(out)


@pytest.mark.parametrize("scorer,backend", [("softmax", "auto"), ("lssa", "auto"), ("ssmax", "torch")],
                         ids=["sdpa", "cpu-fused", "reference"])
def test_a_compiled_run_trains_with_eager_losses(data_dir, tmp_path, capsys, scorer, backend):
    over = (f"scorer={scorer}", f"backend={backend}", "max_iters=3", "eval_interval=3")
    eager = run(data_dir, tmp_path / "eager", *over)
    compiled = run(data_dir, tmp_path / "compiled", *over, "compile=True")
    assert list(compiled) == [0, 1, 2] and np.allclose(list(compiled.values()), list(eager.values()), rtol=1e-4)
    assert "compile: the first step took" in capsys.readouterr().out


def test_a_compiled_runs_checkpoint_resumes_and_loads_in_sample_and_eval_long(data_dir, tmp_path, capsys):
    out = tmp_path / "c"
    run(data_dir, out, "max_iters=2", "eval_interval=2", "compile=True")
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert not any(k.startswith("_orig_mod.") for k in ckpt["model"])  # the raw model's names: eager loads it
    resumed = run(data_dir, out, "max_iters=3", "eval_interval=3", "compile=True", "resume=True")
    whole = run(data_dir, tmp_path / "whole", "max_iters=3", "eval_interval=3")
    assert np.allclose([resumed[i] for i in range(3)], [whole[i] for i in range(3)], rtol=1e-4)
    sample.main(["--ckpt", str(out / "ckpt.pt"), "--max_new_tokens", "4", "--num_samples", "1", "--device", "cpu"])
    eval_long.main([str(out / "ckpt.pt"), "--data", os.path.join(data_dir, "rand"), "--length", "32",
                    "--num_seqs", "2", "--out_dir", str(tmp_path / "ev")])
    assert (tmp_path / "ev" / "summary.json").is_file()


def test_the_triton_backend_runs_outside_the_compiled_graph_and_says_so(data_dir, tmp_path, capsys):
    over = ("scorer=ssa", "backend=triton", "max_iters=2", "eval_interval=2")
    eager = run(data_dir, tmp_path / "eager", *over)
    compiled = run(data_dir, tmp_path / "compiled", *over, "compile=True")
    assert np.allclose(list(compiled.values()), list(eager.values()), rtol=1e-4)
    assert "Triton attention runs outside the compiled graph" in capsys.readouterr().out
