"""torch.compile on the CPU. The fused paths are custom operators (kernels.py, kernels_stick.py: each passes
torch.library.opcheck) or plain torch (kernels_cpu.py), so a small GPT of every scorer compiles with
fullgraph=True as one graph with the eager model's loss and gradients (Triton under the interpreter).
compile=True (#33): a compiled run's losses equal eager's on the SDPA path (softmax), the CPU fused path (lssa), the
reference path and the Triton path, its checkpoint has plain parameter names (no `_orig_mod.`), resumes, and loads in
sample.py and eval_long.py. Tiny models: the first inductor compile still takes ~10-30 s each."""
import json
import os

import numpy as np
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

import eval_long
import kernels
import kernels_stick
import model
from cases import cases, varied
from conftest import random_ids_data
from lib import vocab
from model import GPT, GPTConfig
import sample
from scorers import SCORERS
import train

V = vocab.VOCAB_SIZE  # GPT-2's: sample.py and eval_long.py read only language models
TINY = ["device=cpu", f"vocab_size={V}", "n_layer=1", "n_head=2", "n_embd=32", "ffn_hidden=64", "block_size=16",
        "batch_size=2", "gradient_accumulation_steps=1", "eval_iters=1", "log_interval=1", "warmup_iters=1",
        "learning_rate=1e-2", "dataset=rand"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return random_ids_data(tmp_path_factory, V)


def losses(out):
    return {r["iter"]: r["loss"] for r in map(json.loads, open(os.path.join(out, "log.jsonl"))) if "loss" in r}


def run(data_dir, out, *extra):
    train.main([*TINY, f"data_dir={data_dir}", f"out_dir={out}", *extra])
    return losses(out)


@pytest.mark.parametrize("scorer,backend", [("softmax", "auto"), ("lssa", "auto"), ("ssmax", "torch")],
                         ids=["sdpa", "cpu-fused", "reference"])
def test_a_compiled_run_trains_with_eager_losses(data_dir, tmp_path, capsys, scorer, backend):
    over = (f"scorer={scorer}", f"backend={backend}", "max_iters=3", "eval_interval=3")
    eager = run(data_dir, tmp_path / "eager", *over)
    compiled = run(data_dir, tmp_path / "compiled", *over, "compile=True")
    assert list(compiled) == [0, 1, 2] and np.allclose(list(compiled.values()), list(eager.values()), rtol=1e-4)
    assert "compile: the first step took" in capsys.readouterr().out


def test_a_compiled_runs_checkpoint_resumes_and_loads_in_sample_and_eval_long(data_dir, tmp_path, capsys):
    out = tmp_path / "c"
    run(data_dir, out, "max_iters=2", "eval_interval=2", "compile=True")
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert not any(k.startswith("_orig_mod.") for k in ckpt["model"])  # the raw model's names: eager loads it
    resumed = run(data_dir, out, "max_iters=3", "eval_interval=3", "compile=True", "resume=True")
    whole = run(data_dir, tmp_path / "whole", "max_iters=3", "eval_interval=3")
    assert np.allclose([resumed[i] for i in range(3)], [whole[i] for i in range(3)], rtol=1e-4)
    sample.main(["--ckpt", str(out / "ckpt.pt"), "--max_new_tokens", "4", "--num_samples", "1", "--device", "cpu"])
    eval_long.main([str(out / "ckpt.pt"), "--data", os.path.join(data_dir, "rand"), "--length", "32",
                    "--num_seqs", "2", "--out_dir", str(tmp_path / "ev")])
    assert (tmp_path / "ev" / "summary.json").is_file()


def test_the_triton_backend_compiles_inside_the_graph(data_dir, tmp_path, capsys):
    over = ("scorer=ssa", "backend=triton", "max_iters=2", "eval_interval=2")
    eager = run(data_dir, tmp_path / "eager", *over)
    counters.clear()
    compiled = run(data_dir, tmp_path / "compiled", *over, "compile=True")
    assert np.allclose(list(compiled.values()), list(eager.values()), rtol=1e-4)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert "outside the compiled graph" not in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------------------
# The custom operators, and one graph for every scorer and backend

FUSED = [(name, kw.get("p")) for name, kw in cases("triton")]  # re-weighted too where its rows sum to one


def _id(scorer, p, backend=""):
    return scorer + (f"_p{p:g}" if p else "") + (f"-{backend}" if backend else "")


OPS = [(kernels, "_attention_fwd"), (kernels, "_attention_bwd"), (kernels_stick, "_forward"),
       (kernels_stick, "_backward")]
DIFFERENTIABLE = (kernels._attention_fwd, kernels_stick._forward)  # the others are backward ops


def _op_calls(monkeypatch, scorer, Tq, offset, p=None, B=1, H=2, D=16):
    """Every custom operator call of one Triton forward and backward (kernels.py, kernels_stick.py), with its inputs."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=g).requires_grad_() for T in (Tq, offset + Tq, offset + Tq))
    params = {prm.name: torch.tensor(varied(prm, H)).requires_grad_() for prm in SCORERS[scorer].params}
    if SCORERS[scorer].forget:  # prefix sums of log forget gates
        params["c"] = torch.nn.functional.logsigmoid(torch.randn(B, H, offset + Tq, generator=g)).cumsum(-1)
    calls = []
    with monkeypatch.context() as m:
        for mod, name in OPS:
            op = getattr(mod, name)
            m.setattr(mod, name, lambda *args, op=op: calls.append((op, args)) or op(*args))
        model.attention(q, k, v, scorer, p=p, offset=offset, backend="triton", **params).sum().backward()
    return calls


@pytest.mark.parametrize("scorer,p,Tq,offset", [(name, p, 5, 3) for name, p in FUSED] + [(*FUSED[0], 1, 100)],
                         ids=[_id(s, p) for s, p in FUSED] + [f"{FUSED[0][0]}-decode-split-keys"])
def test_every_custom_operator_passes_opcheck(monkeypatch, scorer, p, Tq, offset):
    calls = _op_calls(monkeypatch, scorer, Tq, offset, p)
    assert len(calls) == 2  # a forward and its backward
    for op, args in calls:
        grad = op in DIFFERENTIABLE
        args = [x.detach().clone().requires_grad_(grad) if isinstance(x, torch.Tensor) else x for x in args]
        torch.library.opcheck(op, args)


# every scorer, and re-weighted where its rows sum to one (cases.cases), on Triton and on auto (sdpa, cpu or torch)
COMPILED = [(name, backend, kw.get("p")) for backend in ("triton", "auto")
            for name, kw in cases(None if backend == "auto" else backend)]


def _eager_and_one_graph(scorer, backend, compiler="aot_eager", device="cpu", backward=True, p=None):
    """A tiny GPT's loss and gradients, eager and compiled with fullgraph=True, after asserting that the compiled
    model is one graph with no break. The scorers' defaults: ssmax and ssa learn parameters, lssar re-weights."""
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=32, ffn_hidden=64, scorer=scorer,
                        backend=backend, reweight_p=p)).to(device)
    idx = torch.randint(0, 64, (2, 16), device=device)

    def loss_and_grads(model):
        gpt.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(backward):
            loss = model(idx, idx)[1]
        if not backward:
            return [loss]
        loss.backward()
        return [loss.detach()] + [p.grad for p in gpt.parameters()]

    eager = loss_and_grads(gpt)
    torch._dynamo.reset()
    counters.clear()
    graphs = CompileCounterWithBackend(compiler)
    compiled = loss_and_grads(torch.compile(gpt, backend=graphs, fullgraph=True))
    assert graphs.frame_count == 1 and not counters["graph_break"], dict(counters["graph_break"])
    return eager, compiled


@pytest.mark.parametrize("scorer,backend,p", COMPILED, ids=[_id(s, p, b) for s, b, p in COMPILED])
def test_a_compiled_gpt_is_one_graph_with_the_eager_loss_and_gradients(scorer, backend, p):
    eager, compiled = _eager_and_one_graph(scorer, backend, p=p)  # aot_eager runs eager's ops: eager's bits
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore")  # flex's notice that it runs unfused outside torch.compile
@pytest.mark.parametrize("scorer,p", [(name, kw.get("p")) for name, kw in cases("flex")],
                         ids=[_id(name, kw.get("p")) for name, kw in cases("flex")])
def test_flex_compiles_as_one_graph_forward_on_the_cpu_and_backward_on_cuda(scorer, p):
    cuda = torch.cuda.is_available()  # a CPU refuses flex's backward (and compiled, its lse)
    eager, compiled = _eager_and_one_graph(scorer, "flex", *(("inductor", "cuda", True) if cuda else
                                                            ("aot_eager", "cpu", False)), p=p)
    torch.testing.assert_close(compiled, eager, rtol=1e-3, atol=1e-5)
