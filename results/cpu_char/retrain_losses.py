"""Seeds whose training logs were lost with a machine (RESULTS.md: status at 17:05 UTC on 2026-11-26, revised at
17:25): train their softmax (both legs, as reproduce.py) and their SSA again by the commands steps.jsonl recorded,
one seed per core, and keep the logs the report reads. Only the "SSA: lower loss than softmax" claim reads them: a
seed's pair is trained on one machine, as every seed's variants are (train.py is bit-identical on one machine, not
across machines). Then rerun reproduce.py (it trains nothing) and verdicts.py.

    .venv/bin/python results/cpu_char/retrain_losses.py [--seeds 1339 1340]   # ~25 min on 2 cores
"""
import argparse, json, os, sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root
from lib.runs import StepError, Steps, keep_train_log  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = ("train softmax to the switch", "train softmax", "train ssa")  # the order reproduce.train_all ran them


def recorded_steps():
    recorded = {}
    for line in open(os.path.join(HERE, "steps.jsonl")):
        r = json.loads(line)
        recorded.setdefault(r["step"], r["command"].split(" "))  # the first run of a step (reruns resumed it)
    return recorded


def check(seed, recorded):
    for name in STEPS:
        if f"{name} (seed {seed})" not in recorded:
            raise StepError(f"--seeds {seed}: {HERE}/steps.jsonl records no step '{name} (seed {seed})'")


def retrain(seed, steps):
    recorded = recorded_steps()
    check(seed, recorded)
    for name in STEPS:
        cmd = recorded[f"{name} (seed {seed})"]
        steps.run(f"re{name} (seed {seed}, its log was lost)", cmd, threads=1)  # logged in steps.jsonl
    runs = next(a.split("=", 1)[1].strip("'") for a in recorded[f"train ssa (seed {seed})"] if a.startswith("out_dir="))
    keep_train_log(os.path.dirname(runs), ["softmax", "ssa"], os.path.join(HERE, f"s{seed}", "train_log.csv.gz"))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1339, 1340])
    a = p.parse_args()
    try:
        for seed in a.seeds:  # before Steps, which writes wall.json into this folder
            check(seed, recorded_steps())
        steps = Steps(HERE)
        with ThreadPoolExecutor(len(a.seeds)) as pool:
            list(pool.map(lambda seed: retrain(seed, steps), a.seeds))
    except StepError as e:
        sys.exit(f"error: {e}")
