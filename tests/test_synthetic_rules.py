"""The synthetic report's rule on hand-made accuracy rows (synthetic_report.py; test_synthetic_report.py has the
verdict rule's main cases): the gate at 0.95 for either setting, MSE claims with softmax near 0, Holm over every
endpoint of a task, the control contrasts' readings and Holm, horizons below N and at the floor, seeds in order, the
eval CSVs gathered by run, and the entries that read their task's endpoints. CPU only."""
import json

import pytest

from lib import synthetic_report


def rows(setting, seed, accs, task="first", base="first", rope="nope", multiples=(1, 2, 4), loss=0.1):
    return [dict(task=task, base=base, setting=setting, seed=seed, length=32 * m, train_length=32, accuracy=a,
                 mse="", loss=loss, condition="", rope=rope) for m, a in zip(multiples, accs)]


def first(settings, seeds=range(6)):
    """The summary of task first: settings {name: seed -> (accuracy at 1, 2, 4 N)}."""
    acc = [r for seed in seeds for s, f in settings.items() for r in rows(s, seed, f(seed))]
    return synthetic_report.summarize(acc)["first"]


def test_a_setting_or_softmax_below_0_95_at_n_makes_the_claim_not_testable_whatever_its_length_result():
    t = first({"softmax": lambda s: (0.94, 0.5, 0.3), "ssmax": lambda s: (1.0, 1.0, 1.0)})
    assert t["gate"]["failed"] == ["softmax"] and t["gate"]["at_n"]["softmax"] == pytest.approx(0.94)
    (v,) = t["verdicts"][0]
    assert v["verdict"] == "not testable" and "validity gate" in v["why"]  # better on every seed, but not testable
    assert t["horizons"]["|nope"]["softmax"] == {s: synthetic_report.BELOW_N for s in range(6)}
    t = first({"softmax": lambda s: (1.0, 0.9, 0.6), "ssmax": lambda s: (0.5, 0.2, 0.1)})  # worse on every seed
    (v,) = t["verdicts"][0]
    assert v["verdict"] == "not testable" and "validity gate" in v["why"]  # the gate first: not "contradicted"


def linear(ssa, softmax=0.02, seeds=range(6), long=None):
    """Task linear: both settings at MSE softmax at the gate (sigma=1); at the endpoint (sigma=4) softmax at long
    (default: softmax) and ssa at ssa(seed)."""
    mse = {("sigma=1", "softmax"): lambda seed: softmax, ("sigma=1", "ssa"): lambda seed: softmax,
           ("sigma=4", "softmax"): lambda seed: long or softmax, ("sigma=4", "ssa"): ssa}
    acc = [dict(task="linear", base="linear", setting=s, seed=seed, length=32, train_length=32, accuracy="",
                mse=m(seed), loss="", condition=cond, rope="plain") for seed in seeds for (cond, s), m in mse.items()]
    return synthetic_report.summarize(acc)["linear"]


def test_an_mse_claim_has_room_whatever_softmaxs_mse_and_an_interval_across_0_decides_nothing():
    assert linear(lambda seed: 0.01)["verdicts"][0][0]["verdict"] == "reproduced"
    assert linear(lambda seed: 0.5, long=1.2)["verdicts"][0][0]["verdict"] == "reproduced"  # no ceiling at 0.95
    (v,) = linear(lambda seed: 0.0199 if seed else 0.0)["verdicts"][0]  # lower on every seed (p = 2/64) ...
    assert v["sign_flip_p"] == pytest.approx(2 / 64) and v["ci_lo"] < 0 < v["ci_hi"]  # ... the t interval across 0
    assert v["verdict"] == "inconclusive", v
    gate = linear(lambda seed: 0.01, softmax=0.1, seeds=range(2))["gate"]  # two seeds: their mean is 0.1 exactly
    assert gate["at_n"]["softmax"] == 0.1 and gate["passed"]  # MSE <= 0.1


def test_holm_runs_over_every_endpoint_of_a_task_the_verdict_tables_rows():
    ropes, accs = ("plain", "theta", "dynamic_ntk"), (("softmax", 0.5), ("ssmax", 0.9), ("softmax-logN", 0.5))
    acc = [r for seed in range(6) for rope in ropes for s, a in accs
           for r in rows(s, seed, (1.0, 1.0, a), task="recall-rope", base="recall", rope=rope)]
    t = synthetic_report.summarize(acc)["recall-rope"]
    vs = [v for vs in t["verdicts"] for v in vs]
    assert [v["rope"] for v in vs] == ["plain", "theta", "dynamic_ntk"]
    assert [v["holm_p"] for v in vs] == pytest.approx([3 * 2 / 64] * 3)
    assert [(k["a"], k["b"], k["multiple"], k["reading"]) for k in t["contrasts"]] == [  # at the first endpoint
        ("ssmax", "softmax-logN", 4, "a > b"), ("softmax-logN", "softmax", 4, "the same within ±0.05")]


CONTROL = {"softmax": lambda s: (1.0, 1.0, 0.5),
           "softmax-logN": lambda s: (1.0, 1.0, 0.4),  # below softmax on every seed: a < b
           "ssmax-fixed-s": lambda s: (1.0, 1.0, 0.7 + 0.01 * s),  # above logN on every seed: a > b
           "ssmax": lambda s: (1.0, 1.0, 0.4 + (0.01 if s % 2 else -0.01)),  # within ±0.05 of logN
           # 5 seeds 0.3 above fixed-s, 1 just below: the t interval excludes 0, p = 4/64 does not pass
           "ssmax-s0.5": lambda s: (1.0, 1.0, 0.7 + 0.01 * s + (0.3 if s else -0.01)),
           "ssmax-s2": lambda s: (1.0, 1.0, 0.7 + 0.01 * s - (0.3 if s % 2 else -0.3)),  # either way: undecided
           "softmax-wd0": lambda s: (0.5, 0.4, 0.3), "sigmoid": lambda s: (0.4, 0.4, 0.2)}  # both fail at N


def test_control_contrasts_read_a_b_by_seed_with_holm_over_their_accuracy_p():
    t = first(CONTROL)
    got = {(k["a"], k["b"]): k for k in t["contrasts"]}
    assert {ab: k["reading"] for ab, k in got.items()} == {
        ("ssmax-fixed-s", "softmax-logN"): "a > b", ("ssmax", "softmax-logN"): "the same within ±0.05",
        ("softmax-logN", "softmax"): "a < b", ("ssmax-s0.5", "ssmax-fixed-s"): "undecided",
        ("ssmax-s2", "ssmax-fixed-s"): "undecided", ("softmax-wd0", "softmax"): "a < b",
        ("sigmoid", "softmax"): "a < b"}
    s05 = got["ssmax-s0.5", "ssmax-fixed-s"]["accuracy"]
    assert s05["ci_lo"] > 0 and s05["sign_flip_p"] == pytest.approx(4 / 64)
    p = [k["accuracy"]["sign_flip_p"] for k in t["contrasts"]]
    assert [k["holm_p"] for k in t["contrasts"]] == pytest.approx(synthetic_report.compare.holm(p))
    floor = got["softmax-wd0", "softmax"]["log2_horizon"]  # softmax 2 N, wd0 below N: no bound shared
    assert floor["at_bound"] is None and floor["mean_diff"] == pytest.approx(-2)


def test_two_settings_failing_at_n_on_every_seed_are_at_the_horizons_floor():
    t = first({"softmax": lambda s: (0.5, 0.4, 0.3), "softmax-wd0": lambda s: (0.4 + 0.01 * s, 0.4, 0.2)})
    (k,) = t["contrasts"]
    assert k["log2_horizon"]["at_bound"] == -1 and k["accuracy"]["at_bound"] is None
    assert "| at floor (both fail at N on every seed) (1) |" in synthetic_report.tables({"first": t})


def test_the_horizons_ceiling_is_the_longest_length_of_its_own_rope():
    acc = [r for seed in range(6) for s in ("softmax", "softmax-wd0") for rope, ms in (("nope", (1, 2, 4)),
                                                                                      ("plain", (1, 8)))
           for r in rows(s, seed, (1.0,) * len(ms), rope=rope, multiples=ms)]
    (k,) = synthetic_report.summarize(acc)["first"]["contrasts"]
    assert k["log2_horizon"]["at_bound"] == 2 and k["reading"] == "at ceiling"  # 4 N: NoPE's longest, not 8 N


def test_a_cell_lists_its_seeds_in_order_whatever_order_the_rows_came_in():
    acc = [r for seed in (3, 1, 2) for r in rows("softmax", seed, (1.0, 0.1 * seed, 0.5), loss=seed)]
    cell = next(c for c in synthetic_report.summarize(acc)["first"]["cells"] if c["multiple"] == 2)
    assert cell["seeds"] == [1, 2, 3] and cell["per_seed"] == pytest.approx([0.1, 0.2, 0.3])
    assert cell["loss_per_seed"] == [1.0, 2.0, 3.0]


def test_gather_names_each_row_by_its_suite_entry_and_reads_each_runs_own_folder(tmp_path):
    for seed, a in ((0, 0.25), (1, 0.75)):
        path = tmp_path / f"recall-rope-ssmax-s{seed}" / "eval" / "accuracy.csv"
        path.parent.mkdir(parents=True)
        path.write_text(f"task,seed,length,accuracy\nrecall,{seed},64,{a}\n")
    acc, att, prompts = synthetic_report.gather(str(tmp_path), [("recall-rope", "ssmax", 0), ("recall-rope", "ssmax",
                                                                                              1)])
    assert [(r["task"], r["base"], r["setting"], r["seed"], r["accuracy"]) for r in acc] == [
        ("recall-rope", "recall", "ssmax", "0", "0.25"), ("recall-rope", "recall", "ssmax", "1", "0.75")]
    assert att == prompts == []


@pytest.mark.parametrize("entry, task", [("recall-tuned", "recall"), ("first-lr0.001", "first"),
                                         ("first-lr0.01", "first"), ("recall-gpu", "recall"),
                                         ("recall-gpu-b128-i4000", "recall"), ("first-long", "first-long")])
def test_a_sweep_tuned_or_gpu_entry_has_its_tasks_endpoints(entry, task):
    assert synthetic_report.primary(entry) == synthetic_report.PRIMARY[task]


def test_summary_json_states_the_rule_its_verdicts_were_decided_by(tmp_path):
    synthetic_report.write(str(tmp_path), {}, {"command": "x"})
    rule = json.load(open(tmp_path / "summary.json"))["rule"]
    assert (rule["gate"], rule["solved"], rule["alpha"], rule["min_seeds"], rule["equivalent"]) == (
        {"accuracy": 0.95, "mse": 0.1}, 0.95, 0.05, 6, 0.05)
    assert rule["correction"].startswith("none") and "at_bound" in rule["ceiling"]
