"""
The data a run trained on, recorded and checked: the sha256 of a prepared dataset's splits (meta.json's) that a run's
checkpoints keep in their data_state (data_identity), with the earlier splits its weights saw through an init_from's
parent (data_state), a resume refused on a dataset prepared again since, and what an evaluation records of the data
it reads a checkpoint on, warning where a run's own dataset was prepared again (data_provenance); and the code a
result names (code: commit, uncommitted diff, CPU kernels), one label for both suites' made_at.
"""
import os, sys

from lib.corpora import DataError
from lib.meta import read_meta

def data_folder(cfg):
    """The prepared dataset a run's config (train.py's) trained on, None where it names none (an import)."""
    return os.path.join(cfg.get("data_dir", "data"), cfg["dataset"]) if cfg.get("dataset") else None

def kept_identity(sha, ckpt, key, changed):
    """sha, the hash of the data a run trains on (a dataset's splits, an SFT file), which its checkpoints keep in
    data_state[key]; given the checkpoint a resume continues, DataError(changed) where it kept another: going on
    would train on data other than its own. None on either side (an older checkpoint, no meta.json) is no difference."""
    had = ((ckpt or {}).get("data_state") or {}).get(key)
    if had and sha and had != sha:
        raise DataError(changed)
    return sha

def data_identity(data_dir, ckpt=None):
    """meta.json's sha256 of the prepared splits a run trains on (None: no meta.json), checked against a resume's
    checkpoint (kept_identity): a dataset prepared again since (another seed, val_frac or text) would train it on
    documents its val loss had held out."""
    sha = (read_meta(data_dir) or {}).get("sha256")  # checked: DataError where malformed
    folder = data_folder((ckpt or {}).get("config") or {})
    elsewhere = folder and os.path.realpath(folder) != os.path.realpath(data_dir)
    return kept_identity(sha, ckpt, "sha256", (
        f"this resume names the dataset {data_dir}, but its checkpoint trained on {folder} (its config's "
        f"data_dir/dataset): a resume goes on with its own data; give data_dir and dataset as they were, or start a "
        f"new run from the checkpoint (init_from=<its ckpt.pt>)") if elsewhere else (
        f"{data_dir} was prepared again since this run trained on it (its splits' sha256 differ from the "
        f"checkpoint's): resuming would train on val documents; prepare it as it was (meta.json's args); a new run "
        f"(init_from=<its ckpt.pt>) would hold out val documents it trained on"))

def data_state(data_dir, ckpt, path, resuming, warn=True):
    """What a language-model run's data_state keeps of its splits: their sha256 (data_identity; a resume's checked)
    and earlier_sha256, the other splits of this folder its weights trained on (an init_from's parent on the folder
    as prepared then, along a chain), which data_provenance compares too; one warning where a new run has some."""
    sha = data_identity(data_dir, ckpt if resuming else None)
    parent, folder = (ckpt or {}).get("data_state") or {}, data_folder((ckpt or {}).get("config") or {})
    own = resuming or bool(folder) and os.path.realpath(folder) == os.path.realpath(data_dir)
    seen = [*parent.get("earlier_sha256", []), parent.get("sha256")] if own and sha else []  # dicts: no set
    earlier = [s for i, s in enumerate(seen) if s and s != sha and s not in seen[:i]]
    if earlier and warn and not resuming:
        print(f"warning: {path} trained on {data_dir} before it was prepared again: this new run's val may hold "
              f"documents its weights trained on (its data_state's earlier_sha256 keeps those)", file=sys.stderr)
    return {"sha256": sha, **({"earlier_sha256": earlier} if earlier else {})}

DATA_KEYS = ("sha256", "earlier_sha256")  # what best.pt keeps of data_state

def splits_kept(state):
    """What of a data_state names the splits its weights trained on, which data_provenance compares (DATA_KEYS):
    sha256 (None where unknown), earlier_sha256 where the run has one. best.pt keeps it, an SFT run its parent's."""
    data = {"sha256": None, **(state or {})}
    return {k: data[k] for k in DATA_KEYS if k in data}

def data_provenance(path, ckpt, data_dir):
    """What an evaluation records of the data it reads a checkpoint on (each model's data_sha256, trained_sha256:
    None where unknown; data_prepared_again), and one warning line where data_dir is the folder the run trained on
    (its config's data_dir/dataset) prepared again since: its val documents may have been trained on. Another folder
    is no warning (another corpus is a choice); neither is an older checkpoint that kept no sha256. The splits its
    weights saw before (earlier_sha256: an init_from's parent on the folder as prepared then) count too."""
    cfg, state = ckpt.get("config") or {}, ckpt.get("data_state") or {}
    trained, sha = state.get("sha256"), data_identity(data_dir)
    folder = data_folder(cfg)
    own = bool(folder) and os.path.realpath(folder) == os.path.realpath(data_dir)
    again = bool(own and sha and any(s and s != sha for s in [trained, *state.get("earlier_sha256", [])]))
    if again:
        print(f"warning: {path} trained on {data_dir} before it was prepared again (a sha256 of the splits its "
              f"checkpoint records differs): its val documents may have been trained on; prepare it as it was then "
              f"(meta.json's args say how it is now), or evaluate on another dataset", file=sys.stderr)
    return dict(data_sha256=sha, trained_sha256=trained, data_prepared_again=again)


def code(info):
    """The code a run_info names: its commit, "+dirty:<diff hash>" where uncommitted changes ran too, " on <the CPU
    kernels' instruction set>" where recorded (AVX2's and AVX-512's train to other weights) (None: none)."""
    if isinstance(info, dict) and info.get("git_sha"):
        return (info["git_sha"] + f"+dirty:{info.get('git_diff_sha256')}" * bool(info.get("git_dirty"))
                + f" on {info.get('cpu_capability')}" * bool(info.get("cpu_capability")))
