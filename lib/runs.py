"""
Running a reproduction's steps (reproduce.py): one step = one script's command line, skipped when its output
exists and was made with the settings asked for now, logged with its wall time and those settings (steps.jsonl). The
runs folder (out-repro-<name>/: checkpoints, train.py's logs) is scratch: it does not outlive the machine, so what
the report needs from it is kept beside the results (train_log.csv.gz), and training runs again only when an
evaluation that needs its checkpoints is missing; each seed's runs record the training they hold (settings.json).
A reproduction reads the same way as the synthetic suite: settings that differ from a step's record refuse in one
line (StepError) unless redo is asked. A step's settings are recorded before it runs (started.json) and again when it
is done (steps.jsonl), so an output left by a kill is judged by what it was started with; one with no record is of
other settings, except where the records predate settings (a whole folder's, or the step's line): taken as it is,
with a warning, where the training its folder's summary.json says (`made`, kept as it is rewritten; none: not known)
and its own args (the test texts' seed, the labels) are the ones asked, else refused.
"""
import csv, glob, gzip, json, os, shutil, subprocess, sys, threading, time

from lib.checkpoint import RUN_FILES, read_checkpoint
from lib.folders import finish_moves, replace_synced, write_json
from lib.report import read_json

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# make glibc keep freed memory: no page faults per batch
REUSE_FREED_MEMORY = dict(MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(2**31 - 1))
TRAIN_LOG = ("variant", "iter", "loss", "train_loss", "val_loss")
ADDED = ("sha256", "values")  # a training record's fields added since settings were first recorded (lm_suite)
MADE = ("model", "train", "dataset")  # what a summary.json's config says of the training (lm_suite.trained_with's)


class StepError(Exception):
    """A step done with other settings than asked, or one that failed: reproduce.py prints it as one line."""


def done(path):
    if path and os.path.dirname(path):  # a move cut by a kill (needle.py's shared folder): the rerun would refuse it
        finish_moves(os.path.dirname(path))
    return bool(path) and os.path.exists(path)


def plain(x):
    """x as JSON reads it back (tuples as lists): what a record compares equal to."""
    return json.loads(json.dumps(x))


def differences(old, new, prefix=""):
    """The fields where two settings differ, in words (`train.max_iters 20 -> 40`, `overrides.4 "a" -> "b"`)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in dict.fromkeys([*old, *new]) for d in differences(old.get(k), new.get(k), f"{prefix}{k}.")]
    if isinstance(old, list) and isinstance(new, list) and old != new:
        if len(old) == len(new):
            return [d for i, (a, b) in enumerate(zip(old, new)) for d in differences(a, b, f"{prefix}{i}.")]
        gone, added = [x for x in old if x not in new], [x for x in new if x not in old]
        return [f"{prefix[:-1]}" + f" without {json.dumps(gone)[:80]}" * bool(gone) + f" with {json.dumps(added)[:80]}"
                * bool(added)]
    return [] if old == new else [f"{prefix[:-1]} {json.dumps(old)[:60]} -> {json.dumps(new)[:60]}"]


def refuse(what, diff):
    return StepError(f"{what} was made with other settings than asked now ({'; '.join(diff[:3])}"
                     f"{'; ...' if len(diff) > 3 else ''}): --redo runs it again with these (its output is replaced), "
                     f"or use another --name")


def remove(*paths):
    for p in paths:
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.remove(p)


def mismatch(old, want, whole=True, known=True, made=None, own=()):
    """What judge() finds different between `old`, a step's record, and `want`, in words ([]: the same). known False:
    no record at all, in a folder that records settings (a run cut short before its record): not known. An output
    recorded before settings were (None) is judged by `made`, the training its folder's summary.json says (Steps.made;
    {}: not known; None: not judged so), `own`, where its args differ from the command (Steps.own), and `whole`."""
    if old is None and not known:
        return ["an output with no record of its settings (its run was cut short before recording them)"]
    if old is None and made is not None and isinstance(plain(want).get("train"), dict):  # a step reading a training
        had, now = made or {}, plain(want)["train"]
        diff = differences({k: had.get(k) for k in MADE}, {k: now.get(k) for k in MADE}, "train.")
        said = [f"summary.json's {d}" for d in diff] if made else ["its training (no summary.json says it: not known)"]
        own = [*said, *own]
    if old is None and own:
        return own
    if old is None:
        return [] if whole else ["an output made before settings were recorded, without all that is asked now"]
    return differences(old, plain(want))


def dated(old, want):
    """`old`, the record of a step or runs folder, as judged against `want`: a field of its training ("train") added
    since (ADDED, or one of the config's values) is taken at today's value, as lib/synthetic.py's reuse() takes it."""
    had, now = (old or {}).get("train"), plain(want).get("train")
    if not (isinstance(had, dict) and isinstance(now, dict)):
        return old
    had = {**had, **{k: now[k] for k in ADDED if k in now and k not in had}}
    if isinstance(had.get("values"), dict) and isinstance(now.get("values"), dict):
        had["values"] = {k: had["values"].get(k, v) for k, v in now["values"].items()}
    return {**old, "train": had}


def judge(old, want, what, redo, clear, whole=True, known=True, made=None, own=()):
    """True if `old`, what a step's record says it was made with, is `want`, or is a record from before settings were
    (None) that mismatch() takes as it is (with a warning). Other settings: StepError, or with redo the `clear` paths
    are removed and False (it is made again)."""
    diff = mismatch(old, want, whole, known, made, own)
    if old is None and not diff:
        print(f"warning: {what}: made before settings were recorded; taken as it is, as every output older than "
              f"settings records is", flush=True)
        return True
    if diff and not redo:
        raise refuse(what, diff)
    if diff:
        print(f"[redo] {what}: " + "; ".join(diff))
        remove(*clear)
    return not diff


class Steps:
    """One reproduction's step runner over its results folder: what each step was started with (started.json, until
    it is done) and done with (steps.jsonl), the wall time of every call up to its last finished step (wall.json, so
    an interrupted call counts), redo, and what became of the steps this call skips (skip())."""

    def __init__(self, results, redo=False, made=None, own=None):
        self.results, self.redo, self.lock, self.t0 = results, redo, threading.Lock(), time.time()
        self.recorded = {}  # step name -> its last settings; None where it ran before settings were recorded
        if os.path.isfile(os.path.join(results, "steps.jsonl")):
            for line in open(os.path.join(results, "steps.jsonl")):
                r = json.loads(line) if line.strip() else {}
                if "step" in r:
                    self.recorded[r["step"]] = r.get("settings")
        self.started = read_json(results, "started.json") or {}  # started, not yet done: later than steps.jsonl
        self.recorded.update(self.started)
        # a folder whose records all predate settings: an output with no record is taken as it is, as theirs are,
        # where the training they had (made: lm_suite.unrecorded_training, from its summary.json) is the one asked
        self.legacy = bool(self.recorded) and not any(self.recorded.values())
        self.made, self.own = made, own or (lambda out, settings: [])  # own: lm_suite.own_args
        summary = read_json(results, "summary.json") or {}
        self.used = set()  # the steps whose outputs this call reuses or makes: ran() reads their records
        self.skipped, self.left_out = {}, set()  # skip(): step -> what became of it; outputs a report must not read
        self.reused = {}  # step -> its output, made by an earlier call (lm_suite.made_at: at which commit)
        wall = read_json(results, "wall.json")
        first = wall is None and "wall_s" in summary  # from before wall.json: its wall_s timed the last call alone
        wall = dict(wall_s_before="unknown", wall_s_legacy_last_call=summary["wall_s"]) if first else wall or {}
        self.wall0 = wall.get("wall_s", 0.0)  # the calls since; wall_notes: what is known of those before
        self.wall_notes = {k: v for k, v in wall.items() if k.startswith("wall_s_")}
        if first:  # kept: else a call that runs no step would pass its own time for the legacy call's
            self.tick()

    def reuse(self, name, settings, clear=(), whole=True, out=None):
        """judge() of step `name`, whose output `out` exists, against its record."""
        ok = judge(dated(self.recorded.get(name), settings), settings, f"step {name!r} in {self.results}", self.redo,
                   clear, whole, name in self.recorded or self.legacy, self.made, self.own(out, settings))
        if ok:
            self.used.add(name)
            self.reused[name] = out
        return ok

    def skip(self, name, out, settings, clear=(), whole=True):
        """A step this call does not run (--skip): True where its output `out` was made with `settings` (it counts);
        else it is left out (self.left_out), or with redo removed: a summary holds only what was made as asked now."""
        if not done(out):
            self.skipped[name] = "not made"
            return False
        old = dated(self.recorded.get(name), settings)
        diff = mismatch(old, settings, whole, name in self.recorded or self.legacy, self.made, self.own(out, settings))
        if not diff:
            self.used.add(name)
            self.reused[name] = out
            self.skipped[name] = "kept: made with the settings asked now" if old else \
                "kept: made before settings were recorded, taken as it is"
            return True
        self.left_out.add(os.path.normpath(out))
        if self.redo:
            remove(*clear)
        self.skipped[name] = (f"{'removed (--redo)' if self.redo else 'left out of the summary'}: made with other "
                              f"settings ({'; '.join(diff[:3])})")
        print(f"[--skip] {name}: {self.skipped[name]}", flush=True)
        return False

    def run(self, name, cmd, out=None, threads=None, settings=None, clear=(), whole=True):
        """Run one command unless `out` (a path) exists and was made with `settings` (default: the command line);
        log its command line, wall time and settings. threads: its cores. clear: what --redo removes first. whole:
        False where `out` lacks part of what is asked (an unrecorded older output then counts as other settings)."""
        settings = plain(settings or {"command": cmd})
        if done(out) and self.reuse(name, settings, clear or [out], whole, out):
            print(f"[skip] {name}: {out} exists")
            return
        print(f"[run] {name}: {' '.join(cmd)}", flush=True)
        self.record_start(name, settings)  # before its output can exist: a kill leaves what it was made with
        t0 = time.time()
        rc = subprocess.run([sys.executable, os.path.join(REPO, cmd[0]), *cmd[1:]],  # outputs under the cwd
                            env={**os.environ, **REUSE_FREED_MEMORY,
                                 **({"OMP_NUM_THREADS": str(threads)} if threads else {})}).returncode
        if rc:
            raise StepError(f"step {name!r} failed (exit status {rc}; its output is above); rerun the same command "
                            f"to resume: finished steps are kept")
        with self.lock, open(os.path.join(self.results, "steps.jsonl"), "a") as f:
            f.write(json.dumps(dict(step=name, command=" ".join(cmd), wall_s=round(time.time() - t0, 1),
                                    settings=settings)) + "\n")
            self.recorded[name] = settings
            self.used.add(name)
            self.started.pop(name, None)  # after its steps.jsonl line: a kill between them leaves the same settings
            self.write_started()
            self.tick()

    def record_start(self, name, settings):
        with self.lock:
            self.started[name] = self.recorded[name] = settings
            self.write_started()

    def write_started(self):
        """started.json: the steps started and not done, with their settings; none left, no file."""
        if not self.started:
            remove(os.path.join(self.results, "started.json"))
            return
        write_json(os.path.join(self.results, "started.json"), self.started, indent=1)

    def tick(self):
        """wall.json: the calls before this one (those before wall.json: not known), and this one up to now."""
        write_json(os.path.join(self.results, "wall.json"), {"wall_s": round(self.wall_s(), 1), **self.wall_notes})

    def wall_s(self):
        return self.wall0 + time.time() - self.t0

    def ran(self, key):
        """The one value of settings[key] that every step this call reused or made, holding it, was made with (e.g.
        "train"), or None where none records it or one has no record (made before settings were: not known)."""
        records = [self.recorded.get(n) for n in self.used]
        got = [r[key] for r in records if r and key in r]
        return got[0] if got and None not in records and all(g == got[0] for g in got) else None


def check_runs(root, want, redo):
    """A seed's runs folder (scratch) holds the training `want` describes ({"train": ..., "variants": {v: overrides}}):
    the same training settings, and the same overrides for every variant both name (one may add variants). Else
    StepError, or with redo the folder is removed (it trains again). Records what it will hold (settings.json). The
    splits' sha256 is judged by what its checkpoints trained on (data_state), the truth, as well as by the record."""
    path, what, sha = os.path.join(root, "settings.json"), f"the training in {root}", plain(want["train"]).get("sha256")
    have = dated(read_json(path), want)
    states = [read_checkpoint(c, mmap=True).get("data_state") or {} for c in glob.glob(os.path.join(root, "*/ckpt.pt"))]
    other = sha and next((s["sha256"] for s in states if s.get("sha256") not in (None, sha)), None)
    if other and not judge({"train": {"sha256": other}}, {"train": {"sha256": sha}}, what, redo, [root]):
        have = None  # removed: it trains again
    if have is not None:
        shared = lambda s: {"train": s["train"], "variants": {v: s["variants"][v] for v in have["variants"]
                                                                  if v in want["variants"]}}
        if not judge(shared(have), shared(want), what, redo, [root]):
            have = None  # removed: it trains again
    elif os.path.isdir(root) and os.listdir(root):  # left unrecorded: what it holds is not known
        return print(f"warning: {root} was trained before settings were recorded; its checkpoints are taken as they "
                     f"are")
    os.makedirs(root, exist_ok=True)
    variants = {**(have or {}).get("variants", {}), **plain(want["variants"])}
    write_json(path, {"train": plain(want["train"]), "variants": variants}, indent=1)


def own_folders(kind, results, runs):
    """StepError unless this suite (kind: "lm" or "synthetic") may write in results and runs: neither a results folder
    holding the other suite's (its steps.jsonl: the lm suite's records name a step) nor a train.py run's out_dir as
    runs (the synthetic suite's out-<name>: --name quick is the quickstart's out-quick/)."""
    path = os.path.join(results, "steps.jsonl")
    with open(path) if os.path.isfile(path) else open(os.devnull) as f:
        first = next((json.loads(line) for line in f if line.strip()), None)
    other = first and ("lm" if "step" in first else "synthetic")
    if other and other != kind:
        raise StepError(f"{results} holds the {other} suite's results; nothing was written: give the {kind} suite "
                        f"another --name")
    held = [f for f in RUN_FILES if os.path.isfile(os.path.join(runs, f))]
    if held:
        raise StepError(f"{runs} holds a train.py run ({', '.join(held)}); nothing was written: give the {kind} suite "
                        f"another --name")


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
    replace_synced([tmp], [path])


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
