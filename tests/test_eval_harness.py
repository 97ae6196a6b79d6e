"""eval_harness.py's wiring, with a stand-in lm-eval (the real one runs in test_hf_scorers.py, 40 s): every option
reaches HFLM and simple_evaluate, results.json records them beside the checkpoint's own record, and bad options,
a checkpoint without a tokenizer or an unknown task are one error line with nothing written. CPU, no transformers."""
import json
import sys
import types
from dataclasses import asdict

import pytest
import torch

import eval_harness
from conftest import one_line_error
from lib import vocab
from lib.checkpoint import save_checkpoint
from model import GPT, GPTConfig


def ckpt(path, codec=True):
    model = GPT(GPTConfig(vocab_size=64, n_layer=1, n_head=2, n_embd=16, ffn_hidden=32, block_size=32))
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": {}, "iter_num": 5,
                     "run_info": {"seed": 3}, "codec": vocab.record(None) if codec else None}, str(path))
    return str(path)


@pytest.fixture
def lm_eval(monkeypatch):
    """A stand-in lm_eval package: records what HFLM and simple_evaluate are given."""
    seen = {}

    class HFLM:
        def __init__(self, **kw):
            seen["hflm"], self.max_length = kw, kw["max_length"] or 32

    class TaskManager:
        def __init__(self, include_path=None):
            self.include_path = include_path

        def match_tasks(self, names):
            return [n for n in names if n != "nosuch"]

    def simple_evaluate(**kw):
        seen["evaluate"] = kw
        return {"results": {"t1": {"acc,none": 0.25}}, "versions": {"t1": 1}, "n-shot": {"t1": kw["num_fewshot"]}}
    mods = {"lm_eval": dict(__version__="0.4.test", simple_evaluate=simple_evaluate),
            "lm_eval.models": {}, "lm_eval.models.huggingface": dict(HFLM=HFLM),
            "lm_eval.tasks": dict(TaskManager=TaskManager),
            "lm_eval.utils": dict(handle_non_serializable=str, make_table=lambda res, col="results": f"| {col} |")}
    for name, attrs in mods.items():
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(__name__=name, **attrs))
    model, tok = object(), object()
    monkeypatch.setattr(eval_harness, "load", lambda *a: seen.setdefault("load", a) and (model, tok))
    return seen, model, tok


def test_every_option_reaches_lm_eval_and_results_json_records_them(lm_eval, tmp_path):
    seen, model, tok = lm_eval
    path = ckpt(tmp_path / "ckpt.pt")
    (tmp_path / "tasks").mkdir()
    eval_harness.main([path, "--tasks", "t1", "--include_path", str(tmp_path / "tasks"), "--limit", "0.5",
                       "--num_fewshot", "2", "--batch_size", "3", "--max_length", "40", "--bootstrap_iters", "7",
                       "--seed", "11", "--device", "cpu", "--out_dir", str(tmp_path / "out")])
    assert seen["load"][0] == path and seen["load"][2:] == (torch.device("cpu"), torch.float32)  # fp32 on CPU
    assert seen["hflm"] == dict(pretrained=model, tokenizer=tok, batch_size=3, max_length=40)
    kw = seen["evaluate"]
    assert (kw["tasks"], kw["num_fewshot"], kw["limit"], kw["bootstrap_iters"]) == (["t1"], 2, 0.5, 7)
    assert kw["task_manager"].include_path == str(tmp_path / "tasks") and kw["log_samples"] is False
    assert {kw[k] for k in ("random_seed", "numpy_random_seed", "torch_random_seed", "fewshot_random_seed")} == {11}
    got = json.load(open(tmp_path / "out" / "results.json"))
    assert got["settings"] == dict(tasks=["t1"], num_fewshot=2, limit=0.5, dtype="float32", max_length=40,
                                   batch_size=3, include_path=str(tmp_path / "tasks"))
    assert got["results"] == {"t1": {"acc,none": 0.25}} and got["n-shot"] == {"t1": 2} and got["iter_num"] == 5
    assert got["lm_eval"] == "0.4.test" and got["train_run_info"] == {"seed": 3} and got["run_info"]["seed"] == 11
    assert got["model_args"]["n_embd"] == 16 and got["checkpoint"] == path
    assert (tmp_path / "out" / "results.md").read_text().endswith("| results |")


def test_bad_options_no_tokenizer_and_an_unknown_task_are_one_error_line_and_defaults_are_recorded(lm_eval, tmp_path):
    path, out = ckpt(tmp_path / "ckpt.pt"), str(tmp_path / "out")
    run = lambda *argv: one_line_error(eval_harness.main, [path, "--tasks", "t1", "--out_dir", out, *argv])
    for argv in (["--batch_size", "0"], ["--max_length", "0"], ["--limit", "0.0"], ["--num_fewshot", "-1"],
                 ["--bootstrap_iters", "-1"], ["--limit", "1.5"]):  # 1.5: lm-eval ran 1 document, 1.5 recorded
        assert f"{argv[0]} {argv[1]}: sizes and --limit must be > 0 (a count past 1 whole), counts >= 0" in run(*argv)
    assert "--include_path 'nowhere' is not a folder" in run("--include_path", "nowhere")
    assert "lm-eval has no task 'nosuch' (a local task's YAML: --include_path)" in one_line_error(
        eval_harness.main, [path, "--tasks", "t1", "nosuch", "--out_dir", out])
    bare = ckpt(tmp_path / "bare.pt", codec=False)
    assert "stores no tokenizer" in one_line_error(eval_harness.main, [bare, "--tasks", "t1", "--out_dir", out])
    task_run = ckpt(tmp_path / "task.pt", codec=False)  # a synthetic task's run: said as such, not "an older one"
    ck = torch.load(task_run, weights_only=True)
    save_checkpoint({**ck, "config": {"task": "recall"}}, task_run)
    assert "is a run of task 'recall' (eval_tasks.py evaluates it), not a language model" in one_line_error(
        eval_harness.main, [task_run, "--tasks", "t1", "--out_dir", out])
    assert not (tmp_path / "out").exists() and "evaluate" not in lm_eval[0]
    eval_harness.main([path, "--tasks", "t1", "--out_dir", out])  # the defaults: HFLM's length (its block_size)
    assert lm_eval[0]["hflm"]["max_length"] is None and lm_eval[0]["hflm"]["batch_size"] == 8
    settings = json.load(open(tmp_path / "out" / "results.json"))["settings"]
    assert settings["max_length"] == 32 and settings["num_fewshot"] is settings["limit"] is None
