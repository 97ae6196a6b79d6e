"""The fast exact paths against the float64 reference (model.attention, backend="torch"): softmax and ssmax on torch's
SDPA (backend="sdpa"), kernels_cpu.py (backend="cpu") for ssa, lssa, lssar and re-weighting on any scorer, and
backend="auto", which picks between them, in the model and its KV cache."""
import pytest
import torch

import kernels_cpu
import model
from cases import VARIANTS, cases, varied  # every scorer and option, from the registry
from model import GPT, GPTConfig, attention
from scorers import SCORERS

H, D = 3, 16
SHAPES = [(0, 33), (40, 7), (90, 1)]  # (offset = keys already cached, Tq): a prompt, a chunk after a cache, decoding
CPU_SHAPES = SHAPES + [(0, 1), (0, 50), (5, 41)]  # and T = 1; with CHUNK = 16 below, 33 to 50 rows are 3-4 blocks
PARAMS = {name: {prm.name: varied(prm, H) for prm in e.params} for name, e in SCORERS.items()}


def _run(scorer, backend, offset, Tq, dtype, p=None, scale=1.0, seed=0, k_scale=None):
    """Output and gradients of q, k, v and every scorer parameter for a fixed upstream gradient."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, H, T, D, generator=g, dtype=torch.float64) for T in (Tq, offset + Tq, offset + Tq))
    do = torch.randn(2, H, Tq, D, generator=g, dtype=torch.float64)
    leaves = [(q * scale).to(dtype), (k * (scale if k_scale is None else k_scale)).to(dtype), v.to(dtype)]
    leaves += [torch.tensor(x, dtype=dtype) for x in PARAMS[scorer].values()]
    leaves = [x.requires_grad_() for x in leaves]
    out = attention(*leaves[:3], scorer, offset=offset, p=p, backend=backend, **dict(zip(PARAMS[scorer], leaves[3:])))
    return [out.double()] + [x.double() for x in torch.autograd.grad(out, leaves, do.to(dtype))]


def _assert_close(fast, ref, fp32_ref=None, what=""):
    """Errors against float64 relative to each tensor's scale (at least 1: a gradient that is exactly 0, at T = 1,
    still allows rounding). float64: rounding only. fp32: at most 4x the fp32 reference's own worst error over the
    same case's tensors (re-weighting amplifies rounding p-fold, in the reference too), plus 2e-6."""
    names = ["out", "dq", "dk", "dv", "param 0", "param 1"]

    def rel(a, r):
        return (a - r).abs().max().item() / max(r.abs().max().item(), 1.0)
    bound = 1e-12 if fp32_ref is None else 4 * max(rel(a, r) for a, r in zip(fp32_ref, ref)) + 2e-6
    for name, a, r in zip(names, fast, ref):
        assert rel(a, r) <= bound, f"{what} {name}: relative error {rel(a, r):.2e} > {bound:.2e}"


# ----------------------------------------------------------------------------------------------------------------
# backend="sdpa": softmax and ssmax

@pytest.mark.parametrize("offset,Tq", SHAPES)
@pytest.mark.parametrize("scorer", ["softmax", "ssmax"])
def test_sdpa_equals_the_float64_reference_values_and_every_gradient(scorer, offset, Tq):
    ref = _run(scorer, "torch", offset, Tq, torch.float64)
    _assert_close(_run(scorer, "sdpa", offset, Tq, torch.float64), ref, what=f"{scorer} float64")
    fp32_ref = _run(scorer, "torch", offset, Tq, torch.float32)
    _assert_close(_run(scorer, "sdpa", offset, Tq, torch.float32), ref, fp32_ref, what=f"{scorer} fp32")


def test_sdpa_ssmax_differs_from_softmax_so_the_scale_is_applied():
    q, k, v = (torch.randn(1, 2, 20, D, dtype=torch.float64) for _ in range(3))
    s = torch.tensor([0.4, 2.0], dtype=torch.float64)
    ssmax = attention(q, k, v, "ssmax", s=s, backend="sdpa")
    assert not torch.allclose(ssmax, attention(q, k, v, "softmax", backend="sdpa"))
    torch.testing.assert_close(ssmax, attention(q, k, v, "ssmax", s=s, backend="torch"), rtol=0, atol=1e-12)


def test_sdpa_ssmax_scales_a_bf16_q_in_fp32_and_rounds_it_once(monkeypatch):
    import kernels_sdpa  # as bf16 autocast would: log n_i, s log n_i + b and q times it in fp32 (n_i > 256 too)
    seen, sdpa = [], torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(kernels_sdpa.F, "scaled_dot_product_attention", lambda q, *a, **kw: seen.append(q) or
                        sdpa(q, *a, **kw))
    q, k = torch.randn(1, 2, 5, D).bfloat16(), torch.randn(1, 2, 1005, D).bfloat16()
    s, b = torch.tensor([0.3, 1.7]), torch.tensor([0.1, -0.2])
    kernels_sdpa.sdpa_attention(q, k, k, "ssmax", offset=1000, s=s, b=b)
    factor = s[:, None, None] * torch.arange(1001, 1006).float().log()[:, None] + b[:, None, None]  # (H, Tq, 1)
    assert torch.equal(seen[0], (q.float() * factor).bfloat16())


def test_sdpa_refuses_other_scorers_and_reweighting_with_one_clear_error():
    q = torch.randn(1, 2, 4, D)
    with pytest.raises(ValueError, match="scorer 'ssa' runs on backends torch, cpu, triton, flex, not 'sdpa'"):
        attention(q, q, q, "ssa", backend="sdpa")
    with pytest.raises(ValueError, match="backend='sdpa' runs no re-weighting"):
        attention(q, q, q, "softmax", p=3.0, backend="sdpa")


# ----------------------------------------------------------------------------------------------------------------
# backend="cpu": kernels_cpu.py

# every scorer the CPU path runs, re-weighted where its rows sum to one (cases.cases), and a large p on those that
# re-weight by default
CPU_CASES = [(name, kw.get("p")) for name, kw in cases("cpu")] + [(n, 100.0) for n, e in SCORERS.items()
                                                                    if e.p is not None and "cpu" in e.backends]


@pytest.fixture
def small_blocks(monkeypatch):  # several query blocks, a partial last one, at lengths the reference scores quickly
    monkeypatch.setattr(kernels_cpu, "CHUNK", 16)


@pytest.mark.parametrize("offset,Tq", CPU_SHAPES)
@pytest.mark.parametrize("scorer,p", CPU_CASES)
def test_cpu_path_equals_the_reference_values_and_every_gradient(scorer, p, offset, Tq, small_blocks):
    ref = _run(scorer, "torch", offset, Tq, torch.float64, p)
    _assert_close(_run(scorer, "cpu", offset, Tq, torch.float64, p), ref, what=f"{scorer} p={p} float64")
    fp32_ref = _run(scorer, "torch", offset, Tq, torch.float32, p)
    _assert_close(_run(scorer, "cpu", offset, Tq, torch.float32, p), ref, fp32_ref, what=f"{scorer} p={p} fp32")


@pytest.mark.parametrize("offset,Tq,scale", [(o, t, 1.0) for o, t in CPU_SHAPES] + [(3, 40, 0.0), (3, 40, 4.0)])
def test_cpu_path_runs_a_row_template_scorer_it_has_no_branch_for(off_by_one, offset, Tq, scale, small_blocks,
                                                                  monkeypatch):
    """cases.OFF_BY_ONE (eps = 1, learned s, b): the template's max floor, eps and rows below 1; z = 0 and large."""
    monkeypatch.setitem(PARAMS, off_by_one, PARAMS["ssmax"])
    ref = _run(off_by_one, "torch", offset, Tq, torch.float64, scale=scale)
    _assert_close(_run(off_by_one, "cpu", offset, Tq, torch.float64, scale=scale), ref, what="float64")
    _assert_close(_run(off_by_one, "cpu", offset, Tq, torch.float32, scale=scale), ref,
                  _run(off_by_one, "torch", offset, Tq, torch.float32, scale=scale), what="fp32")


@pytest.mark.parametrize("scale,k_scale", [(0.0, 1.0), (30.0, 30.0)], ids=["z_zero", "large_z"])
def test_cpu_path_softpick_at_z_zero_and_at_large_z_matches_the_reference(scale, k_scale, small_blocks):
    # q = 0: u = 0, where ReLU and |.| have slope 0
    kw = dict(scale=scale, k_scale=k_scale)
    ref = _run("softpick", "torch", 3, 40, torch.float64, **kw)
    _assert_close(_run("softpick", "cpu", 3, 40, torch.float64, **kw), ref, what="float64")
    _assert_close(_run("softpick", "cpu", 3, 40, torch.float32, **kw), ref,
                  _run("softpick", "torch", 3, 40, torch.float32, **kw), what="fp32")


def test_cpu_path_with_its_default_blocks_equals_the_reference():
    ref = _run("lssar", "torch", 3, 200, torch.float64)
    _assert_close(_run("lssar", "cpu", 3, 200, torch.float64), ref, what="lssar, CHUNK = 128")


@pytest.mark.parametrize("scorer,p", [(s, p) for s, p in CPU_CASES if p is not None or SCORERS[s].p is not None])
def test_cpu_path_reweighting_ties_keep_P_like_the_reference(scorer, p, small_blocks):
    """All-equal scores (q = k = 0): every row with n_i > 3 is exactly uniform and keeps P, values and gradients."""
    ref = _run(scorer, "torch", 3, 70, torch.float64, p, scale=0.0)
    _assert_close(_run(scorer, "cpu", 3, 70, torch.float64, p, scale=0.0), ref, what=f"{scorer} float64")
    _assert_close(_run(scorer, "cpu", 3, 70, torch.float32, p, scale=0.0), ref,
                  _run(scorer, "torch", 3, 70, torch.float32, p, scale=0.0), what=f"{scorer} fp32")


def test_cpu_path_is_finite_for_large_scores_and_p():
    out = _run("ssa", "cpu", 0, 90, torch.float32, 100.0, scale=30.0)
    out += _run("lssar", "cpu", 0, 90, torch.float32, 100.0, scale=30.0)
    assert all(torch.isfinite(x).all() for x in out)


def test_cpu_path_without_gradients_keeps_no_blocks(monkeypatch):
    """Inference (eval_long.py at 20,000 tokens): no autograd Function, memory O(CHUNK * Tk)."""
    q, k, v = (torch.randn(1, 2, 100, D) for _ in range(3))
    expect = kernels_cpu.attention(q, k, v, "lssar")
    monkeypatch.setattr(kernels_cpu._Attention, "apply", None)  # calling it would raise
    with torch.no_grad():
        torch.testing.assert_close(kernels_cpu.attention(q.requires_grad_(), k, v, "lssar"), expect, rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------------------------
# backend="auto": the dispatch, in the model and its KV cache

@pytest.mark.parametrize("scorer,p,device,expect", [
    ("softmax", None, "cpu", "sdpa"), ("ssmax", None, "cpu", "sdpa"), ("ssmax", None, "cuda", "sdpa"),
    ("softmax", 3.0, "cpu", "cpu"), ("ssmax", 3.0, "cuda", "triton"),
    ("ssa", None, "cpu", "cpu"), ("lssa", None, "cpu", "cpu"), ("lssar", 15.0, "cpu", "cpu"),
    ("ssa", None, "cuda", "triton"), ("lssar", 15.0, "cuda", "triton"),
    ("stickbreaking", None, "cpu", "cpu"), ("stickbreaking", None, "cuda", "triton")])
def test_auto_picks_sdpa_for_softmax_and_ssmax_and_the_fused_path_for_the_others(scorer, p, device, expect):
    assert model.auto_backend(scorer, p, device) == expect


@pytest.mark.parametrize("scorer", ["ssa", "lssar", "stickbreaking"])
def test_auto_never_picks_triton_at_a_head_size_its_tiles_do_not_take_and_triton_asked_there_is_one_line(scorer):
    # the 162M model with 16 heads (48) or 8 (96) reached kernels.py's assert at the first forward on a GPU
    assert [model.auto_backend(scorer, None, "cuda", d) for d in (16, 48, 64, 96, 128)] == [
        "triton", "cpu", "triton", "cpu", "triton"]
    with pytest.raises(ValueError, match=r"^backend='triton' runs head sizes 16, 32, 64, 128, not 48 "):
        model.GPTConfig(scorer=scorer, backend="triton", n_embd=768, n_head=16)
    assert model.GPTConfig(scorer=scorer, backend="triton", n_embd=768, n_head=12).head_size == 64


def _tiny(**kw):
    return GPTConfig(**{**dict(block_size=32, vocab_size=64, n_layer=2, n_head=2, n_embd=32, ffn_hidden=32), **kw})


@pytest.mark.parametrize("variant", VARIANTS)
def test_model_runs_the_backend_auto_picks_and_matches_the_reference(variant, monkeypatch):
    torch.manual_seed(0)
    ref = GPT(_tiny(**VARIANTS[variant], backend="torch"))
    with torch.no_grad():  # parameters away from their init, so that every one matters
        for name, prm in ref.named_parameters():
            if not name.endswith("weight"):
                prm.add_(0.3 * torch.rand_like(prm))
    fast = GPT(_tiny(**VARIANTS[variant]))
    fast.load_state_dict(ref.state_dict())
    ran = []
    for backend, (mod, fn) in {"sdpa": (model, "sdpa_attention"), "cpu": (kernels_cpu, "attention")}.items():
        f = getattr(mod, fn)
        monkeypatch.setattr(mod, fn, lambda *a, _f=f, _b=backend, **kw: ran.append(_b) or _f(*a, **kw))
    idx = torch.randint(0, 64, (2, 24))
    logits, loss = fast(idx, idx)
    logits_ref, loss_ref = ref(idx, idx)
    path = model.auto_backend(fast.config.scorer, fast.config.p, "cpu")
    assert ran == ([] if path == "torch" else [path] * 2)  # one call per layer (fox with p: the reference)
    torch.testing.assert_close(logits, logits_ref, rtol=1e-5, atol=1e-5)
    loss.backward()
    loss_ref.backward()
    exact = GPT(_tiny(**VARIANTS[variant], backend="torch")).double()  # float64: what both fp32 paths round
    exact.load_state_dict(ref.state_dict())
    exact(idx, idx)[1].backward()
    for (name, a), b, c in zip(fast.named_parameters(), ref.parameters(), exact.parameters()):
        # re-weighting amplifies rounding on nearly uniform rows (about p / (n P - 1)): the fp32 reference's own
        # error, not the path's, can pass the tolerance, so the path is held to it against float64
        own = (b.grad.double() - c.grad).abs().max().item()
        torch.testing.assert_close(a.grad.double(), c.grad, rtol=1e-4, atol=1e-6 + 2 * own, msg=name)


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_generation_with_auto_equals_the_uncached_reference(variant):
    """Decoding one token at a time after a prompt (auto: sdpa or cpu, with the cache offset) against one full
    forward pass of the reference; and generate() with and without the cache."""
    torch.manual_seed(0)
    m = GPT(_tiny(**VARIANTS[variant])).eval()
    ref = GPT(_tiny(**VARIANTS[variant], backend="torch")).eval()
    ref.load_state_dict(m.state_dict())
    idx = torch.randint(0, 64, (2, 5))
    out = m.generate(idx, 15, temperature=0, use_cache=True)
    assert torch.equal(out, m.generate(idx, 15, temperature=0, use_cache=False))
    cache = [{} for _ in m.transformer.h]
    steps = [m(out[:, :5], cache=cache)[0], m(out[:, 5:12], cache=cache)[0]]  # a prompt, then a 7-token chunk
    steps += [m(out[:, t:t + 1], cache=cache)[0] for t in range(12, out.size(1))]
    full, _ = ref(out, out)
    torch.testing.assert_close(torch.cat(steps, 1), full[:, [4, 11] + list(range(12, out.size(1)))], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("scorer", ["softmax", "ssmax"])
def test_cuda_sdpa_bf16_matches_the_reference(scorer):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, T, 64, generator=g, dtype=torch.float64) for T in (257, 300, 300))
    kw = {name: torch.tensor(x[:1] * 4, dtype=torch.float64) for name, x in PARAMS[scorer].items()}
    ref = attention(q, k, v, scorer, offset=43, **kw)
    out = attention(*(x.cuda().bfloat16() for x in (q, k, v)), scorer, offset=43, backend="sdpa",
                    **{name: x.cuda() for name, x in kw.items()})
    torch.testing.assert_close(out.double().cpu(), ref, rtol=0, atol=3e-2)


def test_a_config_asking_sdpa_for_a_scorer_it_cannot_run_is_refused_when_built():
    for kw in (dict(scorer="ssa"), dict(scorer="lssar"), dict(scorer="stickbreaking")):
        with pytest.raises(ValueError, match=f"backend='sdpa' does not run scorer='{kw['scorer']}'; its backends"):
            GPTConfig(backend="sdpa", **kw)
    with pytest.raises(ValueError, match="backend='sdpa' runs no re-weighting"):
        GPTConfig(backend="sdpa", scorer="softmax", reweight_p=3.0)
    GPTConfig(backend="sdpa", scorer="ssmax")
    GPTConfig(backend="sdpa", scorer="fox")


@pytest.mark.parametrize("scorer,p", [case for case in CPU_CASES if SCORERS[case[0]].logit is not None])
def test_cpu_template_runs_every_row_template_scorer_from_its_registry_logits(scorer, p, small_blocks, monkeypatch):
    """kernels_cpu without its hand-written paths (FAST): what a new scorer runs, values and every gradient."""
    monkeypatch.setattr(kernels_cpu, "FAST", {})
    ref = _run(scorer, "torch", 5, 41, torch.float64, p)
    _assert_close(_run(scorer, "cpu", 5, 41, torch.float64, p), ref, what=f"{scorer} p={p} float64")
    _assert_close(_run(scorer, "cpu", 5, 41, torch.float32, p), ref, _run(scorer, "torch", 5, 41, torch.float32, p),
                  what=f"{scorer} p={p} fp32")


def test_the_cpu_path_runs_a_scorer_with_flags_it_has_no_hand_written_path_for_on_its_logits(monkeypatch):
    # a scratch scorer once ran softmax's math here (an unknown kernel_logit fell through to it): now the template
    import dataclasses
    monkeypatch.setitem(SCORERS, "new", dataclasses.replace(SCORERS["ssa"], kernel_logit="new"))
    monkeypatch.setitem(PARAMS, "new", PARAMS["ssa"])
    assert kernels_cpu._fast(SCORERS["new"]) is None
    _assert_close(_run("new", "cpu", 3, 20, torch.float64), _run("ssa", "torch", 3, 20, torch.float64), what="new")
