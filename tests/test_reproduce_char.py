"""reproduce.py's character scale end to end at a toy size (its own file: it takes as long as test_reproduce.py's
GPT-2-token run, and pytest --dist loadfile gives each file one worker)."""
import json

import pytest
import torch

import reproduce
from test_reproduce import TOY  # the GPT-2-token toy's model and training, shortened

# characters with copies in every window, the copy gate, a zoo scorer; retrieval on every seed's models, no SFT
TOY_CHAR = dict(dataset="english_char", model=TOY["model"],
                train=dict(TOY["train"], max_iters=4, copy_frac=1.0, copy_span=8, copy_kind="random"),
                eval=dict(num_seqs=1, gate_seqs=2, length_x=2, copy_seqs=2, needle_contexts=[64, 128], samples=1,
                          passkey_contexts=[64], passkey_samples=2, score_context=128, trials=2, batch_size=2),
                variants=("softmax", "stickbreaking"))


def test_a_char_scale_trains_with_copies_and_reports_the_copy_gate_over_seeds(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(reproduce.SCALES, "toy_char", TOY_CHAR)
    reproduce.main(["--scale", "toy_char", "--seeds", "1", "2"])
    res = tmp_path / "out-results" / "toy_char"
    steps = [json.loads(line)["step"] for line in open(res / "steps.jsonl")]
    assert not any(s.startswith("sft") for s in steps) and "needle (seed 2)" in steps and "passkey (seed 1)" in steps
    assert "needle native (seed 1)" in steps  # native θ too: where the retrieval gate is read
    ckpt = torch.load(tmp_path / "out-repro-toy_char" / "s1" / "stickbreaking" / "ckpt.pt", weights_only=True)
    assert ckpt["model_args"]["vocab_size"] == 85 and ckpt["model_args"]["pos"] == "nope"
    assert ckpt["config"]["copy_frac"] == 1.0 and ckpt["config"]["copy_kind"] == "random"
    summary = json.load(open(res / "summary.json"))
    assert summary["dataset"] == "english_char" and "needle" not in summary  # no first-seed-only retrieval
    got = summary["retrieval"]  # every seed's: intervals over seeds, paired with softmax by seed
    assert set(got["needle"]["softmax"]) == {"64", "128"} and set(got["passkey"]["stickbreaking"]) == {"64"}
    cell = got["needle"]["stickbreaking"]["128"]
    assert len(cell["per_seed"]) == 2 and all(0 <= a <= 1 for a in cell["per_seed"])
    d = [x - y for x, y in zip(cell["per_seed"], got["needle"]["softmax"]["128"]["per_seed"])]
    assert cell["minus_softmax"][0] == pytest.approx(sum(d) / 2) and 0 < cell["minus_softmax"][4] <= 1
    score = got["needle_scores"]["softmax"]
    assert score["uniform"]["interval"][0] == pytest.approx(7 / 129)  # " 81064."-long spans; 128 keys + the space
    assert score["top_minus_control"]["per_seed"] == pytest.approx(
        [t - c for t, c in zip(score["top_score"]["per_seed"], score["control_top_score"]["per_seed"])])
    assert "### needle_scores (θ x 50)" in (res / "tables.md").read_text()
    assert set(summary["retrieval_native"]["passkey"]) == {"softmax", "stickbreaking"}
    assert json.load(open(res / "s1" / "needle_native" / "needle.json"))["args"]["rope_method"] == "none"
    gate = summary["copy_gate"]
    assert set(gate) == {"softmax", "stickbreaking"} and "0.5" in gate["softmax"]["ratio"]
    assert len(gate["softmax"]["gate_ratio_per_seed"]) == 2 and isinstance(gate["softmax"]["gate"], bool)
    mean, sd, lo, hi, p = gate["stickbreaking"]["minus_softmax"]["0.5"]
    assert lo <= mean <= hi and 0 < p <= 1
    assert "### Copy gate (native θ)" in (res / "tables.md").read_text()
    for how in ("theta50", "qwen", "yarn", "llama4"):  # θ x 50: every model; a rescaling: softmax, vs native softmax
        got = summary[f"copy_gate_{how}"]
        assert set(got) == ({"softmax", "stickbreaking"} if how == "theta50" else {"softmax"})
        assert "minus_softmax" in got["softmax"]  # paired with the native-θ softmax, seed by seed
    for s in (1, 2):
        assert (res / f"s{s}" / "copy" / "copy.png").stat().st_size > 0
        assert json.load(open(res / f"s{s}" / "copy_llama4" / "summary.json"))["args"]["llama4_floor"] == 64
        assert (res / f"s{s}" / "eval_long_theta" / "summary.json").is_file()
