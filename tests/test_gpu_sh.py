"""bench/gpu.sh without a GPU: stand-ins for nvidia-smi and python3 on PATH fabricate each step's outputs, so what
the script leaves under $OUT (the device tool returns at most 8 files, 16 MiB each) and how it keeps LIMIT are
checked here. The script runs from a copy of bench/ in tmp_path: no repository, as on the device."""
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_FILES = 8  # the device tool's limit on the files that come back

FAKE = textwrap.dedent('''\
    import os, sys, time
    argv = sys.argv[1:]
    def fill(folder, names):
        os.makedirs(folder, exist_ok=True)
        for n in names:
            os.makedirs(os.path.dirname(os.path.join(folder, n)) or ".", exist_ok=True)
            open(os.path.join(folder, n), "w").write(n)
    def suite(name, runs):
        fill(f"out-results/{name}", ["accuracy.csv", "accuracy.png", "horizons.png", "per_prompt.csv.gz",
                                     "steps.jsonl", "summary.json", "tables.md"]
             + ["selected_budget.json"] * name.endswith("pilot"))
        fill(f"out-{name}", [f"{r}.train.log" for r in runs] + [f"{r}/{f}" for r in runs
                                                                 for f in ("log.jsonl", "ckpt.pt")])
    if argv[:1] == ["-c"] and "tarfile" in argv[1]:  # the corpora unpacked: runs
        sys.argv = argv[1:]
        exec(argv[1])
    elif argv[:1] == ["-c"]:
        print("first-gpu recall-gpu" if "synthetic_suite" in argv[1] else "torch 0 triton 0")
    elif os.environ.get("FAKE_SLEEP"):  # a step that outlives LIMIT
        print("started", flush=True)
        time.sleep(float(os.environ["FAKE_SLEEP"]))
    elif argv[:2] == ["-m", "pytest"]:
        print("selected", argv[argv.index("-k") + 1])
    elif argv[:1] == ["reproduce.py"] and "synthetic" in argv:
        name = argv[argv.index("--name") + 1] if "--name" in argv else "synthetic-gpu"
        seeds = [0] if "pilot" in name else range(10)
        suite(name, [f"{t}-{s}-s{seed}" for t in ("first-gpu", "recall-gpu") for s in ("softmax", "ssmax",
                                                                                        "softmax-logN", "softmax-qwen")
                     for seed in seeds])
    elif argv[:1] == ["reproduce.py"]:
        import importlib.util  # the corpora's packages, found as lib.corpora finds them
        bible = importlib.util.find_spec("bible")
        fill("out-results/gpu-smoke", ["tables.md", "train_loss.png"]
             + [f"s1337/{e}/{f}" for e in ("gate", "eval_long", "needle", "passkey")
                  for f in ("a.csv", "b.png", "summary.json")])  # each evaluation's own summary.json too
        open("out-results/gpu-smoke/summary.json", "w").write(" ".join([str(bible and bible.origin), *argv]))
''')


@pytest.fixture
def gpu_sh(tmp_path):
    """run(step, *args, **env) -> (returncode, $OUT's files relative to it)."""
    (tmp_path / "bench").mkdir()
    shutil.copy(os.path.join(REPO, "bench", "gpu.sh"), tmp_path / "bench" / "gpu.sh")
    (tmp_path / "fake.py").write_text(FAKE)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "fake.py"} "$@"\n')
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'FAKE H200, 0, 143771 MiB'\n")
    # the real timeout, its arguments kept: what each step was given, read without a clock
    (bin_dir / "timeout").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "timeouts"}\n'
                                     f'exec {shutil.which("timeout")} "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)

    def run(*argv, **env):
        out = tmp_path / "OUT"
        shutil.rmtree(out, ignore_errors=True)  # as the device tool empties it before each call
        out.mkdir()
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out),
               "GIT_CEILING_DIRECTORIES": str(tmp_path.parent), **env}
        p = subprocess.run(["bash", str(tmp_path / "bench" / "gpu.sh"), *argv], env=env, capture_output=True,
                           text=True, timeout=60)
        files = sorted(str(f.relative_to(out)) for f in out.rglob("*") if f.is_file())
        return p.returncode, files
    return run


@pytest.mark.parametrize("argv, plain", [
    (["synthetic-pilot"], ["accuracy.csv", "selected_budget.json", "steps.jsonl", "summary.json",
                           "synthetic_pilot.log", "tables.md"]),
    (["synthetic", "--tasks", "first-gpu", "recall-gpu"], ["accuracy.csv", "steps.jsonl", "summary.json",
                                                          "synthetic.log", "tables.md"]),
    (["repro"], ["repro.log", "summary.json"])])
def test_each_step_leaves_at_most_8_files_what_a_commit_reads_plain_the_rest_in_one_archive(gpu_sh, tmp_path, argv,
                                                                                             plain):
    rc, files = gpu_sh(*argv)
    archive = argv[0].replace("-", "_") + ".tar.gz"
    assert rc == 0 and files == sorted(["device.txt", archive, *plain]) and len(files) <= MAX_FILES
    with tarfile.open(tmp_path / "OUT" / archive) as tar:
        names = tar.getnames()
    if argv[0].startswith("synthetic"):  # every run's train.log and log.jsonl, never a checkpoint
        runs = 8 * (1 if argv[0] == "synthetic-pilot" else 10)
        assert sum(n.endswith(".train.log") for n in names) == sum(n.endswith("log.jsonl") for n in names) == runs
        assert not any(n.endswith("ckpt.pt") for n in names)
    assert any(n.endswith("per_prompt.csv.gz" if argv[0] != "repro" else "s1337/needle/a.csv") for n in names)
    assert "warning" not in (tmp_path / "OUT" / "device.txt").read_text()


def test_repro_is_a_smoke_that_reads_the_carried_corpora(gpu_sh, tmp_path):
    (tmp_path / ".carry" / "bible").mkdir(parents=True)
    (tmp_path / ".carry" / "bible" / "__init__.py").write_text("")
    with tarfile.open(tmp_path / ".carry" / "corpora.tar.xz", "w:xz") as tar:
        tar.add(tmp_path / ".carry" / "bible", "bible")
    rc, files = gpu_sh("repro", TMPDIR=str(tmp_path))
    ran = (tmp_path / "OUT" / "summary.json").read_text().split()
    assert rc == 0 and ran[0] == str(tmp_path / "corpora" / "bible" / "__init__.py")
    assert ran[1:] == ["reproduce.py", "--scale", "gpu", "--max_iters", "20", "--seeds", "1337", "--variants",
                       "softmax", "ssmax", "--skip", "bench", "--name", "gpu-smoke"]


def test_two_tests_steps_in_one_call_keep_both_logs(gpu_sh, tmp_path):
    out = tmp_path / "OUT"
    gpu_sh("tests", "decode_after")
    first = (out / "cuda_tests.log").read_text()
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "OUT": str(out)}
    subprocess.run(["bash", str(tmp_path / "bench" / "gpu.sh"), "tests", "keep_P_ties"], env=env, check=True,
                   capture_output=True)
    log = (out / "cuda_tests.log").read_text()
    assert log.startswith(first) and "selected decode_after" in log and "selected keep_P_ties" in log


def test_a_step_past_its_limit_is_stopped_within_limit_and_leaves_its_log(gpu_sh, tmp_path):
    rc, files = gpu_sh("train", LIMIT="18", FAKE_SLEEP="60", NANOSCORER_GIT_SHA="abc123")  # 3 s: the step
    # stopped (124), given at most LIMIT less the 15 s of the kill's grace and the files' collecting
    given = (tmp_path / "timeouts").read_text().split()
    assert rc == 124 and given[:2] == ["-k", "10"] and 1 <= int(given[2]) <= 18 - 15
    assert "train_speed.log" in files
    device = (tmp_path / "OUT" / "device.txt").read_text()
    assert "exit 124" in device and "step: train (commit abc123)" in device  # no .git there: the commit passed in
