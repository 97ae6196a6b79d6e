"""lib/progress.py: an evaluation off a terminal (a log file, nohup, reproduce.py's capture; here capsys) prints a
progress line at most every EVERY_S seconds, naming the batches done of the total, the time elapsed and the ETA, in
eval_long.py, eval_rows.py and eval_copy.py alike; a terminal keeps tqdm's bar. A tiny untrained model, CPU only."""
import sys

import pytest
from tqdm import tqdm

import eval_copy
import eval_long
import eval_rows
import test_copy_gate
import test_eval_long
from lib import longrange, progress

ckpt, data_dir = test_copy_gate.ckpt, test_eval_long.data_dir  # their fixtures: a tiny model, real Shakespeare
N = test_copy_gate.N  # the block_size: eval_copy's two spans and its lead fit in it
SPAN = str((N - longrange.LEAD) // 2)


def test_progress_lines_wait_every_s_between_two_and_name_done_total_elapsed_and_eta(monkeypatch, capsys):
    now = [0.0]
    monkeypatch.setattr(progress.time, "time", lambda: now[0])
    bar = progress.Lines(10, "batch", 30)
    bar.set_description("m")
    for t in (10, 29, 31, 40, 61):  # a line at 31 s and at 61 s, 30 s after it
        now[0] = t
        bar.update()
    assert capsys.readouterr().out.splitlines() == ["m: batch 3/10, elapsed 0:00:31, eta 0:01:12",
                                                    "m: batch 5/10, elapsed 0:01:01, eta 0:01:01"]


# each script: its arguments, the description of each batch's line (checkpoint 1 of 1, 3 sequences, 2 a batch)
@pytest.mark.parametrize("main,args,descs", [
    (eval_long.main, ["--length", str(N)], 2 * [f"softmax extended L={N}"] + 2 * [f"softmax native L={N}"]),
    (eval_rows.main, ["--ckpt"], 2 * ["softmax"]),
    (eval_copy.main, ["--distances", "1", "--span", SPAN], 8 * ["softmax #1"]),  # 1 N, 0.5 N: copies and controls
], ids=["eval_long", "eval_rows", "eval_copy"])
def test_an_evaluation_off_a_terminal_prints_a_progress_line_naming_batches_done_of_total(main, args, descs, ckpt,
                                                                                         data_dir, tmp_path,
                                                                                         monkeypatch, capsys):
    monkeypatch.setattr(progress, "EVERY_S", 0)  # a line at every batch: no waiting for 30 s
    main([*args, str(ckpt), "--data", data_dir, "--num_seqs", "3", "--batch_size", "2",
          "--out_dir", str(tmp_path / "o")])
    lines = [line for line in capsys.readouterr().out.splitlines() if ": batch " in line]
    assert [line.split(", elapsed ")[0] for line in lines] == [f"{d}: batch {i}/{len(descs)}"
                                                               for i, d in enumerate(descs, 1)]
    assert lines[-1].endswith(", eta 0:00:00")


def test_a_terminal_keeps_tqdms_bar(monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    bar = progress.bar(3)
    assert isinstance(bar, tqdm)
    bar.close()
