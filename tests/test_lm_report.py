"""report.py on hand-made outputs (the lm suite's summary.json without training): the loss table's last evaluation,
eval_long's windows and their extension cost by seed, the copy gate's differences to softmax (or to the native
softmax for a rescaling), the gates minus softmax's, and a seed missing an output leaving that output out. CPU."""
import csv
import json
import os

import pytest

from lib import compare, report


def test_the_loss_table_takes_each_seeds_last_evaluation_and_its_train_loss_for_train():
    row = lambda v, s, it, tr, va: dict(variant=v, seed=s, iter=it, train_loss=tr, val_loss=va)  # noqa: E731
    rows = [row("softmax", 1, 4, 3.0, 3.5), row("softmax", 1, 8, 2.0, 2.5), row("ssmax", 1, 8, 1.75, 2.25),
            row("softmax", 2, 8, 2.5, 3.0), row("ssmax", 2, 8, 2.25, 2.5)]
    t = report.loss_table(rows, ["softmax", "ssmax"], [1, 2])
    assert t["softmax"]["per_seed"][1]["iter"] == 8
    assert t["softmax"]["train"][0] == pytest.approx(2.25) and t["softmax"]["val"][0] == pytest.approx(2.75)
    assert t["ssmax"]["val_minus_baseline"][0] == pytest.approx((-0.25 - 0.5) / 2)


def eval_long_summary(ext, native, diff):
    """One seed's eval_long.py summary.json: softmax and ssa, one window."""
    models = [dict(label=m, windows={"4x": {"mean_loss": ext + i}}, native={"windows": {"4x": {"mean_loss": native}}})
              for i, m in enumerate(("softmax", "ssa"))]
    d = dict(model="ssa", baseline="softmax", rope="extended", window="4x", k=4, tokens=256, n_seqs=2,
             mean_diff=diff, ci_lo=diff - 0.1, ci_hi=diff + 0.1)
    return dict(models=models, baseline="softmax", differences=[d])


def test_eval_long_over_seeds_keeps_extended_and_native_apart_and_costs_extended_minus_native(monkeypatch):
    monkeypatch.setattr(report.figures, "plot_differences", lambda *a: None)
    files = {"s1": eval_long_summary(3.0, 2.0, 0.5), "s2": eval_long_summary(4.0, 2.5, 0.75)}
    read = lambda results, seed, folder, name: files.get(seed)  # noqa: E731
    got = report.long_context("r", [1, 2], ["softmax", "ssa"], "theta", read)
    assert got["windows"]["extended"]["ssa"]["4x"][0] == pytest.approx(4.5)
    assert got["windows"]["native"]["ssa"]["4x"][0] == pytest.approx(2.25)
    assert got["extended_minus_native"]["softmax"]["4x"][0] == pytest.approx((1.0 + 1.5) / 2)  # worse extended: > 0
    (d,) = got["differences"]
    assert d["n_seeds"] == 2 and d["mean_diff"] == pytest.approx(0.625)
    del files["s2"]  # a seed without it: no summary over the seed that has it
    assert report.long_context("r", [1, 2], ["softmax", "ssa"], "theta", read) is None


def copy_summary(ratios, gate_ratio):
    return dict(models=[dict(label=m, by_distance={"0.5": {"ratio": r}}, gate_ratio=g)
                        for m, r, g in zip(("softmax", "fox"), ratios, gate_ratio)])


def test_the_copy_gate_pairs_each_model_with_softmax_by_seed_and_a_rescaling_with_the_native_softmax():
    per_seed = [copy_summary((0.8, 0.25), (0.75, 0.75)), copy_summary((0.9, 0.5), (0.75, 0.25))]
    got = report.copy_gate(per_seed)
    assert got["fox"]["ratio_per_seed"] == {"0.5": [0.25, 0.5]}
    assert got["fox"]["minus_softmax"]["0.5"][0] == pytest.approx(-0.475)  # fox copies better: its ratio lower
    assert got["fox"]["gate"] and not got["softmax"]["gate"]  # fox: the mean of 0.75, 0.25 (<= 0.5), not seed 1's
    assert "minus_softmax" not in got["softmax"]
    rescaled = report.copy_gate(per_seed[:1] * 2, baseline={"0.5": [1.0, 1.0]})  # softmax-qwen vs native softmax
    assert rescaled["softmax"]["minus_softmax"]["0.5"][0] == pytest.approx(-0.2)
    table = report.tables(dict(seeds=[1, 2], variants={}, losses={}, copy_gate=got)).splitlines()
    assert "| fox | 0.38 ± 0.18 | passed |" in table and "| softmax | 0.85 ± 0.07 | failed |" in table


def test_retrieval_over_seeds_leaves_out_an_output_one_seed_lacks():
    cells = [dict(model="softmax", context=64, depth=50, n=2, accuracy=1.0)]
    score = dict(model="softmax", top_score=0.5, control_top_score=0.25, mean_score=0.1, control_mean_score=0.05,
                 uniform=0.01)
    files = {("s1", "needle.json"): dict(cells=cells), ("s1", "passkey.json"): dict(cells=cells),
             ("s2", "passkey.json"): dict(cells=cells), ("s1", "needle_score_trials.json"): dict(scores=[score])}
    got = report.retrieval("r", [1, 2], read=lambda results, seed, folder, name: files.get((seed, name)))
    assert set(got) == {"passkey"} and got["passkey"]["softmax"]["64"]["per_seed"] == [1.0, 1.0]


def test_summary_gates_minus_softmax_are_paired_by_seed_and_the_tables_show_each_interval(tmp_path):
    def curve(seed, first):  # N = 32: loss(1) = first, positions 2..32 at 2
        path = tmp_path / f"s{seed}" / "gate" / "per_position.csv"
        path.parent.mkdir(parents=True)
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["position", "softmax", "ssa"])
            w.writerows([p, first["softmax"] if p == 1 else 2.0, first["ssa"] if p == 1 else 2.0]
                        for p in range(1, 33))
    curve(1, {"softmax": 4.0, "ssa": 5.0})
    curve(2, {"softmax": 4.5, "ssa": 5.0})
    rows = [dict(variant=v, seed=s, iter=8, train_loss=2.0 + s, val_loss=val) for s in (1, 2)
            for v, val in (("softmax", 3.0), ("ssa", 3.5 if s == 1 else 3.25))]
    s = report.summarize(str(tmp_path), {1: "r1", 2: "r2"}, {"softmax": "(a)", "ssa": "SSA"}, 32, rows)
    assert s["gates"]["ssa"]["context_gain"][0] == pytest.approx(3.0)
    d = s["gates_minus_softmax"]["ssa"]["context_gain"]
    assert d[0] == pytest.approx(0.75) and d[2:] == pytest.approx(compare.seed_interval([1.0, 0.5])[2:])
    v = s["losses"]["ssa"]["val_minus_baseline"]
    assert f"| SSA | 2 | 3.5000 ± 0.7071 | 3.3750 ± 0.1768 | {v[0]:+.4f} [{v[2]:+.4f}, {v[3]:+.4f}] |" in (
        tmp_path / "tables.md").read_text()
    assert json.load(open(tmp_path / "summary.json"))["seeds"] == [1, 2]
    for seed, (softmax, qwen) in ((1, (0.8, 0.5)), (2, (0.9, 0.75))):  # the copy gate: native and Qwen's rescaling
        for name, ratio in (("copy", softmax), ("copy_qwen", qwen)):
            path = tmp_path / f"s{seed}" / name / "summary.json"
            path.parent.mkdir()
            path.write_text(json.dumps(copy_summary((ratio,), (ratio,))))
    s = report.summarize(str(tmp_path), {1: "r1", 2: "r2"}, {"softmax": "(a)"}, 32, rows, ("copy", "copy_qwen"))
    assert s["copy_gate_qwen"]["softmax"]["minus_softmax"]["0.5"][0] == pytest.approx(-0.225)  # qwen - native
    made_otherwise = {os.path.normpath(tmp_path / "s1" / "copy_qwen" / "summary.json")}  # runs.Steps.skip's
    assert "copy_gate_qwen" not in report.summarize(str(tmp_path), {1: "r1", 2: "r2"}, {"softmax": "(a)"}, 32, rows,
                                                    ("copy", "copy_qwen"), left_out=made_otherwise)
    (tmp_path / "s2" / "copy" / "summary.json").unlink()  # no native softmax to pair with: no rescaled gate
    s = report.summarize(str(tmp_path), {1: "r1", 2: "r2"}, {"softmax": "(a)"}, 32, rows, ("copy", "copy_qwen"))
    assert "copy_gate" not in s and "copy_gate_qwen" not in s
    (tmp_path / "s2" / "gate" / "per_position.csv").unlink()  # a seed without its gate: no gates at all
    assert "gates" not in report.summarize(str(tmp_path), {1: "r1", 2: "r2"}, {"softmax": "(a)", "ssa": "SSA"}, 32,
                                           rows)
