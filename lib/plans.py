"""
Pre-registration that git can check (reproduce.py --commit-results). A reproduction that will support verdicts reads
its rule from results/<name>/plan.md, committed before the run starts: begin() refuses a plan that is missing, not
committed or changed since its commit, and records the plan's commit and the run's start in results/<name>/plan_run.json
(the first call's: a resumed run keeps it); finish() refuses, before summary.json is written, a plan that has changed
since the run began, and returns what summary.json records. A run without --commit-results needs no plan.
"""
import datetime, json, os, subprocess

from lib.folders import write_json
from lib.runs import StepError

PLAN, RECORD = "plan.md", "plan_run.json"


class PlanError(StepError):
    """A plan missing, uncommitted or changed since the run began: reproduce.py prints it as one line."""


def _git(cwd, *args):
    r = subprocess.run(["git", "-C", cwd, *args], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def committed(results):
    """{path, blob, commit, committed_at} of results/plan.md as HEAD holds it; PlanError unless the file is there,
    committed, and the same as its committed blob."""
    path = os.path.abspath(os.path.join(results, PLAN))
    hint = "write the run's rule there and commit it before the run starts"
    if not os.path.isfile(path):
        raise PlanError(f"{os.path.join(results, PLAN)} is missing: --commit-results needs a plan; {hint}")
    top = _git(os.path.dirname(path), "rev-parse", "--show-toplevel")
    if top is None:
        raise PlanError(f"{path} is not in a git repository: its commit cannot be checked")
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(top))
    blob, now = _git(top, "rev-parse", f"HEAD:{rel}"), _git(top, "hash-object", rel)
    if blob is None:
        raise PlanError(f"{rel} is not committed: {hint}")
    if blob != now:
        raise PlanError(f"{rel} differs from its committed version: commit the plan before the run starts")
    commit, when = _git(top, "log", "-1", "--format=%H %cI", "--", rel).split()
    return dict(path=rel, blob=blob, commit=commit, committed_at=when)


def begin(results):
    """At a --commit-results run's start: the committed plan and this run's start, recorded in plan_run.json by the
    run's first call; a later call (a resume) refuses a plan other than the one the run began with."""
    plan, record = committed(results), os.path.join(results, RECORD)
    if os.path.isfile(record):
        with open(record) as f:
            first = json.load(f)
        _same(first, plan)
        return first
    first = dict(plan, run_started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    write_json(record, first, indent=1)
    print(f"plan: {plan['path']} at commit {plan['commit'][:12]} ({plan['committed_at']})", flush=True)
    return first


def finish(results, began):
    """Before summary.json: the plan unchanged since the run began, and still committed; what summary.json records."""
    path = os.path.abspath(os.path.join(results, PLAN))
    now = os.path.isfile(path) and _git(os.path.dirname(path), "hash-object", path)
    _same(began, dict(began, blob=now))  # edited, committed or not
    _same(began, committed(results))
    return began


def _same(began, plan):
    if plan["blob"] != began["blob"]:
        raise PlanError(f"{began['path']} has changed since the run began at {began['run_started']} (under commit "
                        f"{began['commit'][:12]}): results must rest on the plan they started under; restore it, or "
                        f"start a new run (another --name, or remove {RECORD})")
