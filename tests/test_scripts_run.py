"""Every script in the repository still runs: each one's --help, in one fresh process, imports what it imports and
reaches its argument parser (results/cpu_char/retrain_losses.py had imported a function lib/runs.py no longer has,
and nothing noticed until it was run). CPU only; ~4 s."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SWEEP = r"""
import contextlib, io, json, os, runpy, sys
failed = {}
for path in sys.argv[1:]:
    sys.argv, out = [path, "--help"], io.StringIO()
    sys.path[:0] = [os.path.dirname(path)]  # as `python path` puts it first
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_path(path, run_name="__main__")
        code = 0  # train.py prints its help and returns
    except SystemExit as e:
        code = e.code or 0
    except BaseException as e:  # an import or a name the script no longer finds
        code = f"{type(e).__name__}: {e}"
    finally:
        del sys.path[0]
    if code != 0 or "usage" not in out.getvalue().lower():
        failed[path] = str(code) + " " + out.getvalue()[-300:]
print(json.dumps(failed))
"""


def scripts():
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True).stdout.split()
    return [f for f in files if not f.startswith(("tests/", "configs/", "lib/"))
            and '__name__ == "__main__"' in open(os.path.join(REPO, f)).read()]


def test_every_script_imports_and_answers_help_from_any_folder(tmp_path):
    names = scripts()
    assert {"train.py", "reproduce.py", "bench/tiles.py", "results/cpu_char/retrain_losses.py"} <= set(names)
    got = subprocess.run([sys.executable, "-c", SWEEP, *(os.path.join(REPO, n) for n in names)], cwd=tmp_path,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO})
    assert got.returncode == 0, got.stderr[-2000:]
    import json
    assert json.loads(got.stdout.strip().splitlines()[-1]) == {}
    assert os.listdir(tmp_path) == []  # --help writes nothing
