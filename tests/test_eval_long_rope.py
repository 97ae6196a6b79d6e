"""eval_long.py's RoPE extension methods: each equals its formula in the model's tables (YaRN's two regimes and its
temperature), and Dynamic NTK per length (LSSAR Table 4: prefix_1x is native RoPE, window k is the model's own loss at
kN tokens); on a model with rope_scaling, YaRN's correction dims from its own frequencies and the effective θ
reported; --logit_scale named in the figures. Tiny models, CPU only."""
import json
import math
import os
from dataclasses import asdict

import numpy as np
import pytest
import torch

import rope
from lib import compare, figures
import eval_long
from lib.checkpoint import load_checkpoint, run_info, save_checkpoint
from model import GPT, GPTConfig
import test_eval_long
from test_eval_long import N, tiny_config

data_dir = test_eval_long.data_dir  # its fixture: real Shakespeare, written directly


@pytest.fixture(scope="module")
def sharp_ckpt(tmp_path_factory):
    """A random GPT whose attention is sharp (q, k and the attention output x 16, logits x 8): a change of RoPE's
    base moves its loss by ~0.1 nat, where the 30-step models (ckpts) barely use positions (~1e-4 nat), so that an
    equality to 1e-4 below tells the right RoPE from a wrong one."""
    torch.manual_seed(0)
    model = GPT(tiny_config())
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight[:2 * model.config.n_embd] *= 16  # the q and k rows
            block.attn.c_proj.weight *= 16
        model.lm_head.weight *= 8
    path = str(tmp_path_factory.mktemp("out-sharp") / "ckpt.pt")
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": {}, "iter_num": 0,
                     "best_val_loss": float("nan"), "run_info": run_info(0)}, path)
    return path


HS, THETA, SCALE = 16, 10000.0, 4.0  # head size of tiny_config; base θ; extension factor
POSITIONS = [0, 1, 7, 100, 159]


def test_dynamic_ntk_per_length_prefix_1x_is_native_rope_and_window_k_runs_at_kN(sharp_ckpt, data_dir, tmp_path):
    """LSSAR Table 4: the loss at kN tokens is that of kN-token sequences, each with Dynamic NTK's factor for kN."""
    common = [sharp_ckpt, "--data", data_dir, "--rope_method", "dynamic_ntk", "--rope_scale", str(SCALE),
              "--num_seqs", "4", "--batch_size", "3", "--seed", "1"]
    eval_long.main(common + ["--out_dir", str(tmp_path / "per")])
    eval_long.main(common + ["--no-ntk_per_length", "--out_dir", str(tmp_path / "one")])
    summary = json.loads((tmp_path / "per" / "summary.json").read_text())
    per, one = summary["models"][0], json.loads((tmp_path / "one" / "summary.json").read_text())["models"][0]
    native = per["native"]["windows"]
    assert per["windows"]["prefix_1x"]["mean_loss"] == pytest.approx(native["prefix_1x"]["mean_loss"], abs=1e-4)
    rows = compare.read_csv(tmp_path / "per" / "per_sequence.csv")
    loss = lambda rope, w: np.array([float(r["loss"]) for r in rows if (r["rope"], r["window"]) == (rope, w)])
    assert len(loss("extended", "prefix_1x")) == 4
    assert np.allclose(loss("extended", "prefix_1x"), loss("native", "prefix_1x"), atol=1e-4, rtol=0)
    # the single pass (--no-ntk_per_length) runs every window with the factor for L: not native at 1x
    factor = lambda k: max(1.0, SCALE * k - (SCALE - 1))
    base = lambda k: THETA * factor(k) ** (HS / (HS - 2))
    assert abs(one["windows"]["prefix_1x"]["mean_loss"] - native["prefix_1x"]["mean_loss"]) > 1e-2
    assert one["windows"]["prefix_1x"]["rope_theta_effective"] == pytest.approx(base(10))
    # window k: the model's own loss on kN-token sequences with the factor for kN, computed here directly
    val = np.fromfile(os.path.join(data_dir, "val.bin"), dtype=np.uint16).astype(np.int64)
    model, _ = load_checkpoint(sharp_ckpt)
    for k in (1, 2, 4, 10):
        model.extend_rope("dynamic_ntk", SCALE, k * N)
        xy = torch.from_numpy(np.stack([val[s:s + k * N + 1] for s in summary["sequences"]["starts"]]))
        with torch.no_grad():
            _, want = model.eval()(xy[:, :-1], xy[:, 1:])
        assert per["windows"][f"prefix_{k}x"]["mean_loss"] == pytest.approx(want.item(), abs=1e-4)
        assert per["windows"][f"prefix_{k}x"]["rope_theta_effective"] == pytest.approx(base(k))
        assert native[f"prefix_{k}x"]["rope_theta_effective"] == pytest.approx(THETA)
    assert [float(r["theta"]) for r in rows if (r["rope"], r["window"]) == ("extended", "4x")] == pytest.approx(
        [base(4)] * 4)


def expected_inv_freq(method, train_len, L):
    """The papers' formulas, written out independently of model.py."""
    i = np.arange(HS // 2)
    base = THETA ** (-2 * i / HS)
    if method == "theta":
        return (THETA * SCALE) ** (-2 * i / HS)
    if method == "pi":  # angle = (pos / s) * θ^(-2i/d)
        return base / SCALE
    if method == "ntk":
        return (THETA * SCALE ** (HS / (HS - 2))) ** (-2 * i / HS)
    if method == "dynamic_ntk":
        factor = max(1.0, SCALE * L / train_len - (SCALE - 1))
        return (THETA * factor ** (HS / (HS - 2))) ** (-2 * i / HS)
    return base


@pytest.mark.parametrize("method,train_len,L", [("none", N, 160), ("theta", N, 160), ("pi", N, 160),
                                                ("ntk", N, 160), ("dynamic_ntk", N, 160), ("dynamic_ntk", N, N),
                                                ("dynamic_ntk", N, 12)])
def test_extension_method_tables_equal_the_formula(method, train_len, L):
    model = GPT(tiny_config(block_size=train_len))
    model.extend_rope(method, SCALE, L)
    inv = expected_inv_freq(method, train_len, L)
    if method == "dynamic_ntk" and L <= train_len:  # no change up to the training length
        assert np.allclose(inv, THETA ** (-np.arange(HS // 2) * 2 / HS))
    pos = [p for p in POSITIONS if p < model.rope_cos.size(0)]
    angles = np.outer(pos, inv)
    assert np.allclose(model.rope_cos[pos].numpy(), np.cos(angles), atol=2e-6)
    assert np.allclose(model.rope_sin[pos].numpy(), np.sin(angles), atol=2e-6)


def test_yarn_keeps_fast_dims_interpolates_slow_ones_and_scales_by_mscale():
    train_len, L = 1024, 4096  # long enough that both regimes occur among the 8 frequencies of HS = 16
    model = GPT(tiny_config(block_size=train_len))
    info = model.extend_rope("yarn", SCALE, L)
    mscale = 0.1 * math.log(SCALE) + 1
    assert info["mscale"] == pytest.approx(mscale) and info["rope_theta_effective"] is None
    base = THETA ** (-2 * np.arange(HS // 2) / HS)
    rotations = train_len * base / (2 * math.pi)  # turns of each frequency within the training length
    fast, slow = rotations > 32, rotations < 1  # YaRN's beta_fast = 32, beta_slow = 1
    assert fast.any() and slow.any()
    assert np.allclose(model.rope_cos[0].numpy(), mscale, atol=1e-6)  # cos(0) = 1, times the temperature
    # every frequency as seen by the table at position 1 (angles < pi, so atan2 recovers them)
    inv = np.arctan2(model.rope_sin[1].double().numpy(), model.rope_cos[1].double().numpy())
    assert np.allclose(inv[fast], base[fast], rtol=1e-5) and np.allclose(inv[slow], base[slow] / SCALE, rtol=1e-5)
    mid = ~fast & ~slow  # the ramp: between extrapolation and interpolation
    assert ((inv[mid] < base[mid]) & (inv[mid] > base[mid] / SCALE)).all()
    want = np.where(fast, base, base / SCALE)
    for p in [7, 1000, 4095]:  # and the whole table follows those frequencies
        got_cos, got_sin = model.rope_cos[p].double().numpy(), model.rope_sin[p].double().numpy()
        assert np.allclose(got_cos[fast | slow], mscale * np.cos(p * want[fast | slow]), atol=1e-5)
        assert np.allclose(got_sin[fast | slow], mscale * np.sin(p * want[fast | slow]), atol=1e-5)


# Llama 3's scaling with its three bands among HS = 16 frequencies at θ 10,000 (3 kept, 1 blended, 4 / factor),
# the fastest two kept at θ x SCALE too; and linear scaling
SCALINGS = {"llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 256}, "linear": {"rope_type": "linear", "factor": 4.0}}


def scaled_model(kind, block_size):
    return GPT(GPTConfig(**{**asdict(tiny_config(block_size=block_size)), "rope_scaling": SCALINGS[kind]}))


@pytest.mark.parametrize("d,theta,train_len", [(16, 1e4, 1024), (64, 5e5, 131072), (128, 1e4, 64), (4, 10.0, 32)])
def test_yarn_correction_dim_by_log_turns_is_the_closed_form_on_plain_rope(d, theta, train_len):
    inv = rope.rope_inv_freq(d, theta)
    for rotations in (32, 1, 1e-3, 1e6):  # inside the dims and beyond either end
        closed = d * math.log(train_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))
        assert rope.correction_dim(inv, train_len, rotations) == pytest.approx(closed, rel=0, abs=1e-12)


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_yarn_on_a_scaled_model_ramps_where_its_own_frequencies_turn_32_and_1_times(kind):
    train_len, L = 1024, 4096
    model = scaled_model(kind, train_len)
    model.extend_rope("yarn", SCALE, L)
    base = rope.rope_inv_freq(HS, THETA, SCALINGS[kind]).numpy()  # the model's own, scaled frequencies
    rotations = train_len * base / (2 * math.pi)
    fast, slow = rotations > 32, rotations < 1
    mid = ~fast & ~slow
    assert fast.any() and slow.any() and mid.any()
    inv = np.arctan2(model.rope_sin[1].double().numpy(), model.rope_cos[1].double().numpy())
    assert np.allclose(inv[fast], base[fast], rtol=1e-5) and np.allclose(inv[slow], base[slow] / SCALE, rtol=1e-5)
    assert ((inv[mid] <= base[mid] * (1 + 1e-6)) & (inv[mid] >= base[mid] / SCALE * (1 - 1e-6))).all()


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_extend_rope_reports_a_scaled_models_effective_theta_under_its_own_scaling(kind):
    model = scaled_model(kind, N)
    want = {"none": THETA, "theta": THETA * SCALE, "ntk": THETA * SCALE ** (HS / (HS - 2)), "pi": None, "yarn": None}
    for method, theta_eff in want.items():
        got = model.extend_rope(method, SCALE, 10 * N)["rope_theta_effective"]
        assert got == (None if theta_eff is None else pytest.approx(theta_eff, rel=1e-9)), method
        if got is not None:  # the θ that, with the model's scaling, gives the tables it runs with
            assert torch.allclose(rope.rope_inv_freq(HS, got, SCALINGS[kind]), model.rope_inv_freq, rtol=1e-9)


def test_eval_long_names_the_logit_scale_in_its_figure(sharp_ckpt, data_dir, tmp_path, monkeypatch):
    titles = []
    monkeypatch.setattr(figures, "plot_per_position", lambda *a: titles.append(a[-1]))
    eval_long.main([sharp_ckpt, "--data", data_dir, "--rope_method", "none", "--num_seqs", "2", "--logit_scale",
                    "qwen", "--out_dir", str(tmp_path / "q")])
    assert titles and all("logits qwen" in t for t in titles)


def test_rope_turns_each_pair_by_position_times_theta_to_the_minus_2i_over_d_counterclockwise():
    # Su et al.: pair i of x (x[i], x[i + d/2] in the rotate_half layout) times e^{i p θ^(-2i/d)} as a complex number
    d, theta, p = 8, 100.0, 5
    inv = theta ** (-2 * np.arange(d // 2) / d)
    assert np.allclose(rope.rope_inv_freq(d, theta).numpy(), inv, rtol=1e-12)
    cos, sin = rope.precompute_rope(p + 1, d, theta)
    x = torch.randn(1, 1, 1, d, dtype=torch.float64)
    z = (x[..., :d // 2] + 1j * x[..., d // 2:]).numpy() * np.exp(1j * p * inv)
    got = rope.apply_rope(x, cos[p:p + 1], sin[p:p + 1]).numpy()
    assert np.allclose(got, np.concatenate([z.real, z.imag], -1), atol=1e-6)


def test_yarn_ramp_runs_from_the_floor_of_the_32_turn_dim_to_the_ceil_of_the_1_turn_dim():
    # d = 16, θ = 1e4, 1024 tokens: dims 1.41 and 4.42 (d ln(N / (2π r)) / (2 ln θ)) -> ramp (i - 1) / (5 - 1)
    inv, _ = rope.rope_extension("yarn", HS, THETA, SCALE, 1024, 4096)
    base, ramp = THETA ** (-2 * np.arange(HS // 2) / HS), np.clip((np.arange(HS // 2) - 1) / 4, 0, 1)
    assert np.allclose(inv.numpy(), base / SCALE * ramp + base * (1 - ramp), rtol=1e-12)


@pytest.mark.parametrize("method", ["ntk", "dynamic_ntk"])
def test_ntk_on_a_head_size_of_two_is_one_value_error_naming_the_head_size(method):
    with pytest.raises(ValueError, match=f"--rope_method {method} .* head size d = 2: it needs d >= 4"):
        rope.rope_extension(method, 2, 1e4, 4.0, 16, 64)  # not a ZeroDivisionError traceback
