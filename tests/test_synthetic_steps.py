"""The synthetic suite's steps without training (synthetic.py): a worker's script run, one run's train.py and
eval_tasks.py command lines, what a step killed part-way leaves for the next call, the worker count and the wall
time. train.py and eval_tasks.py are replaced by stand-ins that write what the suite reads; no process is spawned."""
import concurrent.futures
import dataclasses
import json
import os
import sys
import types

import pytest
import torch

from lib import runs, synthetic

E = dataclasses.replace(synthetic.SUITE["first"], multiples=(1, 2), n_eval=3)  # its own prompt count: 3
N = 24  # the stand-in's block size (the task's is 32)


def _stand_ins(calls, fail=None):
    """synthetic._run's stand-in: train.py writes a checkpoint and log.jsonl, eval_tasks.py per_prompt.csv; `fail`
    (a script) raises after its checkpoint or before its prompts ("late": after them), as a run killed part-way."""
    def run(script, argv, log):
        calls.append((script, argv))
        if script == "train.py":
            out = next(a.removeprefix("out_dir=") for a in argv if a.startswith("out_dir="))
            os.makedirs(out, exist_ok=True)
            open(os.path.join(out, "ckpt.pt"), "w").close()
            with open(os.path.join(out, "log.jsonl"), "w") as f:
                f.write(json.dumps({"config": {"block_size": N}}) + "\n")
        if script == fail:
            raise runs.StepError(f"{script} killed")
        if script == "eval_tasks.py":
            out = argv[argv.index("--out_dir") + 1]
            os.makedirs(out, exist_ok=True)
            open(os.path.join(out, "per_prompt.csv"), "w").close()
        if fail == f"{script} late":
            raise runs.StepError(f"{script} killed late")
    return run


def _one(tmp_path, seed=0, over=("max_iters=2",), n_eval=4, redo=False, e=E):
    return synthetic.run_one("first", "softmax", seed, str(tmp_path), n_eval, e, list(over), redo)


def test_run_gives_the_script_its_argv_and_log_restores_argv_and_reports_only_a_failed_exit(tmp_path):
    script, log = tmp_path / "s.py", str(tmp_path / "s.log")
    script.write_text("import sys\nprint('argv', sys.argv[1:])\nif sys.argv[1] != 'ok': sys.exit(sys.argv[1])\n")
    argv = sys.argv[:]
    synthetic._run(str(script), ["ok"], log)  # os.path.join(REPO, an absolute path): the path itself
    with pytest.raises(runs.StepError) as e:
        synthetic._run(str(script), ["error: boom"], log)
    assert str(e.value) == f"boom (log: {log})"  # reproduce.py adds the one "error: "
    assert sys.argv == argv
    assert open(log).read().splitlines()[:2] == ["argv ['ok']", "argv ['error: boom']"]


def test_run_treats_a_zero_exit_status_as_success(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import sys\nsys.exit(0)\n")
    synthetic._run(str(script), [], str(tmp_path / "s.log"))


def test_each_seed_trains_with_its_own_seed_resuming_and_evaluates_at_multiples_of_its_block_size(tmp_path,
                                                                                                   monkeypatch):
    calls = []
    monkeypatch.setattr(synthetic, "_run", _stand_ins(calls))
    for seed in (0, 1):
        assert _one(tmp_path, seed)["ran"]
    trains = [argv for script, argv in calls if script == "train.py"]
    assert [a for a in trains[0] if a.startswith("seed=")] == ["seed=0"] and "seed=1" in trains[1]
    assert trains[1][-2:] == [f"out_dir={tmp_path / 'first-softmax-s1'}", "resume=True"]
    assert trains[1][0].endswith(os.path.join("configs", "tasks", "first.py")) and "max_iters=2" in trains[1]
    ev = calls[-1][1]
    assert ev[ev.index("--lengths") + 1:ev.index("--n")] == [str(N), str(2 * N)]
    assert ev[ev.index("--n") + 1] == "3" and ev[ev.index("--diagnose") + 1] == "32"
    assert ev[0] == str(tmp_path / "first-softmax-s1" / "ckpt.pt")
    calls.clear()
    assert not _one(tmp_path, 1)["ran"] and calls == []  # both steps done with these settings: reused


def test_a_run_killed_after_its_checkpoint_refuses_other_settings_naming_those_it_started_with(tmp_path,
                                                                                               monkeypatch):
    calls = []
    monkeypatch.setattr(synthetic, "_run", _stand_ins(calls, fail="train.py"))
    with pytest.raises(runs.StepError, match="train.py killed"):
        _one(tmp_path)
    with pytest.raises(runs.StepError, match=r"the unfinished run .*max_iters=2.*->.*max_iters=3"):
        _one(tmp_path, over=("max_iters=3",))
    monkeypatch.setattr(synthetic, "_run", _stand_ins(calls))
    assert _one(tmp_path)["ran"]  # its own settings: it resumes
    assert [s for s, _ in calls] == ["train.py", "train.py", "eval_tasks.py"]


def test_an_evaluation_killed_before_its_prompts_were_written_runs_again(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(synthetic, "_run", _stand_ins(calls, fail="eval_tasks.py"))
    with pytest.raises(runs.StepError, match="eval_tasks.py killed"):
        _one(tmp_path)
    monkeypatch.setattr(synthetic, "_run", _stand_ins(calls))
    assert _one(tmp_path)["ran"]  # its settings were recorded, its output never written
    assert [s for s, _ in calls] == ["train.py", "eval_tasks.py", "eval_tasks.py"]
    assert (tmp_path / "first-softmax-s0" / "eval" / "per_prompt.csv").exists()


def test_an_evaluation_killed_after_its_prompts_refuses_other_settings_naming_those_it_started_with(tmp_path,
                                                                                                  monkeypatch):
    e = dataclasses.replace(E, n_eval=None)  # the suite's prompt count: n_eval
    monkeypatch.setattr(synthetic, "_run", _stand_ins([], fail="eval_tasks.py late"))
    with pytest.raises(runs.StepError, match="killed late"):
        _one(tmp_path, n_eval=4, e=e)
    with pytest.raises(runs.StepError, match=r"the evaluation .*\"4\" -> \"5\".*--redo"):
        _one(tmp_path, n_eval=5, e=e)


def test_each_worker_runs_on_one_thread(monkeypatch):
    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    synthetic._one_core()
    assert threads == [1]


class _Pool:
    """ProcessPoolExecutor's stand-in: runs each submitted call at once in this process."""
    made = []

    def __init__(self, jobs, mp_context=None, initializer=None):
        self.made.append((jobs, initializer))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, fn, *args):
        f = concurrent.futures.Future()
        f.set_result(fn(*args))
        return f


def test_suite_runs_jobs_workers_and_its_wall_time_counts_only_runs_that_trained_or_evaluated(tmp_path,
                                                                                               monkeypatch):
    clock = iter(range(0, 10_000, 10))  # each reading of the clock: 10 s later
    monkeypatch.setattr(synthetic, "time", types.SimpleNamespace(time=lambda: next(clock)))
    monkeypatch.setattr(synthetic, "ProcessPoolExecutor", _Pool)
    ran = {0: True, 1: False}  # seed 1's run was reused
    monkeypatch.setattr(synthetic, "run_one", lambda t, s, seed, *a: dict(task=t, setting=s, seed=seed, train_s=1.0,
                                                                         eval_s=1.0, ran=ran[seed],
                                                                         made_at=dict(train=[None], eval=None)))
    reports = []
    report = type("Report", (), {"report": staticmethod(lambda *a: reports.append(a))})
    (tmp_path / "wall.json").write_text('{"wall_s": 100}')  # an earlier call's
    _Pool.made.clear()
    synthetic.suite(str(tmp_path), str(tmp_path), [("first", "softmax", 0), ("first", "softmax", 1)], 3, 4, "cmd",
                    ["first"], False, report)
    assert _Pool.made == [(3, synthetic._one_core)]
    # t0, last = 0, 10; seed 0 (its print reads 20) adds 30 - 10 to the earlier 100; seed 1, reused, adds nothing
    assert json.loads((tmp_path / "wall.json").read_text()) == {"wall_s": 120}
    assert reports[0][3]["wall_s"] == 120 and reports[0][3]["jobs"] == 3


@pytest.mark.parametrize("scale,jobs", [(None, 2), ("gpu", synthetic.GPU["jobs"])])
def test_the_worker_count_is_two_on_the_cpu_and_the_gpu_scales_side_by_side_runs(scale, jobs, tmp_path, monkeypatch):
    monkeypatch.setattr(synthetic, "REPO_OUT", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the GPU scale's check passes
    got = []
    monkeypatch.setattr(synthetic, "suite", lambda runs, results, todo, jobs, *a, **k: got.append(jobs))
    synthetic.main(scale=scale)
    assert got == [jobs]
