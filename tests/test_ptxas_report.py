"""bench/ptxas_report.py: kernels compiled ahead of time for sm_90 with the ptxas that Triton's wheel ships."""
import csv
import importlib.util
import os
import subprocess
import sys

import pytest
import torch
import triton

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


@pytest.mark.skipif(not os.access(PTXAS, os.X_OK), reason="this Triton wheel has no ptxas")
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_report_compiles_the_softmax_forward_for_sm90_with_tensor_cores(tmp_path, dtype):
    out = tmp_path / "p.csv"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "bench/ptxas_report.py", "--D", "64", "--kernels", "fwd", "--scorers",
                          "softmax", "--dtype", dtype, "--jobs", "2", "--out", str(out)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = list(csv.DictReader(open(out)))
    import kernels
    assert len(rows) == len(kernels.FWD_TUNE if dtype == "bf16" else kernels.FWD_TUNE_FP32)  # one per autotune shape
    for r in rows:
        assert r["kernel"] == "fwd" and r["scorer"] == "softmax" and int(r["D"]) == 64
        assert 0 < int(r["registers"]) <= 255 and int(r["shared_bytes"]) > 0
        assert r["dtype"] == dtype and int(r["wgmma"]) > 0  # Hopper's tensor cores, fp32 too (tf32x3, not FMA)
        assert int(r["shared_bytes"]) <= 227 * 1024  # sm_90's most per block: a shape over it cannot launch
        assert dtype == "fp32" or int(r["spill_stores"]) == 0  # bf16 at D = 64 never spills


def test_importing_the_report_leaves_the_interpreter_on_for_the_kernels_after_it():
    # it once set TRITON_INTERPRET=0 for the whole process, and the next interpreted kernel in it failed
    spec = importlib.util.spec_from_file_location("ptxas_report", os.path.join(ROOT, "bench", "ptxas_report.py"))
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert os.environ["TRITON_INTERPRET"] == "1"
    import kernels
    import model
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 16) for _ in range(3))
    torch.testing.assert_close(kernels.attention(q, k, v, "softmax"), model.attention(q, k, v, "softmax"),
                               rtol=1e-4, atol=1e-4)


def test_a_part_of_the_table_needs_its_own_out_and_never_replaces_the_committed_one(capsys):
    # `--scorers softmax` once rewrote bench/ptxas_sm90.csv (every kernel) with a handful of rows
    spec = importlib.util.spec_from_file_location("ptxas_report", os.path.join(ROOT, "bench", "ptxas_report.py"))
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    before = open(os.path.join(ROOT, "bench", "ptxas_sm90.csv")).read()
    for argv in (["--scorers", "softmax"], ["--kernels", "fwd"], ["--D", "64"], ["--dtype", "fp32"]):
        with pytest.raises(SystemExit):
            report.main(argv)
        assert "a part of the table; name its CSV with --out" in capsys.readouterr().err
    assert open(os.path.join(ROOT, "bench", "ptxas_sm90.csv")).read() == before
