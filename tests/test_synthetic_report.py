"""The synthetic suite's report (synthetic_report.py): the seed-level summary (paired differences, t intervals,
sign-flip p, horizons), its verdict rule, Holm over the verdict and control tables, "at ceiling" instead of an
interval, and summary.json written last (a folder re-reported: test_rereport.py). CPU only."""
import json
import os

import pytest

from lib import compare, synthetic, synthetic_report
from lib.corpora import DataError


def _rows(setting, seed, accs, task="first"):
    return [dict(task=task, base="first", setting=setting, seed=seed, length=32 * m, train_length=32, accuracy=a,
                 mse="", loss=0.1, condition="", rope="nope") for m, a in zip((1, 2, 4), accs)]


def test_summary_pairs_by_seed_with_t_interval_sign_flip_p_and_horizons():
    acc = [r for seed in range(6) for r in _rows("softmax", seed, (1.0, 0.9, 0.5 + 0.05 * seed))
           + _rows("ssmax", seed, (1.0, 1.0, 0.97 if seed else 0.8))]
    t = synthetic_report.summarize(acc)["first"]
    cell = next(c for c in t["cells"] if (c["setting"], c["multiple"]) == ("ssmax", 4))
    d = [(0.97 if s else 0.8) - (0.5 + 0.05 * s) for s in range(6)]
    assert cell["vs_softmax"]["diffs"] == pytest.approx(d) and cell["per_seed"][0] == 0.8
    mean, sd, lo, hi = compare.seed_interval(d)
    assert (cell["vs_softmax"]["ci_lo"], cell["vs_softmax"]["ci_hi"]) == pytest.approx((lo, hi))
    assert cell["vs_softmax"]["sign_flip_p"] == pytest.approx(2 / 64)  # every seed better: 2 of 64 assignments
    assert t["horizons"]["|nope"]["softmax"] == {s: 1 for s in range(6)}  # 0.9 at 2 N fails
    assert t["horizons"]["|nope"]["ssmax"] == {0: 2, **{s: 4 for s in range(1, 6)}}
    (v,) = t["verdicts"][0]
    assert v["verdict"] == "reproduced" and v["multiple"] == 4 and t["gate"]["passed"]


@pytest.mark.parametrize("ssmax_at_n,ssmax_long,softmax_long,verdict", [
    (0.5, 1.0, 0.5, "not testable"),  # ssmax misses the gate at N
    (1.0, 0.2, 0.6, "contradicted"),  # worse on every seed
    (1.0, 1.0, 1.0, "not testable"),  # softmax solves the length: no room to show the claim
    (1.0, None, 0.5, "inconclusive"),  # better on half the seeds, worse on the other half
    (1.0, 0.2, 1.0, "contradicted"),  # worse on every seed: rule 3 comes before softmax's "no room" (rule 4)
])
def test_the_verdict_rule(ssmax_at_n, ssmax_long, softmax_long, verdict):
    acc = [r for seed in range(6) for r in _rows("softmax", seed, (1.0, 1.0, softmax_long))
           + _rows("ssmax", seed, (ssmax_at_n, 1.0, ssmax_long if ssmax_long is not None else (0.9 if seed % 2
                                                                                                else 0.1)))]
    (v,) = synthetic_report.summarize(acc)["first"]["verdicts"][0]
    assert v["verdict"] == verdict, v


def test_every_and_some_are_never_contradicted_they_do_not_test_length():
    acc = [r for seed in range(6) for r in _rows("softmax", seed, (1.0, 1.0, 0.9), task="every")
           + _rows("ssa", seed, (1.0, 1.0, 0.2), task="every")]
    for r in acc:
        r.update(base="every", condition="sigma=10")
    (v,) = synthetic_report.summarize(acc)["every"]["verdicts"][0]
    assert v["verdict"] == "not reproduced at this scale" and "not length" in v["why"]


def test_verdict_and_control_tables_report_holm_over_their_rows_and_say_at_ceiling_instead_of_an_interval():
    acc = [r for seed in range(6) for s, accs in (("softmax", (1.0, 0.9, 0.5)), ("ssmax", (1.0, 1.0, 1.0)),
                                                  ("lssa", (1.0, 1.0, 0.9 if seed else 0.4)),
                                                  ("ssmax-s2", (1.0, 1.0, 1.0)), ("ssmax-fixed-s", (1.0, 1.0, 1.0)))
           for r in _rows(s, seed, accs)]
    t = synthetic_report.summarize(acc)["first"]
    ssmax, fixed, lssa = (next(v for v in t["verdicts"][0] if v["setting"] == s) for s in ("ssmax", "ssmax-fixed-s",
                                                                                          "lssa"))
    # p: 2/64, 2/64 and 4/64 (lssa's seed 0 is worse): Holm over 3 rows 3 x 2/64, 3 x 2/64, max(that, 1 x 4/64)
    assert (ssmax["holm_p"], fixed["holm_p"], lssa["holm_p"]) == pytest.approx((6 / 64, 6 / 64, 6 / 64))
    assert ssmax["verdict"] == "reproduced"  # the rule, uncorrected, stands as ruled; Holm is reported beside it
    same = next(k for k in t["contrasts"] if (k["a"], k["b"]) == ("ssmax-s2", "ssmax-fixed-s"))
    assert same["accuracy"]["at_bound"] == 1.0 and same["reading"] == "at ceiling"  # not "the same within ±0.05"
    assert same["log2_horizon"]["at_bound"] == 2  # both at the longest length tested, 4 N
    table = synthetic_report.tables({"first": t})
    assert "| ssmax-s2 − ssmax-fixed-s | at ceiling (both 1.000 on every seed) (1) | 1 | at ceiling (both 4 N on " \
           "every seed) (1) | at ceiling |" in table
    assert "| Holm p |" in table and f"| {ssmax['sign_flip_p']:.4f} | 0.0938 | 6 |" in table


def test_a_report_cut_short_leaves_no_summary_json_and_a_finished_one_writes_it_last(tmp_path, monkeypatch):
    acc = [r for seed in range(3) for s in ("softmax", "ssmax") for r in _rows(s, seed, (1.0, 0.9, 0.5))]
    monkeypatch.setattr(synthetic_report, "gather", lambda runs, todo: (acc, [], [dict(prompt=0)]))
    (tmp_path / "summary.json").write_text('{"an": "earlier report"}')
    seen = []

    def draw(summary, att, results, primary, below):  # the figures: the summary.json of no report beside them
        seen.append(os.path.exists(tmp_path / "summary.json"))
        if len(seen) == 1:
            raise KeyboardInterrupt
    monkeypatch.setattr(synthetic_report.synthetic_figures, "draw", draw)
    with pytest.raises(KeyboardInterrupt):
        synthetic_report.report("runs", str(tmp_path), [], {"command": "x"})
    assert not os.path.exists(tmp_path / "summary.json") and (tmp_path / "accuracy.csv").exists()
    synthetic_report.report("runs", str(tmp_path), [], {"command": "x"})
    assert seen == [False, False] and json.load(open(tmp_path / "summary.json"))["command"] == "x"
    assert (tmp_path / "tables.md").stat().st_mtime_ns <= (tmp_path / "summary.json").stat().st_mtime_ns


def test_a_length_off_the_multiples_of_n_or_a_seed_twice_in_a_cell_is_refused_not_written_over():
    # the cells are keyed by length // N and a seed: 48 (1.5 N) would have replaced seed 0's value at 1 N, and a second
    # row of the same seed and multiple replaced the first, silently
    acc = _rows("softmax", 0, (1.0, 0.9, 0.5))
    with pytest.raises(DataError, match="length 48 is not a multiple of its training length 32"):
        synthetic_report.summarize(acc + [dict(acc[0], length=48, accuracy=0.2)])
    with pytest.raises(DataError, match=r"first softmax seed 0: two rows at 2 N \(no condition, rope nope\)"):
        synthetic_report.summarize(acc + [dict(acc[1], accuracy=0.2)])
    two_seeds = synthetic_report.summarize(acc + _rows("softmax", 1, (1.0, 0.9, 0.5)))["first"]
    assert two_seeds["cells"][0]["seeds"] == [0, 1]


def test_a_mean_of_exactly_0_95_passes_the_gate_and_leaves_softmax_no_room():
    ten = [0.9, 1.0] * 5  # their mean is exactly 0.95: the rule's ">= 0.95" on both counts
    acc = [r for seed in range(10) for r in _rows("softmax", seed, (ten[seed], 1.0, ten[seed]))
           + _rows("ssmax", seed, (1.0, 1.0, 1.0))]
    t = synthetic_report.summarize(acc)["first"]
    assert t["gate"]["at_n"]["softmax"] == 0.95 and t["gate"]["passed"]
    (v,) = t["verdicts"][0]
    assert v["verdict"] == "not testable" and "no room" in v["why"]


def test_an_mse_claim_is_reproduced_when_the_mse_is_lower_on_every_seed():
    acc = [dict(task="linear", base="linear", setting=s, seed=seed, length=32, train_length=32, accuracy="",
                mse=m, loss="", condition=cond, rope="plain")
           for seed in range(6) for cond in ("sigma=1", "sigma=4")
           for s, m in (("softmax", 0.05 if cond == "sigma=1" else 0.5), ("ssa", 0.05 if cond == "sigma=1" else 0.2))]
    (v,) = synthetic_report.summarize(acc)["linear"]["verdicts"][0]
    assert v["metric"] == "mse" and v["mean_diff"] == pytest.approx(-0.3)
    assert v["verdict"] == "reproduced", v  # lower is better for MSE


def test_a_suite_task_with_no_primary_entry_says_so_in_tables_md_and_the_printed_report(tmp_path, monkeypatch, capsys):
    # it had got no verdict table and no line saying why: as if nothing had been claimed for it
    acc = [r for seed in range(2) for s in ("softmax", "ssmax") for r in _rows(s, seed, (1.0, 0.9, 0.5), "induction")]
    monkeypatch.setattr(synthetic_report, "gather", lambda runs, todo: (acc, [], [dict(prompt=0)]))
    monkeypatch.setattr(synthetic_report.synthetic_figures, "draw", lambda *a: None)
    synthetic_report.report("runs", str(tmp_path), [], {"command": "x"})
    said = "no primary contrast registered for task induction"
    assert said in (tmp_path / "tables.md").read_text() and said in capsys.readouterr().out
    assert said not in synthetic_report.tables(synthetic_report.summarize(_rows("softmax", 0, (1.0, 0.9, 0.5))))
