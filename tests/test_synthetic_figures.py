"""The synthetic suite's figures (lib/synthetic_figures.py), read from the artists they draw (savefig kept, not
written): a colour per setting, paired differences inside their own octave, legends outside the axes, seed lines
joined by seed, a fixed panel order, one seed and nan values said rather than drawn as 0, seeds in attention.png.
CPU only."""
import math
import random

import numpy as np
import pytest
from matplotlib.collections import LineCollection
from matplotlib.colors import to_hex

from lib import synthetic_figures as figures
from lib import synthetic_report
from lib.synthetic_suite import SETTINGS, sweep_accuracy


@pytest.fixture(scope="module", autouse=True)
def warm():
    """Once a process: matplotlib's fonts and the statistics' lazy imports, not in the first test's time."""
    from matplotlib.figure import Figure
    Figure(layout="constrained").subplots().set_title("x").figure.draw_without_rendering()
    summary(rows("softmax", 0, (1.0,)) + rows("softmax", 1, (1.0,)))


@pytest.fixture
def drawn(monkeypatch):
    """The figures savefig is asked to write, kept instead of drawn."""
    from matplotlib.figure import Figure
    out = []
    monkeypatch.setattr(Figure, "savefig", lambda self, fname, **kw: out.append(self))
    return out


def rows(setting, seed, accs, task="first", cond="", rope="nope", multiples=(1, 2, 4)):
    return [dict(task=task, base=task, setting=setting, seed=seed, length=32 * m, train_length=32, accuracy=a,
                 mse="", loss=0.1, condition=cond, rope=rope) for m, a in zip(multiples, accs) if a is not None]


def summary(acc):
    return synthetic_report.summarize(acc)


def horizons(acc, drawn):
    figures.horizons(summary(acc), "h.png", {"first": [("", "nope", None)]}, synthetic_report.BELOW_N)
    return drawn[-1]


def colour(line):
    return to_hex(line.get_color())


def test_every_suite_setting_and_any_other_name_has_a_colour_no_other_setting_of_the_figure_has(drawn):
    # softmax-x2 and softmax-x3 fell back to black, like softmax: three black means in first-control's figures
    acc = [r for seed in range(2) for s in ("softmax", "softmax-x2", "softmax-x3", "softmax-x5") for r in
           rows(s, seed, (1.0, 0.9, 0.5))]
    figures.accuracy(summary(acc), "a.png")
    means = [line for line in drawn[0].axes[0].lines if line.get_marker() == "o"]
    assert len(means) == 4 and len({colour(line) for line in means}) == 4
    names = [*SETTINGS, "softmax-x5", "my-scorer"]
    assert len({to_hex(c) for c in figures.palette(names).values()}) == len(names)


def test_paired_differences_of_many_settings_stay_inside_their_own_lengths_octave(drawn):
    # 1 + 0.04 (i - n/2) put 18 settings' 128 N points among the 64 N ones
    names = [s for s in SETTINGS if s != "softmax"]
    acc = [r for seed in range(2) for s in ["softmax", *names]
           for r in rows(s, seed, (1.0, 0.9, 0.8, 0.7), multiples=(1, 2, 64, 128))]
    ax_d = horizons(acc, drawn).axes[2]
    xs = np.array([line.get_xdata() for line in ax_d.lines if line.get_marker() == "o"])  # (settings, lengths)
    assert xs.shape == (len(names), 4)
    for m, x in zip((1, 2, 64, 128), xs.T):
        assert (x > m / math.sqrt(2)).all() and (x < m * math.sqrt(2)).all() and len(set(x)) == len(names)


def overlaps(a, b):
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("which", ["horizons", "accuracy", "sweep", "attention"])
def test_the_legend_sits_outside_every_panel(drawn, which):
    # sweep.png's "recall, 1 N" legend hid 5 stick-breaking seeds; accuracy.png's covered first (NoPE)
    names = ["softmax", "ssmax", "ssa", "lssa", "fox", "stickbreaking"]
    acc = [r for seed in range(3) for s in names for r in rows(s, seed, (1.0, 0.9, 0.1 * seed))]
    if which == "horizons":
        horizons(acc, drawn)
    elif which == "accuracy":
        figures.accuracy(summary(acc), "a.png")
    elif which == "sweep":
        lr = [dict(r, task=f"first-lr{x}") for x in (1e-3, 3e-3) for r in acc]
        figures.sweep(sweep_accuracy(lr), {"first": {"ssa": 1e-3}}, "s.png")
    else:
        figures.attention(attention_rows(names, range(3)), "att.png")
    fig = drawn[0]
    fig.draw_without_rendering()
    (legend,) = fig.legends
    assert all(ax.get_legend() is None for ax in fig.axes)
    assert {t.get_text() for t in legend.get_texts()} >= set(names)
    box = legend.get_window_extent()
    assert not any(overlaps(box, ax.get_window_extent()) for ax in fig.axes if ax.get_visible())


def test_each_seeds_thin_line_joins_that_seeds_own_values(drawn):
    # joined by list position, seed 0's line took seed 1's 2 N value where seed 0 had none
    acc = rows("softmax", 0, (1.0, None, 0.2)) + rows("softmax", 1, (1.0, 0.6, 0.7))
    ax_a = horizons(acc, drawn).axes[1]
    thin = [list(line.get_ydata()) for line in ax_a.lines if line.get_linewidth() == 0.5]
    assert np.allclose(thin, [[1.0, np.nan, 0.2], [1.0, 0.6, 0.7]], equal_nan=True)


def test_accuracy_panels_come_in_one_order_whatever_the_hash_seed_or_row_order(drawn):
    # a set's order: the committed accuracy.png put sigma=3 after sigma=10 and changed with PYTHONHASHSEED
    sigmas = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20]
    acc = [r for sigma in sigmas for seed in range(2) for r in rows("softmax", seed, (1.0, 0.9), cond=f"sigma={sigma}")]
    random.Random(0).shuffle(acc)
    figures.accuracy(summary(acc), "a.png")
    titles = [ax.get_title() for ax in drawn[0].axes if ax.get_visible()]
    assert titles == [f"first sigma={sigma} (NoPE)" for sigma in sigmas]


def texts(ax):
    return " ".join(t.get_text() for t in ax.texts)


def test_one_seed_says_no_interval_instead_of_a_zero_bar(drawn):
    acc = rows("softmax", 0, (1.0, 0.9, 0.5)) + rows("ssmax", 0, (1.0, 1.0, 0.8))
    fig = horizons(acc, drawn)
    ax_d = fig.axes[2]
    bars = [seg for c in ax_d.collections if isinstance(c, LineCollection) for seg in c.get_segments()]
    assert not bars  # no error bar at all, not one of length 0
    assert "1 seed: no interval" in texts(ax_d)
    figures.accuracy(summary(acc), "a.png")
    assert "1 seed: no interval" in texts(drawn[-1].axes[0])


def test_a_nan_accuracy_is_left_out_and_counted_never_drawn_as_0(drawn):
    acc = [r for seed in range(3) for r in rows("softmax", seed, (1.0, 0.9, 0.5))
           + rows("ssmax", seed, (1.0, 1.0, math.nan if seed == 2 else 0.8))]
    fig = horizons(acc, drawn)
    ax_a, ax_d = fig.axes[1:]
    assert "1 seed value nan: left out" in texts(ax_a)
    assert "1 seed difference nan: left out" in texts(ax_d)
    (mean,) = [line.get_ydata() for line in ax_d.lines if line.get_marker() == "o"]
    assert mean[0] == 0 and math.isnan(mean[2])  # a gap at 4 N, not a 0
    figures.accuracy(summary(acc), "a.png")
    assert "1 seed value nan: left out" in texts(drawn[-1].axes[0])


def attention_rows(names, seeds):
    return [dict(task="first", model=f"first-{s}-s{seed}", setting=s, seed=seed, length=str(L), layer="0", head="0",
                 target_mass=str(0.9 / (1 + seed) / L * 32), entropy=str(0.1 * seed + L / 32), row_mass="1")
            for s in names for seed in seeds for L in (32, 64, 128)]


def test_attention_png_shows_each_seed_beside_the_mean(drawn):
    figures.attention(attention_rows(["softmax"], range(3)), "att.png")
    mass, entropy = drawn[0].axes
    for ax, seed_y in ((mass, [[0.9 / (1 + k) / f for f in (1, 2, 4)] for k in range(3)]),
                       (entropy, [[0.1 * k + f for f in (1, 2, 4)] for k in range(3)])):
        thin = [list(line.get_ydata()) for line in ax.lines if line.get_linewidth() == 0.5]
        assert np.allclose(thin, seed_y)
        (mean,) = [line.get_ydata() for line in ax.lines if line.get_marker() == "o"]
        assert np.allclose(mean, np.mean(seed_y, 0))
