"""bench/tiles.py's bookkeeping under the interpreter: fp32 (its bf16 is wrong), a tiny shape, an injected clock (the
interpreter's times mean nothing, and do_bench needs a GPU)."""
import csv
import importlib.util
import os
import types

import torch

from conftest import one_line_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("tiles", os.path.join(ROOT, "bench", "tiles.py"))
tiles = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tiles)

GOOD, WRONG, FAILS, SPILLS = (32, 32, 4, 1), (16, 32, 4, 1), (64, 32, 4, 1), (32, 16, 4, 1)


class Rigged(tiles._Forced):
    """WRONG adds 1 to the output, FAILS raises as a launch out of shared memory, SPILLS reports 8 spilled words."""
    def __getitem__(self, grid):
        launch = super().__getitem__(grid)

        def rigged(*args, **kw):
            if self.cfg == FAILS:
                raise RuntimeError("out of resource: shared memory")
            launch(*args, **kw)
            if self.cfg == WRONG:
                args[self.fn.arg_names.index("O")].add_(1.0)
            if self.cfg == SPILLS:
                self.compiled.append(types.SimpleNamespace(n_spills=8, n_regs=255))
        return rigged


def test_sweep_ranks_only_correct_spill_free_candidates_and_writes_every_row(monkeypatch, tmp_path):
    import torch
    monkeypatch.setattr(tiles, "_Forced", Rigged)
    clock = iter(range(100, 0, -1))  # every timing faster than the one before: the spilling candidate is the fastest
    rows = tiles.sweep(["softmax"], {"fwd": [GOOD, WRONG, FAILS, SPILLS], "dq": [GOOD]}, B=1, H=2, T=40, D=16,
                       dtype=torch.float32, device="cpu", out=tmp_path / "t",
                       measure=lambda fn, grads, cuda: (float(next(clock)), None))
    got = {(r["kernel"], r["BLOCK_M"], r["BLOCK_N"]): r for r in rows}
    assert got["default", None, None]["default"] == "fwd=32,32,4,1 dq=32,32,4,1 dkdv=32,32,4,1"  # the interpreter's
    assert got["default", None, None]["err_ref"] < 1e-5  # fp32 against the float64 reference
    assert got["fwd", 32, 32]["status"] == "ok" and got["fwd", 32, 32]["err_default"] == 0.0
    wrong = got["fwd", 16, 32]
    assert wrong["status"] == "wrong" and wrong["err_default"] > 0.1 and wrong["err_ref"] > 0.1
    assert wrong["fwd_ms"] is None  # a wrong candidate is not timed
    assert got["fwd", 64, 32]["status"].startswith("error: RuntimeError: out of resource")
    assert got["fwd", 32, 16]["status"] == "spills 32 B" and got["fwd", 32, 16]["fwd_ms"] is not None
    won = tiles.best(rows)
    assert won["softmax", 16, 40, "fwd"] is got["fwd", 32, 32] and won["softmax", 16, 40, "dq"] is got["dq", 32, 32]
    assert len(won) == 2
    written = list(csv.DictReader(open(tmp_path / "t.csv")))
    assert [(r["kernel"], r["status"]) for r in written] == [(r["kernel"], r["status"]) for r in rows]
    assert any("| softmax | 16 | 40 | fwd | 32,32,4,1 |" in line for line in tiles.summary(rows))
    # the same rows read back give the lists to paste
    lines = tiles.apply(tiles._read(tmp_path / "t.csv"))
    assert lines[0] == "FWD_TUNE = [(32, 32, 4, 1)]" and "BWD_TUNE = [(32, 32, 4, 1)]" in lines


def test_apply_keeps_the_fewest_shapes_near_every_fastest_time():
    def row(scorer, kernel, cfg, ms, status="ok", T=1024):
        return dict(scorer=scorer, D=64, T=T, kernel=kernel, status=status, fwd_ms=ms, bwd_ms=ms,
                    **dict(zip(("BLOCK_M", "BLOCK_N", "warps", "stages"), cfg)))
    a, b, c = (128, 64, 4, 3), (64, 64, 4, 3), (128, 128, 8, 3)
    rows = [row("softmax", "fwd", a, 1.00), row("softmax", "fwd", b, 1.02), row("ssa", "fwd", a, 2.0),
            row("ssa", "fwd", b, 1.5), row("ssa", "fwd", c, 1.0, "wrong"), row("lssa", "fwd", c, 0.1, "spills 8 B"),
            row("lssa", "fwd", b, 3.0)]
    lines = tiles.apply(rows)
    assert lines[0] == "FWD_TUNE = [(64, 64, 4, 3)]"  # within 3 % of softmax's best, and the best of ssa and lssa
    # two sweeps at one D and other T are ranked apart: a, fastest at 1,024, does not hide b, 2x faster at 4,096
    rows = [row("softmax", "fwd", a, 1.0), row("softmax", "fwd", b, 1.2), row("softmax", "fwd", a, 10.0, T=4096),
            row("softmax", "fwd", b, 5.0, T=4096)]
    assert sorted(eval(tiles.apply(rows)[0].removeprefix("FWD_TUNE = "))) == [b, a]  # both kept


def test_a_wrong_default_judges_no_candidate_the_float64_reference_does(monkeypatch):
    # the autotuner's own pick computing a wrong out (as dk/dv's did on 2026-11-27) marked right candidates wrong
    import torch
    real = tiles.kernels._attn_fwd_tuned

    class Broken:
        fn, cache, best_config = real.fn, real.cache, property(lambda self: real.best_config)

        def __getitem__(self, grid):
            def launch(*a, **kw):
                real[grid](*a, **kw)
                a[real.fn.arg_names.index("O")].add_(1.0)
            return launch
    monkeypatch.setattr(tiles.kernels, "_attn_fwd_tuned", Broken())
    rows = tiles.sweep(["softmax"], {"fwd": [GOOD, WRONG]}, B=1, H=2, T=40, D=16, dtype=torch.float32, device="cpu",
                       measure=lambda fn, grads, cuda: (1.0, None))
    got = {(r["kernel"], r["BLOCK_M"], r["BLOCK_N"]): r for r in rows}
    assert got["default", None, None]["status"] == "off the float64 reference"
    assert got["fwd", *GOOD[:2]]["status"] == "ok" and got["fwd", *GOOD[:2]]["err_ref"] < 1e-5


def test_the_budget_starts_no_scorers_default_whose_autotune_would_end_past_it(monkeypatch, capsys):
    now = [0.0]  # an injected clock: each timing takes 10 s

    def measure(fn, grads, cuda):
        now[0] += 10
        return 1.0, None
    monkeypatch.setattr(tiles, "time", types.SimpleNamespace(time=lambda: now[0]))
    rows = tiles.sweep(["softmax", "ssmax"], {"fwd": [GOOD]}, B=1, H=2, T=40, D=16, dtype=torch.float32,
                       device="cpu", measure=measure, budget=100)  # DEFAULT_S (70) + 30
    assert [(r["scorer"], r["kernel"]) for r in rows] == [("softmax", "default"), ("softmax", "fwd")]
    assert "under 70 s left for ssmax's default" in capsys.readouterr().out


def test_default_candidates_are_shapes_the_autotuner_would_keep():
    for D, new in tiles.NEW.items():
        assert not [c for c in new["fwd"] if tiles.pruned(c, D, "fwd")], D  # else candidates() drops them
        assert not [c for c in new["bwd"] for kernel in ("dq", "dkdv") if tiles.pruned(c, D, kernel)], D
        assert all(c in tiles.candidates("fwd", D) for c in new["fwd"]) and tiles.candidates("dq", D)[-1] in new["bwd"]


def test_bad_input_is_one_error_line(tmp_path):
    assert "stick_blocks" in one_line_error(tiles.main, ["--scorers", "stickbreaking"])
    assert "BLOCK_M,BLOCK_N" in one_line_error(tiles.main, ["--fwd", "128,64,4"])
    assert "no such CSV" in one_line_error(tiles.main, ["--apply", str(tmp_path / "none.csv")])


def test_decode_backward_diagnostic_prints_a_row_per_config_and_run_and_restores_the_autotuner(capsys):
    spec = importlib.util.spec_from_file_location("decode_bwd", os.path.join(ROOT, "bench", "decode_bwd.py"))
    decode_bwd = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(decode_bwd)
    tuned = decode_bwd.kernels._attn_bwd_dkdv_tuned
    decode_bwd.main(["--device", "cpu", "--offset", "40", "--D", "16", "--repeats", "2", "--scorers", "softmax"])
    rows = [r.split(" | ") for r in capsys.readouterr().out.splitlines()[2:]]
    assert [(r[1], r[2]) for r in rows] == [("autotuned (32, 32, 4, 1)", "0"), ("autotuned (32, 32, 4, 1)", "1"),
                                            ("(32, 32, 4, 1)", "0"), ("(32, 32, 4, 1)", "1")]
    assert all(float(r[5]) < 2e-2 for r in rows)  # dk against float64, relative to its largest entry
    assert decode_bwd.kernels._attn_bwd_dkdv_tuned is tuned
    if not torch.cuda.is_available():  # gpu.sh's `decode` step run where there is no GPU: one line, not a traceback
        assert "--device cuda: bench/decode_bwd.py runs the Triton kernels on a CUDA GPU" in \
            one_line_error(decode_bwd.main, [])
