"""A checkpoint or an out_dir used again by train.py: init_from and resume build the task's own model (RealGPT for
reals) and refuse another task or vocabulary, a scorer's new init refused where the checkpoint's weight would load
over it, a kill during a switched resume's first eval finished by the next resume, a config file's overwrite=True
that names no out_dir, --compare of a run with no training steps. Tiny models on tiny random data, CPU only."""
import os

import pytest
import torch

import train
from conftest import one_line_error
import test_train
from test_train import VOCAB

data_dir = test_train.data_dir  # its fixture: random ids
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: tiny models, one thread

BASE = ["device=cpu", "n_layer=1", "n_head=2", "n_embd=32", "ffn_hidden=64", "block_size=16", "batch_size=2",
        "gradient_accumulation_steps=1", "eval_iters=1", "log_interval=1", "warmup_iters=1"]


def lm(data_dir, out, *extra):  # a language model on the random data
    return [*BASE, f"vocab_size={VOCAB}", f"data_dir={data_dir}", "dataset=rand", f"out_dir={out}", *extra]


def task(name, out, *extra):
    return [*BASE, f"task={name}", f"out_dir={out}", *extra]


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def evals(out):
    return [r for r in train.tracking.read_log(os.path.join(out, "log.jsonl")) if "val_loss" in r]


# ----------------------------------------------------------------------------------------------------------------
# The checkpoint's own task, model and weights


def test_a_real_valued_task_run_switches_scorer_or_dropout_from_its_checkpoint_keeping_the_linear_embedding(tmp_path):
    src = tmp_path / "linear"
    train.main(task("linear", src, "max_iters=2", "eval_interval=2"))
    wte = load(src / "ckpt.pt")["model"]["transformer.wte.weight"]
    assert wte.shape == (32, 3)  # RealGPT: x W from (x, y, is an x)
    for out, extra in (("ssmax", ["scorer=ssmax"]), ("dropout", ["dropout=0.1"])):  # init_from: a new run
        train.main(task("linear", tmp_path / out, f"init_from={src / 'ckpt.pt'}", "max_iters=0", *extra))
        b = load(tmp_path / out / "ckpt.pt")
        assert torch.equal(b["model"]["transformer.wte.weight"], wte), out
    assert load(tmp_path / "ssmax" / "ckpt.pt")["model_args"]["scorer"] == "ssmax"
    assert load(tmp_path / "dropout" / "ckpt.pt")["model_args"]["dropout"] == 0.1
    train.main(task("linear", src, "init_from=resume", "scorer=ssmax", "max_iters=3", "overwrite=True"))
    c = load(src / "ckpt.pt")  # resumed with the switched scorer, one step on
    assert c["iter_num"] == 3 and c["model_args"]["scorer"] == "ssmax" and "transformer.h.0.attn.ssmax_s" in c["model"]


def test_init_from_a_checkpoint_of_another_task_or_vocabulary_is_one_error_line(data_dir, tmp_path):
    first, recall, plain = tmp_path / "first", tmp_path / "recall", tmp_path / "lm"
    train.main(task("first", first, "max_iters=0"))
    msg = one_line_error(train.main, task("recall", tmp_path / "a", f"init_from={first / 'ckpt.pt'}", "max_iters=1"))
    assert "task='recall' differs from the checkpoint's 'first'" in msg and "task='first'" in msg
    train.main(task("recall", recall, "task_keys=16", "max_iters=0"))  # recall's vocabulary grows with its keys
    msg = one_line_error(train.main, task("recall", tmp_path / "b", f"init_from={recall / 'ckpt.pt'}", "task_keys=8",
                                          "max_iters=1"))
    want = load(recall / "ckpt.pt")["model_args"]["vocab_size"]
    assert "task 'recall' with these fields has a vocabulary of" in msg and f"the checkpoint's model {want}" in msg
    train.main(lm(data_dir, plain, "max_iters=0"))
    msg = one_line_error(train.main, task("first", tmp_path / "c", f"init_from={plain / 'ckpt.pt'}"))
    assert "task='first' differs from the checkpoint's ''" in msg
    assert not any((tmp_path / d).exists() for d in "abc")  # refused before anything was written


def test_a_new_init_of_a_weight_the_checkpoint_holds_is_refused_and_a_new_weight_takes_its_init(data_dir, tmp_path):
    for scorer, option in (("ssmax", "ssmax_s_init=0.5"), ("ssa", "ssa_b_init=2.0"), ("fox", "fgate_bias_init=4.0")):
        src = tmp_path / scorer
        train.main(lm(data_dir, src, f"scorer={scorer}", "max_iters=0"))
        msg = one_line_error(train.main, lm(data_dir, tmp_path / f"{scorer}-new", f"init_from={src / 'ckpt.pt'}",
                                            option, "max_iters=0"))
        assert f"{option.split('=')[0]}={float(option.split('=')[1])!r} differs from the checkpoint's" in msg
        assert "a new init would not apply" in msg, msg
        msg = one_line_error(train.main, lm(data_dir, src, "init_from=resume", option, "max_iters=1"))
        assert "cannot change when resuming with the same scorer" in msg, msg
    # ssmax's b is not in the checkpoint: it is added at its init, s keeps its trained value
    train.main(lm(data_dir, tmp_path / "b", f"init_from={tmp_path / 'ssmax' / 'ckpt.pt'}", "ssmax_bias=True",
                  "ssmax_b_init=0.5", "max_iters=0"))
    a, b = load(tmp_path / "ssmax" / "ckpt.pt"), load(tmp_path / "b" / "ckpt.pt")
    assert torch.equal(b["model"]["transformer.h.0.attn.ssmax_b"], torch.full((2,), 0.5))
    assert torch.equal(b["model"]["transformer.h.0.attn.ssmax_s"], a["model"]["transformer.h.0.attn.ssmax_s"])


def test_a_switch_to_fox_adds_its_forget_gate_at_its_init_and_a_switch_from_fox_drops_it(data_dir, tmp_path):
    src, fox, back = tmp_path / "softmax", tmp_path / "fox", tmp_path / "back"
    train.main(lm(data_dir, src, "max_iters=1", "eval_interval=1"))
    train.main(lm(data_dir, src, "init_from=resume", "scorer=fox", "fgate_bias_init=2.0", "max_iters=2",
                  "overwrite=True"))  # a resume: AdamW's state remapped, the gate's fresh
    a = load(src / "ckpt.pt")
    assert a["iter_num"] == 2 and a["model_args"]["scorer"] == "fox" and "transformer.h.0.attn.fgate.bias" in a["model"]
    assert [r["switch"] for r in train.tracking.read_log(src / "log.jsonl") if "switch" in r] == [
        {"scorer": ["softmax", "fox"], "fgate_bias_init": [0.0, 2.0]}]
    train.main(lm(data_dir, fox, "init_from=" + str(src / "ckpt.pt"), "max_iters=0"))  # fox's own init kept
    train.main(lm(data_dir, back, "init_from=" + str(fox / "ckpt.pt"), "scorer=softmax", "max_iters=0"))
    b = load(back / "ckpt.pt")
    assert b["model_args"]["fgate_bias_init"] == 0.0 and not any("fgate" in k for k in b["model"])


def test_init_from_records_and_prints_every_model_field_it_changes_not_only_the_scorers(data_dir, tmp_path, capsys):
    src, dst = tmp_path / "softmax", tmp_path / "theta"
    train.main(lm(data_dir, src, "max_iters=0"))
    capsys.readouterr()
    train.main(lm(data_dir, dst, f"init_from={src / 'ckpt.pt'}", "rope_theta=40000.0", "dropout=0.1", "max_iters=0"))
    want = {"rope_theta": [10000.0, 40000.0], "dropout": [0.0, 0.1]}  # the weights were trained at the old values
    assert train.tracking.read_log(dst / "log.jsonl")[0]["switch"] == want
    assert "changed from the checkpoint at iter 0: dropout 0.0 -> 0.1, rope_theta 10000.0 -> 40000.0" in (
        capsys.readouterr().out)
    # a resume as trained, on another backend (the same attention): nothing changed
    train.main(lm(data_dir, dst, "init_from=resume", "max_iters=1", "backend=torch"))
    starts = [r for r in train.tracking.read_log(dst / "log.jsonl") if "start_iter" in r]
    assert len(starts) == 2 and "switch" not in starts[1] and "changed from" not in capsys.readouterr().out


def test_a_checkpoint_carries_what_its_weights_trained_with_across_resumes_and_a_chain_of_init_from(data_dir,
                                                                                                     tmp_path):
    src, a, b = tmp_path / "softmax", tmp_path / "th40k", tmp_path / "th160k"
    train.main(lm(data_dir, src, "max_iters=0"))
    assert load(src / "ckpt.pt")["changed"] == {}  # trained as it builds
    train.main(lm(data_dir, a, f"init_from={src / 'ckpt.pt'}", "rope_theta=40000.0", "max_iters=0"))
    assert load(a / "ckpt.pt")["changed"] == {"rope_theta": [10000.0, 40000.0]}
    train.main(lm(data_dir, a, "init_from=resume", "max_iters=1"))  # nothing changes now: the record is kept
    assert [load(a / f)["changed"] for f in ("ckpt.pt", "best.pt")] == [{"rope_theta": [10000.0, 40000.0]}] * 2
    train.main(lm(data_dir, b, f"init_from={a / 'ckpt.pt'}", "rope_theta=160000.0", "dropout=0.1", "max_iters=0"))
    # the oldest trained value with the newest: not 40,000, which the weights met only in a run already extended
    assert load(b / "ckpt.pt")["changed"] == {"rope_theta": [10000.0, 160000.0], "dropout": [0.0, 0.1]}
    train.main(lm(data_dir, tmp_path / "back", f"init_from={a / 'ckpt.pt'}", "rope_theta=10000.0", "max_iters=0"))
    assert load(tmp_path / "back" / "ckpt.pt")["changed"] == {}  # changed back to the trained θ


# ----------------------------------------------------------------------------------------------------------------
# Resume after a kill, --compare, a config file's overwrite


class _Killed(BaseException):
    """A SIGKILL just after a checkpoint write, simulated in-process."""


def test_a_kill_during_the_first_eval_after_a_resume_switch_is_finished_by_the_next_resume(data_dir, tmp_path,
                                                                                             monkeypatch, capsys):
    out = tmp_path / "out"
    train.main(lm(data_dir, out, "max_iters=3", "eval_interval=3"))
    real = train.save_checkpoint
    def save(state, path):  # killed after the switched model's ckpt.pt, before its best.pt and its log line
        real(state, path)
        if path.endswith("ckpt.pt") and state["model_args"]["scorer"] == "ssmax":
            raise _Killed
    with monkeypatch.context() as m:
        m.setattr(train, "save_checkpoint", save)
        with pytest.raises(_Killed):
            train.main(lm(data_dir, out, "init_from=resume", "scorer=ssmax", "max_iters=5", "eval_interval=3",
                          "overwrite=True"))
    switched = load(out / "ckpt.pt")["eval"]
    assert [r["iter"] for r in evals(out)] == [0, 3]  # the softmax eval of iter 3 only
    train.main(lm(data_dir, out, "init_from=resume", "scorer=ssmax", "max_iters=5", "eval_interval=3"))
    logged = evals(out)
    assert [r["iter"] for r in logged] == [0, 3, 3, 5]  # the switched eval of iter 3 is back
    assert logged[2] == {k: v for k, v in switched.items() if k != "is_best"}
    best = load(out / "best.pt")
    assert best["model_args"]["scorer"] == "ssmax" and best["iter_num"] in (3, 5)  # not the softmax model
    capsys.readouterr()
    train.main(lm(data_dir, out, "init_from=resume", "scorer=ssmax", "max_iters=5", "eval_interval=3"))
    assert "already done" in capsys.readouterr().out and len(evals(out)) == 4  # relaunched: no eval logged twice


def test_compare_draws_a_run_without_training_steps(data_dir, tmp_path, monkeypatch):
    from matplotlib.figure import Figure
    train.main(lm(data_dir, tmp_path / "zero", "max_iters=0"))
    drawn, save = [], Figure.savefig  # the lines on the figure compare writes: a PNG of empty axes is no drawing
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: [drawn.extend(fig.axes[0].get_lines()),
                                                                 save(fig, *a, **k)][1])
    train.main(["--compare", str(tmp_path / "zero"), "--out", str(tmp_path / "c.png")])
    assert (tmp_path / "c.png").stat().st_size > 1000
    assert [(line.get_label().endswith(": val"), list(line.get_xdata())) for line in drawn] == [(True, [0])]


def test_a_config_files_overwrite_covers_no_out_dir_when_the_file_names_none(data_dir, tmp_path):
    out, cfg = tmp_path / "run", tmp_path / "replace.py"
    cfg.write_text("overwrite = True\nmax_iters = 1\n")  # no out_dir of its own
    assert "overwrite" not in train.parse_args([str(cfg)])  # the default out_dir
    assert "overwrite" not in train.parse_args([f"out_dir={out}", str(cfg)])
    assert train.parse_args([str(cfg), "overwrite=True"])["overwrite"] is True  # the command line's covers any
    train.main(lm(data_dir, out, "max_iters=1", "eval_interval=1"))
    before = {f: (out / f).read_bytes() for f in ("ckpt.pt", "best.pt", "log.jsonl")}
    msg = one_line_error(train.main, [*lm(data_dir, out), str(cfg)])
    assert "already holds a run" in msg and {f: (out / f).read_bytes() for f in before} == before


def test_a_fine_tune_keeps_its_imported_sources_record_for_export(data_dir, tmp_path):
    # convert_hf.py export reads the source's BOS from ckpt["hf"]: a fine-tune by train.py had dropped it
    src = tmp_path / "src"
    train.main(lm(data_dir, src, "max_iters=1", "eval_interval=1"))
    ck = load(src / "ckpt.pt")
    hf = {"source": "a/model", "config": {"bos_token_id": 1}, "bos_token": "<s>"}
    imported = tmp_path / "imported.pt"
    torch.save({k: ck[k] for k in ("model", "model_args", "run_info", "codec")} | {"config": {}, "iter_num": 0,
                                                                                    "hf": hf}, imported)
    tuned = tmp_path / "tuned"
    train.main(lm(data_dir, tuned, f"init_from={imported}", "max_iters=2", "eval_interval=1"))
    assert load(tuned / "ckpt.pt")["hf"] == hf and load(tuned / "best.pt")["hf"] == hf
    train.main(lm(data_dir, tuned, "init_from=resume", "max_iters=3", "eval_interval=1"))
    assert load(tuned / "ckpt.pt")["hf"] == hf


def test_a_missing_sft_file_is_named_before_the_cpu_cost_check_counts_the_default_iterations(data_dir, tmp_path):
    # its size sets max_iters: missing, the cost check counted max_iters and asked for allow_slow=True ("356 hours")
    src = tmp_path / "src"
    train.main(lm(data_dir, src, "max_iters=1", "eval_interval=1"))
    msg = one_line_error(train.main, [*BASE, f"out_dir={tmp_path / 'sft'}", f"init_from={src / 'ckpt.pt'}",
                                      f"sft_data={tmp_path / 'missing.jsonl'}", "max_iters=1000000000"])
    assert "missing.jsonl' does not exist" in msg and "hours" not in msg


def test_init_from_with_another_architecture_is_refused_before_the_cpu_cost_check_estimates_it(data_dir, tmp_path):
    # configs/softmax.py's 162M model on a 1-layer checkpoint: the estimate ("1,861 hours ... allow_slow=True") came
    # first, and allow_slow=True then met the refusal
    src = tmp_path / "src"
    train.main(lm(data_dir, src, "max_iters=1", "eval_interval=1"))
    msg = one_line_error(train.main, lm(data_dir, tmp_path / "new", f"init_from={src / 'ckpt.pt'}", "n_layer=12",
                                        "n_embd=768", "max_iters=1000000"))
    assert "n_layer=12 differs from the checkpoint's 1" in msg and "hours" not in msg


def test_a_checkpoint_from_before_a_key_was_recorded_finishes_its_cut_eval(data_dir, tmp_path):
    # best.pt takes BEST_KEYS from the checkpoint's state: one written before "hf" existed raised KeyError
    out = tmp_path / "run"
    train.main(lm(data_dir, out, "max_iters=2", "eval_interval=2"))
    ck = load(out / "ckpt.pt")
    del ck["hf"]
    ck["eval"]["is_best"] = True  # its eval makes best.pt
    torch.save(ck, out / "ckpt.pt")
    lines = (out / "log.jsonl").read_text().splitlines()
    cut = max(i for i, line in enumerate(lines) if '"val_loss"' in line)  # killed before its eval's log line
    (out / "log.jsonl").write_text("\n".join(lines[:cut] + lines[cut + 1:]) + "\n")
    train.main(lm(data_dir, out, "resume=True", "max_iters=4", "eval_interval=2"))
    assert [r["iter"] for r in evals(out)] == [0, 2, 4] and load(out / "best.pt")["hf"] is None
