"""train.py's optimizer step and evaluation against hand-computed values: the learning rate of each iteration
(linear warmup to learning_rate at warmup_iters, cosine down to min_lr at lr_decay_iters, min_lr after), the lr that
AdamW actually steps with, gradients clipped before the step, gradient accumulation equal to one large batch, and
the eval loss as the mean over eval_iters fixed batches. Tiny models on tiny random data, CPU only."""
import contextlib
import math
import types

import pytest
import torch

import train
import test_train
from test_train import read_log, step_losses, tiny_args

data_dir = test_train.data_dir  # its fixture: random ids
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: tiny models, one thread


def test_lr_warms_up_linearly_reaches_the_peak_at_warmup_iters_and_cosine_ends_at_min_lr():
    cfg = types.SimpleNamespace(learning_rate=1.0, min_lr=0.1, warmup_iters=4, lr_decay_iters=14,
                                lr_schedule="cosine")
    cosine = lambda ratio: 0.1 + 0.5 * (1 + math.cos(math.pi * ratio)) * 0.9
    want = {0: 1 / 5, 3: 4 / 5, 4: 1.0, 6: cosine(0.2), 9: 0.55, 13: cosine(0.9), 14: 0.1, 15: 0.1, 100: 0.1}
    assert {it: train.get_lr(cfg, it) for it in want} == pytest.approx(want, rel=1e-12)
    constant = types.SimpleNamespace(**{**vars(cfg), "lr_schedule": "constant"})
    assert [train.get_lr(constant, it) for it in (3, 4, 14, 100)] == pytest.approx([0.8, 1.0, 1.0, 1.0])


def test_eval_loss_is_the_mean_over_eval_iters_batches_the_same_ones_at_every_eval(monkeypatch):
    seen = []
    monkeypatch.setattr(train, "get_batch", lambda cfg, data, split, ix, device: (ix, split))
    monkeypatch.setattr(train, "batch_loss", lambda cfg, ctx, model, ix, split: seen.append((split, ix.tolist()))
                        or torch.tensor(float(ix.sum())))
    cfg = types.SimpleNamespace(eval_iters=3, batch_size=2, seed=0)
    data = types.SimpleNamespace(size={"train": 1000, "val": 50})
    run = types.SimpleNamespace(ctx=contextlib.nullcontext(), device="cpu")
    model = torch.nn.Linear(1, 1)
    out = train.estimate_loss(cfg, data, run, model)
    assert model.training  # back to training mode
    for split in ("train", "val"):
        batches = [ix for s, ix in seen if s == split]
        assert len(batches) == 3 and all(len(ix) == 2 and max(ix) < data.size[split] for ix in batches)
        assert out[split] == pytest.approx(sum(map(sum, batches)) / 3)
    first = list(seen)
    seen.clear()
    assert train.estimate_loss(cfg, data, run, model) == out and seen == first  # a fixed eval set


def test_adamw_steps_with_the_logged_lr_on_gradients_clipped_to_grad_clip(data_dir, tmp_path, monkeypatch):
    steps, step = [], torch.optim.AdamW.step

    def spy(self, *args, **kw):  # the lr and the gradients' norm that each update uses
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        steps.append(([g["lr"] for g in self.param_groups], torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()))
        return step(self, *args, **kw)
    monkeypatch.setattr(torch.optim.AdamW, "step", spy)
    out = tmp_path / "out"
    train.main(tiny_args(data_dir, out, "max_iters=4", "eval_interval=4", "warmup_iters=3", "grad_clip=1e-3"))
    lrs = [r["lr"] for r in read_log(out) if "loss" in r]
    assert lrs == pytest.approx([1e-2 / 4, 2e-2 / 4, 3e-2 / 4, 1e-2])
    assert [g for g, _ in steps] == [[lr, lr] for lr in lrs]  # both groups: with and without decay
    assert all(norm <= 1e-3 * (1 + 1e-4) for _, norm in steps)  # unclipped: ~1


def test_two_accumulated_micro_batches_step_as_one_batch_of_twice_the_size(data_dir, tmp_path):
    a, b = tmp_path / "accum", tmp_path / "one"
    train.main(tiny_args(data_dir, a, "max_iters=3", "eval_interval=3", "batch_size=2",
                         "gradient_accumulation_steps=2"))
    train.main(tiny_args(data_dir, b, "max_iters=3", "eval_interval=3", "batch_size=4",
                         "gradient_accumulation_steps=1"))
    assert list(step_losses(a).values()) == pytest.approx(list(step_losses(b).values()), rel=1e-5)
    wa, wb = (torch.load(d / "ckpt.pt", map_location="cpu", weights_only=True)["model"] for d in (a, b))
    for k, v in wa.items():
        torch.testing.assert_close(v, wb[k], rtol=1e-3, atol=1e-5)  # Adam: near-zero grads
