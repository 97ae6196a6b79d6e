"""eval_long.py without a model: the bootstrap CI on hand cases (no spread, 1/√n shrinkage, chunked resamples, paired
differences) and the SSMax paper's Fig. 1 (attention fading: softmax's max decays, SSMax's stays near 1, each point
equal to softmax of the actual vector), and out-of-range numbers and RoPE options a run would not read refused
before any file is read. CPU only."""
import math

import numpy as np
import pytest
import torch

from lib import compare
import eval_long
from test_eval_long import one_line_error, read_csv


def test_bootstrap_ci_on_hand_cases():
    assert compare.bootstrap_ci([0.25] * 10) == pytest.approx((0.25, 0.25, 0.25))  # no spread, no uncertainty
    rng = np.random.default_rng(1)
    widths = {}
    for n in (100, 400, 1600):
        d = rng.normal(0.1, 1.0, n)
        mean, lo, hi = compare.bootstrap_ci(d)
        assert mean == pytest.approx(d.mean()) and lo < mean < hi
        # close to the normal approximation mean ± 1.96 s / √n, so it shrinks as 1/√n
        assert hi - lo == pytest.approx(2 * 1.96 * d.std(ddof=1) / math.sqrt(n), rel=0.15)
        widths[n] = hi - lo
    assert widths[400] / widths[100] == pytest.approx(0.5, rel=0.2)
    assert widths[1600] / widths[400] == pytest.approx(0.5, rel=0.2)
    assert compare.bootstrap_ci(d, seed=3) == compare.bootstrap_ci(d, seed=3)
    few = compare.RESAMPLE_CELLS  # drawing the resamples in chunks draws the same ones
    compare.RESAMPLE_CELLS = 7 * n
    try:
        assert compare.bootstrap_ci(d, seed=3) == compare.bootstrap_ci(d, seed=3, n_boot=2000)
        chunked = compare.bootstrap_ci(d, seed=3)
    finally:
        compare.RESAMPLE_CELLS = few
    assert chunked == compare.bootstrap_ci(d, seed=3)
    # paired: sequences differ widely in difficulty, model b is a + 0.1 nat on every one of them
    difficulty = rng.normal(5, 2, 50)
    rows = [dict(model=m, rope="native", window="prefix_2x", tokens=32, sequence=j, loss=x + offset)
            for m, offset in (("a", 0.0), ("b", 0.1)) for j, x in enumerate(difficulty)]
    (d,) = compare.paired_differences(rows, "a")
    assert (d["model"], d["baseline"], d["window"], d["k"], d["tokens"], d["baseline_tokens"], d["n_seqs"]) == (
        "b", "a", "prefix_2x", 2, 32, 32, 50)
    assert d["mean_diff"] == pytest.approx(0.1) and d["ci_hi"] - d["ci_lo"] < 1e-9
    _, lo, hi = compare.bootstrap_ci(difficulty)  # unpaired, each model's own mean is uncertain by ~1 nat
    assert hi - lo > 0.5


def test_fading_softmax_max_decays_ssmax_stays_near_one(tmp_path, capsys):
    eval_long.main(["--fading", "--out_dir", str(tmp_path)])
    # the files in --out_dir, not the temporary folder's path, and not files no model wrote
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {tmp_path}: fading.csv, fading_zmax.csv, fading.png"
    assert (tmp_path / "fading.png").stat().st_size > 10_000
    header, table = read_csv(tmp_path / "fading.csv")
    assert header == ["n", "softmax_max", "ssmax_max_s0.43"]
    n, soft, ssmax = table.T
    assert n[-1] == 1e6 and (np.diff(soft) < 0).all()
    assert soft[-1] < 1e-3 and ssmax[-1] > 0.99
    for k in (2, 1000, 100000):  # the closed form equals softmax of the actual vector
        z = torch.full((k,), -2.0, dtype=torch.float64)
        z[-1] = 3.0
        row = table[n == k][0]
        assert row[1] == pytest.approx(torch.softmax(z, 0)[-1].item(), rel=1e-9)
        assert row[2] == pytest.approx(torch.softmax(0.43 * math.log(k) * z, 0)[-1].item(), rel=1e-9)
    header, sweep = read_csv(tmp_path / "fading_zmax.csv")
    assert header[0] == "z_max" and "softmax_n100000" in header
    assert sweep[-1, header.index("softmax_n10")] > 0.99 > sweep[-1, header.index("softmax_n100000")]


@pytest.mark.parametrize("flag,value", [("--rope_scale", "0"), ("--rope_scale", "-1"), ("--rope_scale", "inf"),
                                        ("--rope_scale", "nan"), ("--seed", "-1"), ("--seed", str(2**64)),
                                        ("--num_seqs", "0"), ("--n_boot", "0"), ("--llama4_floor", "0")])
def test_out_of_range_numbers_are_one_error_line(flag, value):
    v = float(value) if flag == "--rope_scale" else int(value)
    assert f"{flag} {v}" in one_line_error(["ckpt.pt", flag, value])  # checked before any file is read


@pytest.mark.parametrize("extra,named", [
    (["--logit_scale", "qwen"], "--logit_scale"),
    (["--llama4_floor", "5"], "--llama4_floor"),
    (["--length", "4096", "--rope_scale", "8"], "--length, --rope_scale"),
    (["--no-ntk_per_length"], "--no-ntk_per_length"),
    (["--rope_method", "yarn", "--num_seqs", "5", "--logx"], "--rope_method, --num_seqs, --logx"),
])
def test_fading_alone_refuses_every_option_only_a_checkpoint_reads(extra, named, tmp_path):
    msg = one_line_error(["--fading", *extra, "--out_dir", str(tmp_path / "f")])  # accepted, then ignored
    assert msg == f"error: {named}: only checkpoints are evaluated with it; give one (--fading alone draws no model)"
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize("argv,unread", [(["--rope_method", "none", "--rope_scale", "4"],
                                          "--rope_scale 4 is not read"),
                                         (["--no-ntk_per_length"], "--no-ntk_per_length is not read"),
                                         (["--rope_method", "yarn", "--ntk_per_length"],
                                          "--ntk_per_length is not read")])
def test_rope_options_a_run_would_not_read_are_refused_only_when_given(argv, unread, tmp_path):
    assert unread in one_line_error(["ckpt.pt", *argv])  # they were recorded in summary.json as if applied
    for read in (["--rope_method", "none"], ["--rope_method", "dynamic_ntk", "--no-ntk_per_length"],
                 ["--rope_method", "none", "--logit_scale", "yarn", "--no-ntk_per_length"]):  # defaults: never refused
        assert "not read" not in one_line_error([str(tmp_path / "missing.pt"), *read, "--out_dir", str(tmp_path)])


def test_eval_long_refuses_a_wandb_project_given_without_wandb(tmp_path):
    # summary.json recorded the project as if the results had been logged to it
    msg = one_line_error(["ckpt.pt", "--wandb_project", "p"])
    assert "--wandb_project p is not read: nothing is logged to it without --wandb" in msg
    for read in (["--wandb_project", "nanoscorer"], ["--wandb", "--wandb_project", "p"]):  # a default, or logged
        assert "not read" not in one_line_error([str(tmp_path / "missing.pt"), *read, "--out_dir", str(tmp_path)])
