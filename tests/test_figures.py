"""lib/figures.py and the figures drawn with it: one colour a model however many (matplotlib's "C{i}" gave an 11th
model the first one's colour: FoX and SSMax looked alike in cpu_char's figures), legends beside the axes, each seed
beside a mean over seeds, names told apart, and a committed folder redrawn from its numbers exactly as the evaluation
drew it (results/redraw_figures.py). Drawn without a display; savefig is kept, not written."""
import json
import os
import shutil
import sys
from dataclasses import asdict

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex

import eval_long
from lib import compare, figures, report
from lib.checkpoint import run_info, save_checkpoint
from model import GPT, GPTConfig
from test_tracking_numbers import drawn, write_log

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results"))
import redraw_figures  # noqa: E402

NAMES = [f"m{i}" for i in range(12)]


def line_colors(ax, labels):
    return {line.get_label(): to_hex(line.get_color()) for line in ax.get_lines() if line.get_label() in labels}


def test_twelve_models_get_twelve_colours_in_every_figure(tmp_path, monkeypatch):
    made = drawn(monkeypatch)
    figures.plot_per_position(str(tmp_path / "p.png"), [(n, np.ones(8), i, "-") for i, n in enumerate(NAMES)],
                              [4], 2, False, "t")
    diffs = [dict(model=n, baseline="m0", rope="r", window="1x", k=1, mean_diff=0.1, ci_lo=0.0, ci_hi=0.2)
             for n in NAMES[1:]]
    figures.plot_differences(str(tmp_path / "d.png"), diffs, NAMES, {"r": "rope"}, "t")
    models = [dict(label=n, by_distance={"0.5": dict(ratio=0.5)},
                   by_offset=dict(second=[1.0] * 3, control=[2.0] * 3)) for n in NAMES]
    figures.copy_gate(str(tmp_path / "c.png"), models, dict(span=4, num_seqs=2, kind="text", rope_method="none",
                                                           rope_scale=1.0, logit_scale=None))
    for n in NAMES:
        write_log(tmp_path / "runs" / n, {"iter": 0, "loss": 5.0}, {"iter": 0, "val_loss": 5.0})
    figures.compare_runs([str(tmp_path / "runs" / n) for n in NAMES], out=str(tmp_path / "r.png"))
    per_position, difference, copy, runs = made
    assert len(set(line_colors(per_position.axes[0], NAMES).values())) == 12
    assert len({to_hex(c.lines[0].get_color()) for c in difference.axes[1].containers}) == 11  # the baseline: none
    assert len(set(line_colors(copy.axes[0], NAMES).values())) == 12
    assert len({to_hex(line.get_color()) for line in runs.axes[0].get_lines()}) == 12


def test_train_loss_legend_gives_each_variant_its_own_seed_count(tmp_path, monkeypatch):
    made = drawn(monkeypatch)
    log = [{"iter": i, "loss": 3.0 - i / 100} for i in range(40)]
    logs = {s: {"softmax": log, **({"ssmax": log} if s < 2 else {})} for s in range(3)}  # ssmax: 2 of 3 seeds
    report.loss_curves(logs, str(tmp_path), {"softmax": "softmax", "ssmax": "SSMax"}, 20, 40)
    labels = [t.get_text() for t in made[0].axes[0].get_legend().get_texts()]
    assert labels == ["softmax (3 seeds)", "SSMax (2 seeds)"]  # the title said "mean of 3 seeds" for both
    assert "mean of 3 seeds" not in made[0].axes[0].get_title()


def test_differences_over_seeds_show_each_seed_beside_the_mean_and_legends_sit_beside_the_axes(tmp_path, monkeypatch):
    made = drawn(monkeypatch)
    diffs = [dict(model="ssmax", baseline="softmax", rope="r", window=w, k=k, mean_diff=0.1, ci_lo=0.0, ci_hi=0.2,
                  per_seed=[[0.05, 0, 0], [0.1, 0, 0], [0.15, 0, 0]]) for w, k in (("1x", 1), ("2x", 2))]
    figures.plot_differences(str(tmp_path / "d.png"), diffs, ["softmax", "ssmax"], {"r": "rope"}, "t")
    fig = made[0]
    ax = fig.axes[1]  # the kx panel
    (dots,) = ax.collections[-1:]
    assert sorted(dots.get_offsets()[:, 1]) == [0.05, 0.05, 0.1, 0.1, 0.15, 0.15]  # 3 seeds at each of 2 windows
    FigureCanvasAgg(fig).draw()
    legend = fig.legends[0].get_window_extent()
    assert all(legend.x0 >= a.get_window_extent().x1 for a in fig.axes)  # over no panel's data
    assert fig.legends[0].get_title().get_text() == "minus softmax, dots: seeds"


def test_two_run_folders_of_one_name_are_told_apart_in_the_comparison(tmp_path, monkeypatch):
    made = drawn(monkeypatch)
    for side in ("a", "b"):
        write_log(tmp_path / side / "run", {"iter": 0, "loss": 5.0}, {"iter": 0, "val_loss": 5.0})
    figures.compare_runs([str(tmp_path / "a" / "run"), str(tmp_path / "b" / "run")], out=str(tmp_path / "c.png"))
    labels = [line.get_label() for line in made[0].axes[0].get_lines()]
    assert labels == ["run: train", "run: val", "run #2 (b/run): train", "run #2 (b/run): val"]


@pytest.fixture
def evaluated(tmp_path):
    """eval_long's outputs for two untrained tiny models, and what it drew."""
    ids = np.random.default_rng(0).integers(0, 50257, 600, dtype=np.uint16)
    data = tmp_path / "data"
    data.mkdir()
    ids.tofile(data / "train.bin"), ids.tofile(data / "val.bin")
    ckpts = []
    for scorer, pos in (("softmax", "rope"), ("ssmax", "rope"), ("softmax", "nope")):
        torch.manual_seed(0)
        model = GPT(GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=16, ffn_hidden=32, scorer=scorer, pos=pos))
        ckpts.append(str(tmp_path / f"{scorer}-{pos}.pt"))
        save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": {},
                         "iter_num": 0, "best_val_loss": float("nan"), "run_info": run_info(0)}, ckpts[-1])
    return data, ckpts


def artists(fig):
    return [[(line.get_label(), to_hex(line.get_color()), line.get_linestyle(), list(line.get_ydata()))
             for line in ax.get_lines()] for ax in fig.axes] + [ax.get_title() for ax in fig.axes]


def test_a_folder_redrawn_from_its_numbers_gives_the_figures_eval_long_drew(evaluated, tmp_path, monkeypatch):
    data, ckpts = evaluated
    made = drawn(monkeypatch)
    eval_long.main([*ckpts[:2], "--data", str(data), "--length", "32", "--num_seqs", "2", "--n_boot", "50",
                    "--out_dir", str(tmp_path / "ev")])
    first = [artists(f) for f in made]
    assert redraw_figures.redraw(str(tmp_path / "ev")) == ["per_position.png", "differences.png"]
    again = [artists(f) for f in made[len(first):]]
    assert len(first) == 2 and again == first  # per_position.png and differences.png, line by line
    assert json.load(open(tmp_path / "ev" / "summary.json"))["models"][1]["label"] == "ssmax"
    assert list(redraw_figures.folders_under([str(tmp_path)])) == [str(tmp_path / "ev")]


def test_a_synthetic_folder_is_redrawn_from_its_rows_and_a_sweep_only_at_the_rates_its_rows_select(tmp_path,
                                                                                                  monkeypatch):
    made = drawn(monkeypatch)
    folder = tmp_path / "lr"
    shutil.copytree(os.path.join(redraw_figures.ROOT, "results", "synthetic-lr"), folder)
    assert redraw_figures.redraw(str(folder)) == ["accuracy.png", "horizons.png", "sweep.png"] and len(made) == 3
    assert made[-1].axes[0].get_xlabel() == "learning rate"  # the sweep, drawn last
    chosen = json.load(open(folder / "selected.json"))
    task = next(iter(chosen))
    chosen[task]["softmax"] = 0.123  # not a rate its rows select
    (folder / "selected.json").write_text(json.dumps(chosen))
    with pytest.raises(SystemExit, match="selected.json is not the rates its accuracy.csv selects"):
        redraw_figures.redraw(str(folder))
    old = tmp_path / "old"  # an older layout (no setting column) is left as it is
    old.mkdir()
    (old / "accuracy.csv").write_text("task,seed,length,accuracy\nfirst,0,32,1.0\n")
    (old / "horizons.png").write_bytes(b"as drawn then")
    assert redraw_figures.redraw(str(old)) == [] and (old / "horizons.png").read_bytes() == b"as drawn then"


def test_a_nope_model_is_recorded_and_drawn_without_a_rope_it_does_not_have(evaluated, tmp_path, monkeypatch):
    data, ckpts = evaluated  # it was recorded as 'theta x50, θ 500,000' and drawn so, two identical curves
    made = drawn(monkeypatch)
    eval_long.main([ckpts[0], ckpts[2], "--data", str(data), "--length", "32", "--num_seqs", "2", "--n_boot", "50",
                    "--labels", "rope", "nope", "--out_dir", str(tmp_path / "ev")])
    nope = json.load(open(tmp_path / "ev" / "summary.json"))["models"][1]
    assert (nope["rope_method"], nope["rope_theta"], nope["native"]["rope_theta"]) == ("none", None, None)
    labels = [line.get_label() for line in made[0].axes[0].get_lines() if not line.get_label().startswith("_")]
    assert labels == ["rope (θ=500,000)", "nope (NoPE)", "rope [native] (θ=10,000)", "nope [native] (NoPE)"]
    assert {r["rope_method"] for r in compare.read_csv(tmp_path / "ev" / "per_sequence.csv")
            if r["model"] == "nope"} == {"none"}


def test_nope_models_alone_run_one_pass_and_their_figure_claims_no_rope(evaluated, tmp_path, monkeypatch):
    data, ckpts = evaluated  # it ran an "extended" pass equal to the native one and titled it "RoPE yarn x4"
    made = drawn(monkeypatch)
    eval_long.main([ckpts[2], "--data", str(data), "--length", "32", "--num_seqs", "2", "--rope_method", "yarn",
                    "--rope_scale", "4", "--out_dir", str(tmp_path / "ev")])
    assert open(tmp_path / "ev" / "per_position.csv").readline().strip() == "position,softmax"
    assert {r["rope"] for r in compare.read_csv(tmp_path / "ev" / "per_sequence.csv")} == {"native"}
    title = made[0].axes[0].get_title()
    assert title.endswith("tokens (val), NoPE") and "RoPE" not in title
    assert redraw_figures.redraw(str(tmp_path / "ev")) == ["per_position.png"]
    assert made[1].axes[0].get_title() == title


def test_a_llama4_rescaling_is_titled_with_its_floor(tmp_path, monkeypatch):
    made = drawn(monkeypatch)  # two floors must not look alike (they were both "logits llama4")
    args = dict(num_seqs=2, length=32, split="val", smooth=1, logx=False, logit_scale="llama4", llama4_floor=16,
                rope_method="none", rope_scale=1.0)
    model = dict(label="m", train_len=16, rope_theta=1e4, rope_theta_effective=1e4, model_args={})
    figures.eval_long(str(tmp_path), dict(args=args, models=[model], differences=[], baseline="m"),
                      {"m": np.ones(32)})
    assert "logits llama4 F=16," in made[0].axes[0].get_title()


def test_an_lm_suites_train_loss_is_redrawn_only_where_its_train_logs_give_its_csv_again(tmp_path, monkeypatch):
    made = drawn(monkeypatch)
    src, folder = os.path.join(redraw_figures.ROOT, "results", "cpu_char"), tmp_path / "cpu_char"
    shutil.copytree(src, folder, ignore=lambda d, names: [n for n in names if n.startswith(("eval_long", "needle",
                                                                                            "copy", "gate"))])
    assert redraw_figures.redraw(str(folder)) == ["train_loss.png"]
    legend = [t.get_text() for t in made[0].axes[0].get_legend().get_texts()]
    assert legend[0] == "(a) softmax (8 seeds)" and "(b) SSMax, learnable s (6 seeds)" in legend
    os.remove(folder / "s1346" / "train_log.csv.gz")  # a seed's log not kept: its CSV is not given again
    (folder / "train_loss.png").write_bytes(b"as drawn")
    assert redraw_figures.redraw(str(folder)) == [] and (folder / "train_loss.png").read_bytes() == b"as drawn"


def test_an_lm_suites_copy_gate_from_before_pos_was_recorded_titles_its_nope_models_nope(tmp_path, monkeypatch):
    made = drawn(monkeypatch)  # cpu_char's copy_theta50 was titled "RoPE theta x50", stick-breaking and FoX included
    src, folder = os.path.join(redraw_figures.ROOT, "results", "cpu_char"), tmp_path / "cpu_char"
    folder.mkdir()
    shutil.copy(os.path.join(src, "summary.json"), folder)  # the suite's: its variants name its models
    shutil.copytree(os.path.join(src, "s1337", "copy_theta50"), folder / "s1337" / "copy_theta50")
    assert redraw_figures.redraw(str(folder / "s1337" / "copy_theta50")) == ["copy.png"]
    assert made[0].get_suptitle().endswith("RoPE theta x50, NoPE: stickbreaking, fox")
