"""The kernels' benchmark (`python bench/attention.py`) in a tiny CPU configuration through the same code as the H100
table: one timed row per configuration in its CSV and PNG; on a CPU machine the script, and the triton backend without
the interpreter, stop with one clear line; the SDPA peer runs the backend it names."""
import csv
import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch

import kernels
from test_kernels import _inputs, _ref

REPO = os.path.dirname(os.path.abspath(kernels.__file__))
BENCH = os.path.join(REPO, "bench", "attention.py")
_spec = importlib.util.spec_from_file_location("bench_attention", BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_benchmark_writes_one_timed_row_per_configuration_csv_and_png(tmp_path):
    scorers, providers, modes = ["softmax", "lssar"], ["triton", "eager", "sdpa"], ["fwd", "fwd+bwd"]
    rows = bench.benchmark(Ts=[32], Ds=[16], scorers=scorers, providers=providers, tokens=32, heads=2,
                           dtype=torch.float32, device="cpu", out=tmp_path / "k")
    with open(tmp_path / "k.csv", newline="") as f:
        table = list(csv.DictReader(f))
    keys = sorted((r["scorer"], r["provider"], int(r["D"]), int(r["T"]), r["mode"]) for r in table)
    expected = [(s, p, 16, 32, m) for s in scorers for p in providers for m in modes if (s, p) != ("lssar", "sdpa")]
    assert keys == sorted(expected) and len(rows) == 10  # SDPA has no lssar
    for r in table:
        assert r["status"] == "ok" and r["device"] and r["peak_mib"] == ""  # no peak memory on CPU
        assert 0 < float(r["ms"]) < math.inf and 0 < float(r["tflops"]) < math.inf
    assert (tmp_path / "k.png").stat().st_size > 0


def _cpu_python(*args, cwd=REPO):
    """python *args as on a CPU machine (on a GPU one too): no CUDA device, no TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


def test_triton_backend_on_cpu_without_interpreter_is_one_clear_error():
    # not Triton's 100-line "0 active drivers" traceback from deep in the launcher
    r = _cpu_python("-c", "import torch, model; q = torch.zeros(1, 1, 4, 16); "
                          "model.attention(q, q, q, 'lssar', backend='triton')")
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1] == f"RuntimeError: {kernels.NO_GPU}", r.stderr
    assert len(r.stderr.splitlines()) < 10 and "active drivers" not in r.stderr


def test_benchmark_script_on_cpu_exits_with_one_line_and_writes_nothing(tmp_path):
    r = _cpu_python(BENCH, "--T", "32", "--D", "16", cwd=tmp_path)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "CUDA GPU" in r.stderr, r.stderr
    assert not list(tmp_path.iterdir())  # no stray bench/kernels.csv: files only under an explicit --out


def test_sdpa_peer_runs_the_backend_it_names():  # unpinned, torch may pick cuDNN over flash on Hopper
    q, k, v, _ = _inputs(40, 0, 16)
    torch.testing.assert_close(bench._sdpa(q, k, v, "softmax"), _ref(q, k, v, "softmax"), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError):  # no cuDNN attention on the CPU: the pin is applied, not a hint
        bench._sdpa(q, k, v, "softmax", backend=bench.SDPBackend.CUDNN_ATTENTION)
