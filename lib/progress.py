"""
An evaluation's progress (eval_long.py, eval_rows.py, eval_copy.py): tqdm's bar on a terminal; elsewhere (a log file,
nohup, reproduce.py's captured steps), where tqdm hides its bar and a redrawn one would garble the log, a line
at most every EVERY_S seconds with the work done of the total, the time elapsed and the ETA:

    softmax extended L=160: batch 12/40, elapsed 0:00:31, eta 0:01:12

A training run's progress lines are lib/tracking.py's (tracking.progress).
"""
import sys, time
from datetime import timedelta

EVERY_S = 30  # seconds between two lines off a terminal; read at each bar() call (a test sets 0)

class Lines:
    """tqdm's update, set_description and close, as a line at most every `every_s` seconds."""

    def __init__(self, total, unit, every_s):
        self.total, self.unit, self.every_s, self.n, self.desc = total, unit, every_s, 0, ""
        self.start = self.last = time.time()

    def set_description(self, desc):
        self.desc = f"{desc}: "

    def update(self, n=1):
        self.n, now = self.n + n, time.time()
        if now - self.last >= self.every_s:
            self.last, spent = now, now - self.start
            eta = spent * (self.total - self.n) / self.n
            print(f"{self.desc}{self.unit} {self.n}/{self.total}, elapsed {timedelta(seconds=round(spent))}, "
                  f"eta {timedelta(seconds=round(eta))}", flush=True)

    def close(self):
        pass  # no bar to end

def bar(total, unit="batch"):
    """`total` steps of `unit`: tqdm's bar where stderr (tqdm's) is a terminal, else Lines every EVERY_S."""
    if sys.stderr.isatty():
        from tqdm import tqdm  # lazy: a log never draws it
        return tqdm(total=total, unit=unit)
    return Lines(total, unit, EVERY_S)
