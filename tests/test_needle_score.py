"""needle.py's needle score: it equals the reference attention weights of the span, its best head, mean head and
baselines on hand-computed weights (uniform = span tokens / keys; a control span as long, off the needle and the
question, seeded per trial and drawn without moving the prompts), the best head and Fig. 7's ranking of a model with
more layers than heads, Fig. 7's needle at --depth. Tiny models and real English, CPU only."""
import numpy as np
import pytest
import torch

import needle
import test_needle
from lib import retrieval
from model import apply_rope, attention_weights
from test_needle import tiny_model

# test_needle's module fixtures, bound here by name for pytest (a `from` import of a fixture reads as unused)
enc, data_dir = test_needle.enc, test_needle.data_dir


@pytest.mark.parametrize("scorer", ["softmax", "ssmax", "lssar"])
def test_needle_score_equals_reference_attention_weights(enc, data_dir, scorer):
    model, hay, L = tiny_model(scorer), retrieval.load_hay(data_dir, "val"), 96  # beyond block_size 64
    model.extend_rope("theta", 50, L)
    trials = [retrieval.needle_trial(enc, hay[s:s + L], L, d, c, 8106422)
              for s, d, c in [(0, 30, "Tokyo"), (500, 80, "Lima")]]
    idx = torch.tensor(np.stack([t["ids"] for t in trials]))
    w = needle.last_row_weights(model, idx)  # (n_layer, B, n_head, T)
    scores = retrieval.needle_scores(w, [t["span"] for t in trials])  # (B, n_layer, n_head)
    # reference: each layer's q, k from a hook on a plain forward of the full sequence, full T x T weights
    qkv = []
    hooks = [b.attn.c_attn.register_forward_hook(lambda m, i, o: qkv.append(o)) for b in model.transformer.h]
    with torch.no_grad():
        model(idx)
    for h in hooks:
        h.remove()
    B, T, C = idx.size(0), L, model.config.n_embd
    for layer, block in enumerate(model.transformer.h):
        q, k, _ = (x.view(B, T, 2, C // 2).transpose(1, 2) for x in qkv[layer].split(C, dim=2))
        cos, sin = model.rope_cos[:T], model.rope_sin[:T]
        P = attention_weights(apply_rope(q, cos, sin), apply_rope(k, cos, sin), scorer, p=model.config.p,
                              **block.attn.scorer_params())  # (B, nh, T, T)
        for b, t in enumerate(trials):
            a, e = t["span"]
            torch.testing.assert_close(scores[b, layer], P[b, :, -1, a:e].sum(-1), atol=1e-5, rtol=0)
    uniform = torch.tensor([(e - a) / T for a, e in (t["span"] for t in trials)]).view(B, 1, 1)
    assert (scores - uniform).abs().max() > 1e-2  # far from uniform attention: the comparison means something


def test_needle_score_on_crafted_weights_best_and_mean_head_control_and_uniform():
    """Hand-computed: 2 layers x 2 heads, T = 10 keys. Prompt 0: needle span [6, 8), control [2, 4)."""
    T = 10
    w = torch.zeros(2, 2, 2, T)  # (n_layer, B, n_head, T)
    w[0, 0, 0] = 1 / T  # uniform: 0.2 on either 2-token span
    w[0, 0, 1, 6] = 1.0  # all on the needle's first token: the best head
    w[1, 0, 0, [0, 3, 7]] = torch.tensor([0.5, 0.25, 0.25])  # 0.25 on either span
    w[1, 0, 1, 9] = 1.0  # on neither
    w[:, 1] = 1 / T  # prompt 1: every head uniform, needle [3, 6), control [7, 10)
    s0, s1 = retrieval.score_trials(w, [(6, 8), (3, 6)], [(2, 4), (7, 10)])
    assert (s0["top_layer"], s0["top_head"], s0["span_tokens"], s0["keys"]) == (0, 1, 2, T)
    assert s0["top_score"] == pytest.approx(1.0) and s0["mean_score"] == pytest.approx((0.2 + 1 + 0.25 + 0) / 4)
    assert s0["control_top_score"] == pytest.approx(0.25) and s0["control_mean_score"] == pytest.approx(0.45 / 4)
    assert s0["uniform"] == pytest.approx(2 / T) and s0["top_score"] >= s0["mean_score"]
    assert (s0["span_start"], s0["control_start"]) == (6, 2)
    torch.testing.assert_close(s0["heads"], torch.tensor([[0.2, 1.0], [0.25, 0.0]]))
    # uniform attention scores exactly the uniform baseline, at the best head and the mean head, on either span
    for k in ("top_score", "mean_score", "control_top_score", "control_mean_score", "uniform"):
        assert s1[k] == pytest.approx(3 / T), k


@pytest.mark.parametrize("depth", [0, 50, 100])
def test_control_span_is_as_long_as_the_needle_span_disjoint_and_seeded(enc, data_dir, depth):
    hay, L = retrieval.load_hay(data_dir, "val"), 128
    for s in range(8):
        t = retrieval.needle_in_window(enc, hay, L, depth, "Tokyo", 8106422, np.random.default_rng(s))
        (a, e), (c, f) = t["span"], retrieval.control_span(t, np.random.default_rng(s))
        assert f - c == e - a and 1 <= c  # token 0, an attention sink, is never the control
        assert f <= t["pos"] or c >= e  # off the whole needle sentence [pos, e), not only the number
        assert f <= t["question"] == L - len(enc.encode(retrieval.NEEDLE_QUESTION.format(city="Tokyo")))
        assert (c, f) == retrieval.control_span(t, np.random.default_rng(s))  # the seed decides it


def test_score_prompts_carry_a_seeded_control_span_each(enc, data_dir):
    class Args:
        mode, depth, trials, seed = "score", 50, 4, 7
    hay = retrieval.load_hay(data_dir, "val")
    first, again = (list(retrieval.trials(Args, enc, hay, 128, np.random.default_rng([7, 128]))) for _ in range(2))
    assert [t["control"] for t in first] == [t["control"] for t in again]
    assert all(t["control"][1] - t["control"][0] == t["span"][1] - t["span"][0] for t in first)
    assert len({t["control"] for t in first}) > 1  # drawn per trial, not one fixed place


def test_control_span_draws_every_haystack_stretch_beside_the_needle_but_token_0():
    # needle sentence [3, 7) with its number [5, 7), question from 10: 2-token stretches start at 1, 7 or 8
    t = dict(context=12, pos=3, span=(5, 7), question=10)
    assert {retrieval.control_span(t, np.random.default_rng(s))[0] for s in range(60)} == {1, 7, 8}


def test_the_best_head_and_the_head_ranking_read_layer_and_head_of_a_model_with_more_layers_than_heads():
    w = torch.zeros(3, 1, 2, 4)  # (n_layer, B, n_head, T): 3 layers x 2 heads, so layer = index // 2, head = index % 2
    for (layer, head), score in {(2, 1): 0.9, (0, 1): 0.6, (1, 0): 0.3}.items():
        w[layer, 0, head, 2] = score
    s, = retrieval.score_trials(w, [(2, 3)], [(1, 2)])
    assert (s["top_layer"], s["top_head"], s["top_score"]) == (2, 1, pytest.approx(0.9))
    ranked = retrieval.ranked_heads([dict(model="m", heads=s["heads"])])
    assert [(h["rank"], h["layer"], h["head"]) for h in ranked[:3]] == [(1, 2, 1), (2, 0, 1), (3, 1, 0)]
    assert [h["rank"] for h in ranked] == list(range(1, 7)) and ranked[0]["score"] == pytest.approx(0.9)


def test_score_prompts_start_with_fig7_at_the_asked_depth_and_their_controls_leave_the_prompts_unchanged(
        enc, data_dir, monkeypatch):
    class Args:
        mode, depth, trials, seed = "score", 20, 4, 7
    hay = retrieval.load_hay(data_dir, "val")
    draw = lambda: list(retrieval.trials(Args, enc, hay, 128, np.random.default_rng([7, 128])))
    got = draw()
    assert [t["trial"] for t in got] == list(range(5))
    assert (got[0]["depth"], got[0]["city"], got[0]["number"]) == (20, "Tokyo", 8106422)
    assert abs(got[0]["actual_depth"] - 20) <= 100 * retrieval.DEPTH_TOLERANCE
    # each control from its own seed (seed, context, trial): recomputable from the JSON's args, whatever came before
    assert all(t["control"] == retrieval.control_span(t, np.random.default_rng([7, 128, t["trial"]])) for t in got)
    monkeypatch.setattr(retrieval, "control_span", lambda t, rng: (1, 2))  # draws nothing
    assert all(np.array_equal(a["ids"], b["ids"]) for a, b in zip(got, draw()))
