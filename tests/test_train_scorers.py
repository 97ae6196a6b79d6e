"""Scorers through train.py: init_from a softmax checkpoint with scorer=ssmax sets s0 and keeps every other weight;
init_from trains at the checkpoint's block_size unless the command sets one; a resume that switches the scorer (the
SSMax paper's variant f) trains on the batches an unswitched resume draws, keeps the shared weights' AdamW state and
starts s fresh; one that changes θ or block_size is evaluated first into its own best.pt (dropout: not), and on a
finished run is refused; sigmoid attention trains. Tiny models on tiny random data, CPU only."""
import math
import os

import numpy as np
import pytest
import torch

import train
from model import ssmax_s_for_switch
import test_train
from test_train import error_of, read_log, step_losses, tiny_args

data_dir = test_train.data_dir  # its fixture: random ids
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: tiny models, one thread


# ----------------------------------------------------------------------------------------------------------------
# softmax -> SSMax switch


def test_init_from_softmax_checkpoint_with_scorer_ssmax_sets_s0_and_keeps_every_other_weight(data_dir, tmp_path):
    src, dst = tmp_path / "softmax", tmp_path / "ssmax"
    train.main(tiny_args(data_dir, src, "max_iters=2", "eval_interval=2"))
    train.main(tiny_args(data_dir, dst, f"init_from={src / 'ckpt.pt'}", "scorer=ssmax", "max_iters=0"))
    a = torch.load(src / "ckpt.pt", map_location="cpu", weights_only=True)
    b = torch.load(dst / "ckpt.pt", map_location="cpu", weights_only=True)
    s0 = ssmax_s_for_switch(16)
    assert s0 == pytest.approx(1 / np.mean(np.log(np.arange(1, 17))), rel=1e-12)
    assert a["model_args"]["scorer"] == "softmax" and b["iter_num"] == 0
    assert b["model_args"] == {**a["model_args"], "scorer": "ssmax", "ssmax_s_init": s0}
    assert b["config"]["scorer"] == "ssmax" and b["config"]["ssmax_s_init"] == s0
    added = set(b["model"]) - set(a["model"])
    assert added == {"transformer.h.0.attn.ssmax_s"} and set(a["model"]) <= set(b["model"])
    assert torch.equal(b["model"]["transformer.h.0.attn.ssmax_s"], torch.full((2,), s0))
    assert all(torch.equal(v, b["model"][k]) for k, v in a["model"].items())
    assert [r["iter"] for r in read_log(dst) if "val_loss" in r] == [0]  # converted, evaluated, saved
    assert not step_losses(dst)
    # an explicit s0 wins, and the switched model trains on
    train.main(tiny_args(data_dir, tmp_path / "s05", f"init_from={src / 'ckpt.pt'}", "scorer=ssmax",
                         "ssmax_s_init=0.5", "max_iters=1", "eval_interval=1"))
    c = torch.load(tmp_path / "s05" / "ckpt.pt", map_location="cpu", weights_only=True)
    assert c["model_args"]["ssmax_s_init"] == 0.5 and c["iter_num"] == 1


def test_init_from_a_checkpoint_trains_at_its_block_size_unless_the_command_sets_one(data_dir, tmp_path, capsys):
    src = tmp_path / "src"
    train.main(tiny_args(data_dir, src, "max_iters=1", "eval_interval=1"))
    no_length = [a for a in tiny_args(data_dir, tmp_path / "a", "max_iters=1", "eval_interval=1")
                 if not a.startswith("block_size=")]
    capsys.readouterr()
    train.main([*no_length, f"init_from={src / 'ckpt.pt'}"])  # TrainConfig's default would be 1,024
    assert " 32 tokens per iteration" in capsys.readouterr().out  # batch 2 x 16 tokens, not 2 x 1,024
    a = torch.load(tmp_path / "a" / "ckpt.pt", map_location="cpu", weights_only=True)
    assert a["config"]["block_size"] == a["model_args"]["block_size"] == 16


# ----------------------------------------------------------------------------------------------------------------
# The switch during pretraining (SSMax paper variant f): a resume that changes the scorer


def param_states(ckpt):
    """{parameter name: AdamW state (or None: never stepped)} of a checkpoint, by the model's own parameter order."""
    from model import GPT, GPTConfig
    m = GPT(GPTConfig(**ckpt["model_args"]))
    name = {id(p): n for n, p in m.named_parameters()}
    order = [name[id(p)] for g in m.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu").param_groups
             for p in g["params"]]
    return {n: ckpt["optimizer"]["state"].get(i) for i, n in enumerate(order)}


def branch(src, dst):
    """A copy of src's checkpoint, as a run to resume in dst (the run at the switch)."""
    os.makedirs(dst)
    with open(src / "ckpt.pt", "rb") as a, open(dst / "ckpt.pt", "wb") as b:
        b.write(a.read())


def test_a_scorer_switching_resume_trains_on_the_batches_an_unswitched_resume_draws(data_dir, tmp_path, monkeypatch):
    src, plain, switched = tmp_path / "softmax", tmp_path / "plain", tmp_path / "switched"
    seen = {}
    def recording(out):  # the token ids of every training micro-batch (evals run without grad)
        seen[out] = []
        def get_batch(cfg, data, split, ix, device):
            x, y = real(cfg, data, split, ix, device)
            if torch.is_grad_enabled():
                seen[out].append(x.clone())
            return x, y
        monkeypatch.setattr(train, "get_batch", get_batch)
    real = train.get_batch
    recording(src)
    train.main(tiny_args(data_dir, src, "max_iters=2", "eval_interval=2"))
    branch(src, plain)
    branch(src, switched)
    recording(plain)
    train.main(tiny_args(data_dir, plain, "init_from=resume", "max_iters=5"))
    recording(switched)
    train.main(tiny_args(data_dir, switched, "init_from=resume", "max_iters=5", "scorer=ssmax", "overwrite=True"))
    assert len(seen[src]) == 2 and len(seen[plain]) == len(seen[switched]) == 3
    assert all(torch.equal(a, b) for a, b in zip(seen[plain], seen[switched]))  # the same token ids, batch by batch
    assert not any(torch.equal(a, b) for a in seen[src] for b in seen[switched])  # not the first batches again
    log = read_log(switched)
    assert log[0]["start_iter"] == 2 and log[0]["switch"] == {"scorer": ["softmax", "ssmax"],
                                                                "ssmax_s_init": [1.0, ssmax_s_for_switch(16)]}
    assert [r["iter"] for r in log if "val_loss" in r] == [2, 4, 5]  # the switched model is evaluated first
    assert list(step_losses(switched)) == [2, 3, 4]
    assert "switch" not in read_log(plain)[0]
    train.main(tiny_args(data_dir, switched, "init_from=resume", "max_iters=6", "scorer=ssmax"))  # a relaunch
    assert "switch" not in read_log(switched)[-3] and list(step_losses(switched, since_last_start=True)) == [5]


@pytest.mark.parametrize("extra,s", [((), ssmax_s_for_switch(16)), (("ssmax_s_init=0.3", "ssmax_bias=True"), 0.3)],
                         ids=["s0", "given"])
def test_a_scorer_switching_resume_keeps_adamw_state_of_shared_weights_and_starts_s_fresh(data_dir, tmp_path,
                                                                                         extra, s):
    src, dst = tmp_path / "softmax", tmp_path / "ssmax"
    train.main(tiny_args(data_dir, src, "max_iters=3", "eval_interval=3"))
    branch(src, dst)
    train.main(tiny_args(data_dir, dst, "init_from=resume", "max_iters=3", "scorer=ssmax", "overwrite=True", *extra))
    a, b = (torch.load(d / "ckpt.pt", map_location="cpu", weights_only=True) for d in (src, dst))
    assert b["iter_num"] == 3 and b["model_args"]["scorer"] == "ssmax" and b["model_args"]["ssmax_s_init"] == s
    assert torch.equal(b["model"]["transformer.h.0.attn.ssmax_s"], torch.full((2,), s))  # the requested init
    new = {"transformer.h.0.attn.ssmax_s"} | ({"transformer.h.0.attn.ssmax_b"} if extra else set())
    assert set(b["model"]) - set(a["model"]) == new
    old_state, new_state = param_states(a), param_states(b)
    assert set(new_state) - set(old_state) == new and all(new_state[k] is None for k in new)  # fresh
    for k, state in old_state.items():
        assert state is not None and state.keys() == new_state[k].keys() == {"step", "exp_avg", "exp_avg_sq"}
        assert all(torch.equal(v, new_state[k][key]) for key, v in state.items()), k  # step 3 and both moments
    groups = [{k: v for k, v in g.items() if k != "params"} for g in a["optimizer"]["param_groups"]]
    assert groups == [{k: v for k, v in g.items() if k != "params"} for g in b["optimizer"]["param_groups"]]
    train.main(tiny_args(data_dir, dst, "init_from=resume", "max_iters=4", "scorer=ssmax", *extra))  # it trains on
    c = torch.load(dst / "ckpt.pt", map_location="cpu", weights_only=True)
    assert param_states(c)["transformer.h.0.attn.ssmax_s"]["step"] == 1 and c["iter_num"] == 4


# ----------------------------------------------------------------------------------------------------------------
# A resume that changes θ or block_size: its val loss is another quantity, as a switched scorer's is


def worse_when(monkeypatch, changed):
    """estimate_loss, 10 nats worse for a model that changed(cfg): a stand-in for a setting whose val loss is higher,
    so a best.pt judged against the old setting's losses would never take it."""
    real = train.estimate_loss
    monkeypatch.setattr(train, "estimate_loss", lambda cfg, *a: {k: v + 10 * changed(cfg)
                                                                 for k, v in real(cfg, *a).items()})


@pytest.mark.parametrize("change", ["rope_theta=100.0", "block_size=8"])
def test_a_resume_changing_theta_or_block_size_is_evaluated_first_and_starts_its_own_best_pt(data_dir, tmp_path,
                                                                                            monkeypatch, change):
    out = tmp_path / "run"
    train.main(tiny_args(data_dir, out, "max_iters=4", "eval_interval=2"))
    key, value = change.split("=")
    worse_when(monkeypatch, lambda cfg: str(getattr(cfg, key)) == value)
    train.main(tiny_args(data_dir, out, "init_from=resume", "max_iters=6", change, "overwrite=True"))
    log = read_log(out)
    assert [r["iter"] for r in log if "val_loss" in r] == [0, 2, 4, 4, 6]  # evaluated at the resume iteration
    since = [r["val_loss"] for r in log[[i for i, r in enumerate(log) if "start_iter" in r][-1]:] if "val_loss" in r]
    best = torch.load(out / "best.pt", map_location="cpu", weights_only=True)
    assert str(best["model_args"][key]) == value and best["iter_num"] >= 4  # the new setting's best, not the old
    assert best["best_val_loss"] == min(since)


def test_a_resume_changing_only_dropout_keeps_the_old_best_pt(data_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"  # eval runs without dropout: its val loss is the same quantity
    train.main(tiny_args(data_dir, out, "max_iters=4", "eval_interval=2"))
    before = (out / "best.pt").read_bytes()
    worse_when(monkeypatch, lambda cfg: cfg.dropout > 0)
    train.main(tiny_args(data_dir, out, "init_from=resume", "max_iters=6", "dropout=0.1"))
    assert [r["iter"] for r in read_log(out) if "val_loss" in r] == [0, 2, 4, 6]  # no second eval of iter 4
    assert (out / "best.pt").read_bytes() == before  # judged against the old best, which stays


@pytest.mark.parametrize("max_iters", [4, 6])
def test_a_theta_change_on_resume_of_a_finished_run_is_refused_and_keeps_its_files(data_dir, tmp_path, max_iters):
    out = tmp_path / "run"
    train.main(tiny_args(data_dir, out, "max_iters=4", "eval_interval=2"))
    before = {f: (out / f).read_bytes() for f in ("ckpt.pt", "best.pt", "log.jsonl")}
    msg = error_of(tiny_args(data_dir, out, "resume=True", f"max_iters={max_iters}", "rope_theta=100.0"))
    assert "rope_theta=100.0 would change the finished softmax run" in msg and "overwrite=True" in msg, msg
    assert {f: (out / f).read_bytes() for f in before} == before


# ----------------------------------------------------------------------------------------------------------------
# Sigmoid


def test_sigmoid_attention_trains_through_train_py(data_dir, tmp_path):
    # the sixth scorer: rows not normalised, the CPU path (kernels_cpu) under backend=auto; loss falls, no s/b/n
    out = tmp_path / "out"
    train.main(tiny_args(data_dir, out, "max_iters=6", "eval_interval=6", "scorer=sigmoid"))
    ckpt = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)
    losses = step_losses(out)
    assert ckpt["model_args"]["scorer"] == "sigmoid" and ckpt["iter_num"] == 6
    assert all(math.isfinite(v) for v in losses.values()) and losses[5] < losses[0]
    assert not any(k.endswith(("_s", "_b", "_raw")) for k in ckpt["model"])
