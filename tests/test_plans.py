"""lib/plans.py: --commit-results runs only under a plan committed before it starts, and refuses one changed since the
run began; checked with git in a temporary repository (never this one's)."""
import json
import subprocess

import pytest

import reproduce
from lib import plans


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def repo_with_plan(tmp_path, text="rule: ssmax beats softmax at 128 N, p < 0.05\n"):
    """A git repository holding results/run/plan.md, committed; returns the results folder."""
    results = tmp_path / "results" / "run"
    results.mkdir(parents=True)
    (results / "plan.md").write_text(text)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "results/run/plan.md")
    git(tmp_path, "commit", "-q", "-m", "plan")
    return results


def test_a_committed_plan_is_recorded_with_its_commit_and_the_runs_start(tmp_path):
    results = repo_with_plan(tmp_path)
    began = plans.begin(str(results))
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert began["commit"] == head.strip() and began["path"] == "results/run/plan.md" and began["run_started"]
    assert json.loads((results / plans.RECORD).read_text()) == began
    assert plans.finish(str(results), began) == began  # unchanged: summary.json records it


def test_a_plan_changed_after_the_start_refuses_the_results_committed_or_not(tmp_path):
    results = repo_with_plan(tmp_path)
    began = plans.begin(str(results))
    (results / "plan.md").write_text("rule: reworded after the results\n")
    with pytest.raises(plans.PlanError, match="changed since the run began"):
        plans.finish(str(results), began)
    git(tmp_path, "commit", "-q", "-am", "reworded")  # committing the change does not make it the run's plan
    with pytest.raises(plans.PlanError, match="changed since the run began"):
        plans.finish(str(results), began)
    with pytest.raises(plans.PlanError, match="changed since the run began"):  # nor does resuming the run
        plans.begin(str(results))


def test_a_missing_uncommitted_or_edited_plan_refuses_the_start(tmp_path):
    results = tmp_path / "results" / "run"
    results.mkdir(parents=True)
    git(tmp_path, "init", "-q")
    with pytest.raises(plans.PlanError, match="plan.md is missing"):
        plans.begin(str(results))
    (results / "plan.md").write_text("rule\n")
    with pytest.raises(plans.PlanError, match="not committed"):
        plans.begin(str(results))
    git(tmp_path, "add", "results/run/plan.md")
    with pytest.raises(plans.PlanError, match="not committed"):  # staged is not committed
        plans.begin(str(results))
    git(tmp_path, "commit", "-q", "-m", "plan")
    (results / "plan.md").write_text("rule, edited\n")
    with pytest.raises(plans.PlanError, match="differs from its committed version"):
        plans.begin(str(results))
    assert not (results / plans.RECORD).exists()


def test_reproduce_commit_results_without_a_plan_is_one_error_line_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "toy").mkdir(parents=True)
    monkeypatch.setitem(reproduce.SCALES, "toy", reproduce.SCALES["cpu"])
    with pytest.raises(SystemExit, match="error: results/toy/plan.md is missing"):
        reproduce.main(["--scale", "toy", "--commit-results"])
    assert not (tmp_path / "data").exists() and not (tmp_path / "out-repro-toy").exists()


def test_the_plans_commit_is_the_one_that_last_changed_it_and_a_resume_keeps_the_first_start(tmp_path):
    results = repo_with_plan(tmp_path)
    plan_commit = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True,
                                 text=True).stdout.strip()
    (tmp_path / "other.txt").write_text("a later commit, not the plan's\n")
    git(tmp_path, "add", "other.txt")
    git(tmp_path, "commit", "-q", "-m", "later")
    began = plans.begin(str(results))
    assert began["commit"] == plan_commit
    record = json.loads((results / plans.RECORD).read_text())
    record["run_started"] = "2000-01-01T00:00:00+00:00"  # the first call's start, whatever the clock says now
    (results / plans.RECORD).write_text(json.dumps(record))
    assert plans.begin(str(results)) == record == plans.finish(str(results), record)


def test_a_plan_taken_out_of_git_after_the_start_refuses_the_results_though_its_text_is_unchanged(tmp_path):
    results = repo_with_plan(tmp_path)
    began = plans.begin(str(results))
    git(tmp_path, "rm", "-q", "--cached", "results/run/plan.md")  # the file stays, the same bytes
    git(tmp_path, "commit", "-q", "-m", "untrack the plan")
    with pytest.raises(plans.PlanError, match="not committed"):
        plans.finish(str(results), began)
