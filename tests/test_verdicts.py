"""results/cpu_char/verdicts.py: the pre-registered decision rule, cell by cell and claim by claim."""
import importlib.util
import os

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("verdicts", os.path.join(REPO, "results", "cpu_char", "verdicts.py"))
verdicts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(verdicts)


def test_a_cell_is_decided_by_its_interval_and_sign_flip_p_on_the_papers_side_and_needs_ten_seeds():
    up = np.linspace(0.1, 0.3, 10)  # every seed > 0: p = 2 / 1024
    assert verdicts.cell(up, +1)["verdict"] == "reproduced"
    assert verdicts.cell(up, -1)["verdict"] == "contradicted"
    assert verdicts.cell(up - 0.2, +1)["verdict"] == "inconclusive"  # straddles 0
    assert verdicts.cell(np.zeros(10), +1)["verdict"] == "inconclusive"  # no difference: p = 1
    assert verdicts.cell(up[:9], +1)["verdict"] == "no verdict (9 seeds)"
    assert verdicts.cell(up, 0)["verdict"] == "inconclusive"  # "close to": no margin was stated
    c = verdicts.cell(up, +1)
    assert c["lo"] < c["mean"] < c["hi"] and c["p"] == 2 / 1024 and c["n"] == 10


def test_a_claim_is_reproduced_only_when_every_cell_is_and_contradicted_when_one_is_and_none_reproduced():
    cells = lambda *v: [dict(verdict=x) for x in v]
    assert verdicts.aggregate(cells("reproduced", "reproduced")) == "reproduced"
    assert verdicts.aggregate(cells("reproduced", "inconclusive")) == "inconclusive"
    assert verdicts.aggregate(cells("contradicted", "inconclusive")) == "contradicted"
    assert verdicts.aggregate(cells("contradicted", "reproduced")) == "inconclusive"
    assert verdicts.aggregate(cells("no verdict (5 seeds)", "no verdict (5 seeds)")) == "no verdict (5 seeds)"


def test_every_claim_of_the_committed_summary_shows_the_papers_result_beside_its_gate_and_cells():
    import json
    with open(os.path.join(REPO, "results", "cpu_char", "summary.json")) as f:
        v = verdicts.decide(json.load(f))
    assert len(v["claims"]) == 13
    for r in v["claims"]:
        assert r["paper"] and r["cells"] and r["gate"]
    table = verdicts.markdown(v).splitlines()
    rows = [x for x in table if x.startswith("| ") and not x.startswith("| claim")]
    assert len(rows) == 13 and all(x.count(" | ") == 4 for x in rows)
