"""
Who writes where. One writer per folder: an exclusive OS lock (flock) on <folder>.lock, beside the folder, held while
a process writes there (train.py's out_dir, an evaluation's --out_dir, a reproduction's results, a dataset being
prepared). The OS releases it when the process dies; a `with` releases it when an in-process run returns. flock also
excludes a second open in the same process (the synthetic suite's workers run train.py in-process), which POSIX
record locks do not. And the folder an evaluation writes its results into (results_dir): never over an earlier
evaluation's, never partial.
"""
import contextlib, errno, glob, json, math, os, shutil

try:
    import fcntl
except ImportError:  # not POSIX (Windows): no lock, as before
    fcntl = None


class FolderError(Exception):
    """A folder another process writes (the message names its pid), or that holds earlier results: one line."""


def sync(path):
    """path's data (a file) or its names (a folder) on the disk: a rename alone survives a kill, not a power loss or
    an OS crash, after which the new name can point at data never written (an empty or cut file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_synced(tmps, paths):
    """Each tmps[i] renamed over paths[i] in order, every file synced before the first rename, their folders after."""
    for tmp in tmps:
        sync(tmp)
    for tmp, path in zip(tmps, paths):
        os.replace(tmp, path)
    for folder in {os.path.dirname(os.path.abspath(p)) for p in paths}:
        with contextlib.suppress(OSError):  # a file system that cannot sync a folder: the renames as before
            sync(folder)


@contextlib.contextmanager
def whole(path):
    """A temporary of this process's beside path, to write in the block; renamed over path (synced) when the block
    ends, removed when it raises: path is the old file or the new one, never a part (a kill -9 may leave the
    temporary, never under path's name). Checkpoints, their copies, loss.png."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        yield tmp
        replace_synced([tmp], [path])
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def copy_whole(src, dst):
    """src copied to dst (its folder made), whole or not at all: never a cut dst that a rerun takes as made."""
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    with whole(dst) as tmp:
        shutil.copyfile(src, tmp)


def write_json(path, obj, **kw):
    """obj as JSON at path (kw: json.dump's), whole or not at all: written beside it, synced, renamed over it. A float
    nan or inf (a one-seed run's sd and interval) is written null: Python wrote NaN, which strict readers (jq, a
    browser's JSON.parse) refuse."""
    with open(path + ".tmp", "w") as f:
        json.dump(strict(obj), f, allow_nan=False, **kw)
    replace_synced([path + ".tmp"], [path])


def strict(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: strict(v) for k, v in x.items()}
    return [strict(v) for v in x] if isinstance(x, (list, tuple)) else x


def path_of(folder):  # realpath: a link to the folder (or to a folder above it) takes the folder's own lock
    return os.path.realpath(folder) + ".lock"


@contextlib.contextmanager
def held(folder, what="this folder", wait=False, active=True):
    """Hold <folder>.lock for the block, or FolderError (wait=True: block until the holder is done; active=False: no
    lock, e.g. a DDP rank that does not write). The file is removed on release; a lock whose file was removed
    meanwhile is taken again, so two holders never overlap."""
    if fcntl is None or not active:
        yield
        return
    path = path_of(folder)
    made, d = [], os.path.dirname(path)  # folders made for the lock, removed after it if still empty
    while d and not os.path.isdir(d):
        made, d = made + [d], os.path.dirname(d)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError as e:
            holder, what = _holder(fd, what)
            os.close(fd)
            _remove_empty(made)
            if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            raise FolderError(f"{folder!r} is in use: {what} is being written by process {holder} (its lock: "
                              f"{path}); wait for it to finish, or stop it") from None
        try:  # the holder before us may have removed the file: ours must be the one at `path`
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        with contextlib.suppress(OSError):  # the pid is for the message only (a full disk may refuse it)
            os.ftruncate(fd, 0)  # a killed holder's pid may be longer
            os.write(fd, f"{os.getpid()} {what}".encode())  # what the holder writes: the refused caller's message
        yield
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)  # while held: a waiter then sees a removed file and opens a new one
        os.close(fd)  # releases the lock
        _remove_empty(made)


def _remove_empty(folders):
    for d in folders:  # deepest first
        with contextlib.suppress(OSError):
            os.rmdir(d)


def _holder(fd, what):
    """The holder's pid and what it writes, from its lock file (an older holder's: the pid alone, and `what`)."""
    try:
        pid, _, theirs = os.pread(fd, 300, 0).decode(errors="replace").strip().partition(" ")
    except OSError:
        return "(unknown pid)", what
    return pid or "(pid not yet written)", theirs or what


@contextlib.contextmanager
def results_dir(out_dir, names, what="an evaluation", flag="--out_dir"):
    """The folder an evaluation (what) writes in, locked while it runs: out_dir (the option `flag` names it) is
    refused if it already holds one of `names` (the result files, the one that marks it finished last). The results
    go to a fresh folder of this process's beside it, moved into out_dir only when the evaluation finished: out_dir
    never holds a partial or mixed set of results."""
    with held(out_dir, what):
        tmp = _staged(out_dir) + str(os.getpid())
        _clear_staged(out_dir, tmp)  # a move it finishes is an earlier run's whole results: refused below
        refuse_results(out_dir, names, flag)
        os.makedirs(tmp)
        try:
            try:
                yield tmp
            except OSError as e:  # a write's (a full disk) names no file: the folder being written, for its line
                if e.strerror and not e.filename:  # (set at all, even None, it changes how a one-text OSError reads)
                    e.filename = out_dir
                raise
            for folder, _, files in os.walk(tmp):  # on the disk before a rename shows them finished (sync's why)
                for name in files:
                    sync(os.path.join(folder, name))
            try:
                os.replace(tmp, out_dir)  # one rename where out_dir is absent or empty
            except OSError:  # shared folder: file by file, marker last, after a list of them (_finish_move's)
                moving = sorted(os.listdir(tmp), key=lambda n: names.index(n) if n in names else -1)
                write_json(os.path.join(tmp, ".moving"), moving)
                for name in moving:
                    os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
            with contextlib.suppress(OSError):
                sync(os.path.dirname(os.path.abspath(out_dir)))
        finally:
            _finish_move(tmp, out_dir)  # a move cut by an exception (Ctrl-C): the rest of it, not a part lost
            shutil.rmtree(tmp, ignore_errors=True)


def _staged(out_dir):  # the stem of results_dir's staging folders beside out_dir
    return os.path.normpath(out_dir) + ".tmp-"


def _clear_staged(out_dir, tmp=None):
    """The staging folders of dead processes (and this one's, tmp) beside out_dir removed, a cut move finished first."""
    stem = _staged(out_dir)
    for old in glob.glob(glob.escape(stem) + "*"):
        if old == tmp or old[len(stem):].isdigit() and not pid_alive(int(old[len(stem):])):
            _finish_move(old, out_dir)
            shutil.rmtree(old, ignore_errors=True)


def finish_moves(out_dir):
    """What results_dir does first, alone: a killed evaluation's move into out_dir finished (reproduce.py's reuse
    check, lib/runs.done: that output counts as made, where a rerun would refuse it as an earlier run's). A folder
    in use is left to its writer."""
    if glob.glob(glob.escape(_staged(out_dir)) + "*"):
        with contextlib.suppress(FolderError), held(out_dir, "an evaluation"):
            _clear_staged(out_dir)


def _finish_move(tmp, out_dir):
    """A killed evaluation's move into a shared out_dir, finished: its results were whole (synced) before the first
    file moved, and its list of them (.moving) tells a cut move, which left out_dir a part of them, from a cut run.
    Only where that part is still there: else the staging folder is dropped as a cut run's."""
    if os.path.isfile(os.path.join(tmp, ".moving")):
        with open(os.path.join(tmp, ".moving")) as f:
            names = json.load(f)
        left = [n for n in names if os.path.isfile(os.path.join(tmp, n))]
        if not all(os.path.isfile(os.path.join(out_dir, n)) for n in names if n not in left):
            return  # the part it moved was removed since (or out_dir): not finished into a set that looks whole
        for name in left:
            os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
        if left:
            print(f"{out_dir}: finished the move of an interrupted evaluation's results ({', '.join(left)})")


def refuse_results(out_dir, names, flag="--out_dir"):
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise FolderError(f"{flag} {out_dir!r} is a file, expected a folder for the results")
    held = [n for n in names if os.path.exists(os.path.join(out_dir, n))]
    if held:
        raise FolderError(f"{flag} {out_dir!r} already holds {', '.join(held)} of an earlier run: give another "
                          f"{flag}, or remove {'it' if len(held) == 1 else 'them'} to run it again")

def pid_alive(pid):
    if os.name != "posix":  # on Windows os.kill(pid, 0) would kill it
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        pass
    return True
