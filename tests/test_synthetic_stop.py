"""The synthetic suite's worker pool stops with the suite: Ctrl-C (or a failed run) stops the runs in flight and the
queued ones at once, and a kill -9 of the suite takes its workers with it (Linux). CPU only, a few seconds."""
import multiprocessing
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

from lib import synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gone(pid):  # exited: no such process, or a zombie its dead parent left to init
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_stopping_the_pool_ends_the_runs_in_flight_and_the_queued_ones_at_once(tmp_path):
    # an interrupted worker took the next queued run, and the suite exited only after it (35 s later)
    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
    run = "import pathlib, time\npathlib.Path({!r}).touch()\ntime.sleep(60)"  # a run: it marks its start
    futures = [pool.submit(exec, run.format(str(tmp_path / str(i)))) for i in range(5)]
    t0 = time.time()
    while len(list(tmp_path.iterdir())) < 2 and time.time() - t0 < 60:  # both workers in a run
        time.sleep(0.05)
    workers = list(pool._processes)  # pids
    synthetic._stop(pool)
    # by the OS's word: is_alive() may still say True while the executor's own thread reaps the process
    assert all(gone(pid) for pid in workers)
    time.sleep(1)
    # the queued runs never started (cancelled, or taken into the executor's call queue and never run: which of the
    # two is the executor's timing, not the suite's)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["0", "1"]
    # and the runs in flight were stopped, not waited for (a 60 s run waited for would end with its result): no clock
    assert not any(f.done() and not f.cancelled() and f.exception() is None for f in futures)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_worker_dies_with_the_suites_process(tmp_path):
    # after a kill -9 of reproduce.py its worker ran its queued runs, then waited forever holding a run's lock
    script = ("import multiprocessing, os, sys, time\n"
              f"sys.path.insert(0, {ROOT!r})\n"
              "from concurrent.futures import ProcessPoolExecutor\n"
              "from lib import synthetic\n"
              "if __name__ == '__main__':\n"
              "    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context('spawn'),\n"
              "                               initializer=synthetic._die_with_parent)\n"
              "    worker = pool.submit(os.getpid).result()  # up, its initializer run\n"
              "    pool.submit(time.sleep, 60)\n"
              "    time.sleep(0.5)\n"
              f"    open({str(tmp_path / 'pid')!r}, 'w').write(str(worker))\n"
              "    os._exit(0)  # as a kill -9: no cleanup\n")
    # no pipe the worker would inherit and hold open: run() returns when the suite's process ends
    subprocess.run([sys.executable, "-c", script], timeout=60, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    worker = int((tmp_path / "pid").read_text())
    deadline = time.time() + 10
    while not gone(worker) and time.time() < deadline:
        time.sleep(0.1)
    alive = not gone(worker)
    if alive:
        os.kill(worker, 9)
    assert not alive
