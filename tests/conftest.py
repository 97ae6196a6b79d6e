"""Test-wide environment: set before any project module (and Triton) is imported."""
import os
import sys
import tempfile

import pytest

# Triton kernels run on the CPU through the interpreter (must be set before triton is imported).
os.environ.setdefault("TRITON_INTERPRET", "1")
# pytest -n 2 on 2 cores: one thread a worker, and for the scripts it runs. torch's default (a thread per core in each
# worker) oversubscribes the cores: model, sdpa and reproduce tests took 249 s that way, 191 s this way
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# Never reach for the Hugging Face hub: a hub name fails in 1 s instead of hanging in retries.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TIKTOKEN_CACHE_DIR", os.path.join(tempfile.gettempdir(), "nanoscorer-tiktoken-test"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# CPU speed: the in-process training tests keep freed memory, as train.py does (cost.reuse_freed_memory)
from lib import cost  # noqa: E402  (after TRITON_INTERPRET and the path)
cost.reuse_freed_memory()
import torch  # noqa: E402
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # in case torch was imported before this file


def patch_triton_language_once_a_launch():
    """Triton's interpreter patches triton.language for a kernel launch, then again at every call of a @triton.jit
    helper (inspect.getmembers of four modules: 0.7 ms a call, a third of the kernel tests' time). Within a launch
    where the helper's modules (tl; tl.core for triton.language.standard's tl.sum, tl.max...) were patched already,
    by the launch or an earlier helper, that is a no-op (no builtin is left to wrap; the rest is set to the same
    stateless functions again, and nothing restores them before the launch ends): skipped there. Same kernels."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    from triton.runtime import interpreter
    if not all(hasattr(interpreter, name) for name in ("_patch_lang", "_LangPatchScope", "tl")):
        return  # another Triton's interpreter (checked on 3.7.1): the kernel tests run as they are, only slower
    patch, tl, launch = interpreter._patch_lang, interpreter.tl, []  # launch: the running launch's patched modules
    langs = lambda fn: {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}  # noqa: E731

    def patch_lang(fn):
        if launch and langs(fn) <= launch[-1]:  # a helper's call inside a launch
            return interpreter._LangPatchScope()
        scope = patch(fn)
        if launch:  # a helper's first call with a module the launch left as it was
            launch[-1] |= langs(fn)
        else:  # a launch (GridExecutor): restored at its end
            launch.append(langs(fn))
            restore = scope.restore
            scope.restore = lambda: (launch.clear(), restore())
        return scope

    interpreter._patch_lang = patch_lang


patch_triton_language_once_a_launch()

# The longest files first (their test seconds on 2 cores, 2026-11-29, beside another job's tests: 1,321 in all):
# `pytest -n 2 --dist loadfile` (.ci/run) hands files to the workers in collection order, and the suites' end-to-end
# files were collected last, so one worker ran them while the other idled (545-594 s a run; 502 s this way). A stable
# sort: each file's order kept. test_kernels.py fell from first (161 s) with the interpreter's patch above.
LONGEST_FIRST = ("test_compile.py", "test_lm_reuse.py", "test_reproduce.py",  # 180 .. 165
                 "test_kernels.py", "test_reproduce_char.py",  # 145, 144
                 "test_synthetic_reuse.py", "test_kernels_block_shapes.py", "test_synthetic.py",  # 72 .. 39
                 "test_kernels_edge_rows.py", "test_synthetic_tuning.py", "test_hf_scorers.py")  # 33 .. 25


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread on a shared CPU (and runs compared across processes match): a module
    takes it with pytestmark = pytest.mark.usefixtures("one_thread")."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def off_by_one(monkeypatch):
    """cases.OFF_BY_ONE in the registry for one test: a row-template scorer with no backend branch of its own."""
    from cases import OFF_BY_ONE
    from scorers import SCORERS
    monkeypatch.setitem(SCORERS, "off_by_one", OFF_BY_ONE)
    return "off_by_one"


@pytest.fixture
def stablemax(monkeypatch):
    """cases.STABLEMAX in the registry for one test: ssa at b = n = 1, a special case with no branch of its own."""
    from cases import STABLEMAX
    from scorers import SCORERS
    monkeypatch.setitem(SCORERS, "stablemax", STABLEMAX)
    return "stablemax"


class WritesAFile:
    """Unpickled by a loader that runs code, this object creates `path`: the payload of a malicious checkpoint."""
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def random_ids_data(tmp_path_factory, vocab, n_train=4096, n_val=1024):
    """<data_dir>/rand/{train,val}.bin of uint16 token ids < vocab (seeded), what dataset.load_split reads; returns
    data_dir. The training tests' dataset: dataset=rand with data_dir=<it>."""
    import numpy as np
    d = tmp_path_factory.mktemp("data")
    os.makedirs(d / "rand")
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("val", n_val)):
        rng.integers(0, vocab, n).astype(np.uint16).tofile(d / "rand" / f"{split}.bin")
    return str(d)


def one_line_error(main, argv):
    """main(argv)'s exit message: one "error: ..." line, no traceback; returned for the caller's own checks."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    msg = e.value.code
    assert isinstance(msg, str) and msg.startswith("error: ") and "\n" not in msg, msg
    return msg


def code_carrying_copy(src, dst, target):
    """dst: checkpoint src with code in its run_info that would create the file `target` if it ran; returns dst."""
    import torch
    torch.save({**torch.load(src, weights_only=True), "run_info": WritesAFile(str(target))}, dst)
    return str(dst)


PREPARED_AGAIN = {"train": "0" * 64, "val": "1" * 64}  # a meta.json's sha256 after the dataset was made again


def trained_on_copy(data_dir, tmp_path, ckpt_path, sha256=None):
    """data_dir copied to tmp_path/data/docs with a meta.json of its splits' sha256 (sha256 where given: the copy
    prepared again since), and ckpt_path's model saved as a run that trained on the copy as first prepared (its
    config's data_dir/dataset, data_state and codec, as train.py keeps them): (the copy, that checkpoint)."""
    import json, shutil
    from lib import dataset, vocab
    from lib.checkpoint import read_checkpoint, save_checkpoint
    copy = tmp_path / "data" / "docs"
    shutil.copytree(data_dir, copy)
    trained = {s: dataset.sha256(str(copy / f"{s}.bin")) for s in ("train", "val")}
    (copy / "meta.json").write_text(json.dumps({"sha256": sha256 or trained}))
    ckpt, path = read_checkpoint(str(ckpt_path)), tmp_path / "run" / "ckpt.pt"
    path.parent.mkdir()
    save_checkpoint({**ckpt, "config": {**(ckpt.get("config") or {}), "data_dir": str(tmp_path / "data"),
                                        "dataset": "docs"}, "data_state": {"sha256": trained},
                     "codec": ckpt.get("codec") or vocab.data_record(str(copy))}, str(path))
    return str(copy), str(path)


def warnings_of(err):
    """The warnings of a dataset prepared again (an older checkpoint's vocabulary warning aside)."""
    return [line for line in err.splitlines() if line.startswith("warning:") and "prepared again" in line]
