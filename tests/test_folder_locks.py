"""One writer per folder (lib/folders.held), the two ways a lock changes hands: a waiter (wait=True: a dataset being
prepared) blocks until the holder is done, then holds the folder, where a plain second writer stops; and a lock file
that its releasing holder removed while another waited on it is never taken as the lock, so two holders never
overlap. In-process: flock excludes a second open of the file in this process as it does another process's. No model."""
import errno
import fcntl
import os
import threading

import pytest

from lib import folders, tracking


def test_a_waiter_blocks_until_the_holder_is_done_then_holds_the_folder(tmp_path, monkeypatch):
    folder, asking, got = tmp_path / "data", threading.Event(), []
    flock = fcntl.flock

    def flock_signalled(fd, op):  # the waiter says when it asks for the lock
        if threading.current_thread() is not threading.main_thread():
            asking.set()
        return flock(fd, op)
    monkeypatch.setattr(folders.fcntl, "flock", flock_signalled)

    def waiter():
        try:
            with folders.held(folder, "a dataset", wait=True):
                got.append("held")
        except folders.FolderError as e:  # a waiter must not stop
            got.append(str(e))
    with folders.held(folder, "a dataset"):
        t = threading.Thread(target=waiter)
        t.start()
        assert asking.wait(10)
        got.append("released")
    t.join(10)
    assert got == ["released", "held"] and not os.path.exists(folders.path_of(folder))


def test_a_lock_file_replaced_while_waiting_for_it_is_taken_again_never_held_twice(tmp_path, monkeypatch):
    # the holder before us removes its file as it releases, and a third writer may lock the new file at once: the old
    # file's lock, granted to us then, guards nothing
    folder, flock, other = tmp_path / "run", fcntl.flock, []

    def flock_after_a_handover(fd, op):
        if not other:  # while we waited: released (its file removed), and another writer took the new file
            os.remove(folders.path_of(folder))
            other.append(os.open(folders.path_of(folder), os.O_RDWR | os.O_CREAT))
            flock(other[0], fcntl.LOCK_EX)
        return flock(fd, op)
    monkeypatch.setattr(folders.fcntl, "flock", flock_after_a_handover)
    try:
        with pytest.raises(folders.FolderError, match="is in use"):
            with folders.held(folder):
                pytest.fail("held while another writer holds the folder's lock file")
    finally:
        os.close(other[0])


def test_a_write_naming_no_file_in_a_results_folder_is_a_line_naming_the_folder(tmp_path):
    # a full disk's OSError from a write has no filename: the line said only "No space left on device"
    out = tmp_path / "res"
    with pytest.raises(OSError) as e:
        with folders.results_dir(str(out), ["a.csv"]):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert tracking.error_text(e.value) == f"{out}: No space left on device" and not out.exists()
