"""
Running a reproduction's steps (reproduce.py): one step = one script's command line, skipped when its output
exists, logged with its wall time. The runs folder (out-repro-<name>/: checkpoints, train.py's logs) is scratch: it
does not outlive the machine, so what the report needs from it is kept beside the results (train_log.csv.gz), and
training runs again only when an evaluation that needs its checkpoints is missing.
"""
import csv, gzip, json, os, subprocess, sys, time

from lib.report import read_json

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# make glibc keep freed memory: no page faults per batch
REUSE_FREED_MEMORY = dict(MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(2**31 - 1))
TRAIN_LOG = ("variant", "iter", "loss", "train_loss", "val_loss")


def kv(d):
    return [f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in d.items()]


def done(path):
    return bool(path) and os.path.exists(path)


def step(name, cmd, results, out=None, threads=None):
    """Run one command unless `out` (a path) exists; log its command line and wall time. threads: its cores."""
    if done(out):
        print(f"[skip] {name}: {out} exists")
        return
    print(f"[run] {name}: {' '.join(cmd)}", flush=True)
    t0 = time.time()
    subprocess.run([sys.executable, os.path.join(REPO, cmd[0]), *cmd[1:]], check=True,  # outputs under the cwd
                   env={**os.environ, **REUSE_FREED_MEMORY, **({"OMP_NUM_THREADS": str(threads)} if threads else {})})
    with open(os.path.join(results, "steps.jsonl"), "a") as f:
        f.write(json.dumps(dict(step=name, command=" ".join(cmd), wall_s=round(time.time() - t0, 1))) + "\n")


def complete(out_dir, variants):
    """eval_long.py's summary.json if it holds every variant, else None: it is rewritten after each model, so a
    partial one must not pass for done."""
    path = os.path.join(out_dir, "summary.json")
    summary = read_json(path)
    return path if summary and {m["label"] for m in summary["models"]} >= set(variants) else None


def iter_of(path):
    from lib.checkpoint import read_checkpoint  # mmap: reads the pickle, not the tensors
    return read_checkpoint(path, mmap=True)["iter_num"] if os.path.isfile(path) else None


def trained(path, iters):
    """path if its checkpoint reached iteration `iters`, else None: train.py checkpoints at every evaluation,
    iteration 0 included, so a run cut short leaves a ckpt.pt that must not pass for done."""
    return path if iter_of(path) == iters else None


def keep_train_log(runs, variants, path):
    """Every variant's train.py log (runs/<variant>/log.jsonl) as one gzipped CSV: each step's loss (4 decimals: a
    curve) and each evaluation's train and val loss. Written whole or not at all."""
    tmp = path + ".tmp"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.open(tmp, "wt", newline="") as f:
        w = csv.DictWriter(f, TRAIN_LOG, extrasaction="ignore")
        w.writeheader()
        for v in variants:
            for r in map(json.loads, open(os.path.join(runs, v, "log.jsonl"))):
                if "iter" in r:  # not the header (config, versions)
                    w.writerow(dict(r, variant=v, loss=round(r["loss"], 4) if "loss" in r else ""))
    os.replace(tmp, path)


def read_train_logs(results, seeds):
    """{seed: {variant: [records]}} from each seed's train_log.csv.gz; a record holds iter and what was logged
    (loss, or train_loss and val_loss). A seed without one (its runs folder lost before it was kept) is left out."""
    logs = {}
    for seed in seeds:
        path = os.path.join(results, f"s{seed}", "train_log.csv.gz")
        if os.path.isfile(path):
            with gzip.open(path, "rt", newline="") as f:
                for r in csv.DictReader(f):
                    rec = {k: (int if k == "iter" else float)(x) for k, x in r.items() if k != "variant" and x != ""}
                    logs.setdefault(seed, {}).setdefault(r["variant"], []).append(rec)
    return logs


def pack(results, seeds, keep=("gate/per_position.csv",)):
    """--commit-results: each seed's CSVs gzipped (a tenth of the size; the report reads summary.json files and
    `keep`), so ten seeds' per-sequence losses fit in the repository. Idempotent."""
    for seed in seeds:
        top = os.path.join(results, f"s{seed}")
        for folder, _, files in os.walk(top):
            for name in files:
                path = os.path.join(folder, name)
                if name.endswith(".csv") and os.path.relpath(path, top) not in keep:
                    with open(path, "rb") as f, gzip.open(path + ".gz.tmp", "wb") as g:
                        g.write(f.read())
                    os.replace(path + ".gz.tmp", path + ".gz")
                    os.remove(path)
