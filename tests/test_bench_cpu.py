"""bench/attention_cpu.py, the CPU benchmark: a tiny run prints and writes its table, and a bad value (or an --out
folder that does not exist) is one error line before anything is timed, not a traceback after the whole run."""
import importlib.util
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))  # as running it does: train_speed.py beside it
_spec = importlib.util.spec_from_file_location("bench_attention_cpu", os.path.join(REPO, "bench", "attention_cpu.py"))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_a_tiny_run_writes_one_row_per_scorer_and_path(tmp_path, capsys):
    out = tmp_path / "cpu.md"
    bench.main(["--T", "16", "--scorers", "softmax", "ssmax", "--train_steps", "0", "--threads", "1",
                "--out", str(out)])
    rows = [line for line in out.read_text().splitlines() if line.startswith("| 16 |")]
    assert [tuple(r.split(" | ")[1:3]) for r in rows] == [("softmax", "F.sdpa (baseline)"), ("softmax", "sdpa"),
                                                          ("ssmax", "sdpa")]
    assert rows[0].endswith("| 1.00 |")  # the baseline against itself
    printed = capsys.readouterr().out
    assert all(row in printed for row in rows)  # printed as it goes, then written


@pytest.mark.parametrize("argv, words", [(["--train_steps", "-1"], "--train_steps -1"), (["--T", "64", "0"], "--T 0"),
                                         (["--threads", "0"], "--threads 0"), (["--p", "0"], "--p 0.0"),
                                         (["--p", "200"], "--p 200.0"), (["--train_block", "0"], "--train_block 0"),
                                         (["--out", "no/such/folder/cpu.md"], "its folder does not exist")])
def test_a_bad_value_is_one_error_line_before_anything_is_timed(argv, words, capsys):
    with pytest.raises(SystemExit) as e:  # --train_steps -1 was a StatisticsError, a missing --out folder a
        bench.main(argv)                  # FileNotFoundError, after the whole benchmark had run
    assert str(e.value.code).startswith("error: ") and words in str(e.value.code) and "\n" not in str(e.value.code)
    assert capsys.readouterr().out == ""  # nothing timed
