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
