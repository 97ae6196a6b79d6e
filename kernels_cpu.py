"""
Exact attention on the CPU for the scorers that SDPA cannot run: every one but softmax and ssmax, and re-weighting on
any normalised scorer (SCORERS.md). model.attention(backend="cpu"), and backend="auto" on the CPU for those.

The reference (backend="torch") lets autograd differentiate the equations: many (Tq, Tk) temporaries, both
branches of every torch.where, every chunk scored against the full square of its keys. The same math runs here
- by blocks of CHUNK query rows against only the keys they see (causal: about half of the T x T square);
- with the per-head and per-row factors folded into q before the product: ssmax's (s log n_i + b)/sqrt(d), ssa's
  b/sqrt(d), lssa's log(d) log(n_i) and the norms. Autograd differentiates those on (T, D) tensors, not (T, T);
- with a hand-written backward over the saved weights, in place, where the reference's autograd makes temporaries.
Same formulas and dtype as the reference (fp32 for half inputs), so it differs from it by rounding only.
torch.compile traces all of it, the autograd.Function too, into the model's one graph.
"""
import ctypes, math

import torch
import torch.nn.functional as F

import scorers

CHUNK = 128  # query rows per block: per-op cost vs masked work
KINDS = {"linear": "dot", "ssa": "ssa", "sigmoid": "sigmoid", "softplus": "lssa",  # registry kernel_logit -> kind
         "softpick": "softpick", "stickbreaking": "stick"}
MULTIPLY_MASK = ("lssa", "sigmoid", "stick")  # kinds that cut future keys by a product (else -inf added)


def reuse_freed_memory():
    """Keep the memory torch frees in the process: glibc unmaps large freed blocks, so each step page-faults its
    large buffers (the logits) back in. With mmap off and no trimming freed blocks are reused; the process keeps its
    peak memory. glibc only, else a no-op. The scripts call it on the CPU; importing this module changes nothing."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl)
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # malloc.h
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


def _blocks(Tq):
    return [(t0, min(t0 + CHUNK, Tq)) for t0 in range(0, Tq, CHUNK)]


def _stage1(x, kind, n, mask, ln_n, eps):
    """Stage-1 weights P of one block from x = q' k'^T (B*H, m, Tk), whose last m keys are the diagonal block. Future
    keys are cut by mask (m, m): multiplied by 0 for lssa, sigmoid and the row template (eps not None), else -inf
    added (cheaper than a boolean masked fill). lssa returns the row sums S too (P = A / S), the template e^-m / S."""
    m = x.size(-2)
    if kind == "sigmoid":  # w = sigmoid(z - log n_i): not normalised
        P = torch.sigmoid(x.sub_(ln_n))
        P[..., -m:].mul_(mask)
        return P, None
    if kind == "stick":  # log A = log sigmoid(x_ij) + sum_{j<k<i} log(1 - sigmoid(x_ik)), keys j < i
        strict = mask.tril(-1)
        rest = F.logsigmoid(x).sub_(x)  # log(1 - sigmoid(x))
        rest[..., -m:].mul_(strict)
        after = F.pad(rest[..., 1:], (0, 1)).flip(-1).cumsum_(-1).flip(-1)  # over k > j: exact, no total - prefix
        A = after.add_(rest).add_(x).exp_()  # rest + x = log sigmoid(x)
        A[..., -m:].mul_(strict)
        return A, None
    if kind == "lssa":  # A = softplus(u) is bounded: plain sums
        A = F.softplus(x)
        A[..., -m:].mul_(mask)
        S = A.sum(-1, keepdim=True)
        return A.div_(S), S
    if kind == "ssa":  # x = b z; a new tensor: the backward needs x
        x = x.abs().log1p_().copysign_(x).mul_(n)
    if eps is not None:
        return _template(x, kind, mask, eps)
    x[..., -m:].add_(mask)
    return torch.softmax(x, dim=-1), None


def _template(x, kind, keep, eps):
    """The row template: P = num / S, S = sum_j den + eps, from the logits x as u = e^(x - m), m = max(0, max_j x),
    so eps e^-m stays finite (num = den = u for every kind so far). P, with x holding u / S, and e^-m / S."""
    m = x.size(-2)
    x[..., -m:].mul_(keep)  # 0: not above m; its terms cut below
    mx = x.amax(-1, keepdim=True).clamp_(min=0)
    e = torch.exp(-mx)
    u = x.sub_(mx).exp_()
    if kind == "softpick":  # e^x - 1 = e^m (u - e^-m): num ReLU, den |.|
        u.sub_(e)
    u[..., -m:].mul_(keep)
    S = (u.abs() if kind == "softpick" else u).sum(-1, keepdim=True).add_(e * eps)
    u.div_(S)
    return u.clamp(min=0) if kind == "softpick" else u, e.div_(S)


def _forward(q, k, v, n, kind, eps, p, offset, save):
    """q, k, v (B*H, T, D) after the folds of attention(); n (B*H, 1, 1) for ssa; eps: the row template's (None:
    rows divided by their weights' own sum). Returns out and, with save, each block's tensors for the backward: x
    (ssa's, the template's), P (stage 1), lssa's or the template's S, P2 (re-weighted), the rows that re-weighted."""
    tie = scorers.TIE * torch.finfo(q.dtype).eps  # scorers.reweight's rule
    out, saved = torch.empty_like(q), []
    keep = torch.ones(CHUNK, CHUNK, dtype=q.dtype, device=q.device).tril_()  # 1 on and below the diagonal
    mask = keep if kind in MULTIPLY_MASK or eps is not None else keep.log_()  # log 1 = 0, log 0 = -inf
    for t0, t1 in _blocks(q.size(1)):
        Tk = offset + t1
        x = q[:, t0:t1] @ k[:, :Tk].transpose(1, 2)  # (B*H, m, Tk)
        P, S = _stage1(x, kind, n, mask[:t1 - t0, :t1 - t0], _rows(offset, t0, t1, x)[0].log(), eps)
        P2 = has = None
        if p is not None:  # scorers.reweight: P2 = softmax(p log x), x > 0
            n_i, inv_o = _rows(offset, t0, t1, P)
            # thresholds, not log(0) or masked fills (slow on the CPU):
            # cut y -> 2 Tk (> any kept x), then -p log x -> -inf
            # log of x = n_i y, not y ~ 1/n_i: p log(n_i) eps less error
            y = F.threshold_(P - inv_o, tie, 2.0 * Tk)
            has = y.amin(-1, keepdim=True) < 2.0 * Tk
            logR = F.threshold_(y.mul_(n_i).log_().mul_(-p), -p * math.log(1.5 * Tk), math.inf).neg_()
            P2 = torch.softmax(logR, dim=-1)
            P2 = P2 if _all(has) else torch.where(has, P2, P)
        out[:, t0:t1] = torch.bmm(P if P2 is None else P2, v[:, :Tk])
        if save:
            saved.append((x if kind in ("ssa", "stick") or eps is not None else None, P, S, P2, has))
    return out, saved


def _all(has):  # every row re-weighted; compiling: assume not, as a branch on data would break the graph
    return not torch.compiler.is_compiling() and bool(has.all())


def _rows(offset, t0, t1, like):  # n_i and o_i / n_i as (m, 1): o_i = 1 for n_i > 3, else 0
    n_i = torch.arange(offset + t0 + 1, offset + t1 + 1, device=like.device, dtype=like.dtype)[:, None]
    return n_i, (n_i > 3).to(like.dtype) / n_i


def _backward(do, q, k, v, n, out, saved, kind, p, offset, need_dn):
    dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dn = torch.zeros_like(n) if need_dn else None
    tie = scorers.TIE * torch.finfo(q.dtype).eps
    delta = torch.linalg.vecdot(do, out).unsqueeze(-1)  # sum_j P dP of the last stage
    # dx's head, row and constant factors scale q, k or dq,
    # not the (m, Tk) blocks
    alpha = 1.0 if p is None else p
    row = torch.cat([-1.0 / S for _, _, S, _, _ in saved], dim=1) if kind == "lssa" else 1.0  # (B*H, Tq, 1)
    fk = alpha * n if kind == "ssa" else alpha
    q, k = q * (fk * row), k * fk
    for (t0, t1), (x, P, S, P2, has) in zip(_blocks(q.size(1)), saved):
        Tk = offset + t1
        dob = do[:, t0:t1]
        dv[:, :Tk] += torch.bmm((P if P2 is None else P2).transpose(1, 2), dob)
        dP, d = dob @ v[:, :Tk].transpose(1, 2), delta[:, t0:t1]  # dL/dP (last stage), its sum with P
        if P2 is not None:  # logits p log(n_i y): dP <- P2 (dP - d) p / y
            # d from dP, not dO.O: p / y amplifies their rounding gap
            d = torch.linalg.vecdot(P2, dP).unsqueeze(-1)
            y = F.threshold_(P - _rows(offset, t0, t1, P)[1], tie, 1.0)
            dP = dP.sub_(d).mul_(P2).div_(y)  # times p: in alpha
            if not _all(has):  # rows that kept P: dL/dP passes (/ alpha)
                dP = torch.where(has, dP, (dob @ v[:, :Tk].transpose(1, 2)).div_(alpha))
            d = torch.linalg.vecdot(P, dP).unsqueeze(-1)
        if kind == "stick":  # dx = G sigmoid(-x) - sigmoid(x) sum_{j'<j} G_ij', G = dP A
            G = dP.mul_(P)
            dx = G.sub_(torch.sigmoid(x).mul_(F.pad(G[..., :-1], (1, 0)).cumsum_(-1).add_(G)))
            dx[..., -(t1 - t0):].tril_(-1)  # keys j >= i: no gradient
        elif kind == "sigmoid":  # dx = dP w (1 - w): no row sum
            dx = dP.mul_(P).mul_(1.0 - P)
        elif kind == "lssa":  # dx = (dP - d) sigmoid(x) / S, sigmoid(x) = -expm1(-A)
            dx = dP.sub_(d).mul_(torch.mul(P, -S).expm1_())  # times -1/S: row
        elif kind == "softpick":  # dx = e^x / S (dP [u > 0] - d sgn u); x: u / S, S: e^-m / S
            dx = dP.mul_(x > 0).sub_(x.sign().mul_(d)).mul_(x + S)
        else:  # a softmax of the logits: dlogits = P (dP - d)
            dx = dP.sub_(d).mul_(P)
            if kind == "ssa":  # dx = dlogits n / (1 + |x|), dn = sum dlogits logits / n
                if need_dn:
                    f = x.abs().log1p_().copysign_(x)  # logits / n
                    dn += alpha * torch.linalg.vecdot(dx.flatten(1), f.flatten(1))[:, None, None]
                dx.div_(x.abs().add_(1.0))  # times n: in q and k
        dq[:, t0:t1] = torch.bmm(dx, k[:, :Tk])
        dk[:, :Tk] += torch.bmm(dx.transpose(1, 2), q[:, t0:t1])
    return dq.mul_(row) if kind == "lssa" else dq, dk, dv, dn


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, n, kind, eps, p, offset):
        out, saved = _forward(q, k, v, n, kind, eps, p, offset, save=True)
        ctx.save_for_backward(q, k, v, n, out)
        ctx.blocks, ctx.cfg = saved, (kind, p, offset)  # made here, not inputs or outputs: kept on ctx
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        q, k, v, n, out = ctx.saved_tensors
        grads = _backward(do.contiguous(), q, k, v, n, out, ctx.blocks, *ctx.cfg, ctx.needs_input_grad[3])
        return (*grads, None, None, None, None)


def attention(q, k, v, scorer, *, p=None, offset=0, **params):
    """model.attention's contract: causal attention (B, H, Tq, D), query t at absolute position offset + t, k, v
    holding offset + Tq keys; differentiable w.r.t. q, k, v and the scorer's params. Half inputs run in fp32."""
    B, H, Tq, D = q.shape
    assert k.size(2) == offset + Tq, f"k has {k.size(2)} keys but offset + Tq = {offset} + {Tq}"
    dtype = torch.promote_types(q.dtype, torch.float32)

    with torch.autocast(q.device.type, enabled=False):
        qd, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        ln_n = torch.arange(offset + 1, offset + Tq + 1, device=q.device, dtype=dtype).log()[:, None]  # (Tq, 1)
        entry, p, params = scorers.get(scorer, p, params, backend="cpu")
        prm = scorers.per_head(entry, params, H, qd)  # (H, 1, 1): broadcasts over (B, H, Tq, D)
        kind = KINDS.get(entry.kernel_logit)
        eps = None if entry.sums_to_one or not entry.row_sum else entry.eps  # None: the weights' own sum
        if kind is None or (kind == "lssa" and eps is not None):  # never fall back to softmax's path silently
            raise ValueError(f"kernels_cpu has no path for scorer {scorer!r} (kernel_logit {entry.kernel_logit!r}; "
                             f"known: {', '.join(KINDS)}; softplus divided by its own sum only)")
        if kind == "lssa":  # the row factor log(d) log(n_i) rides on q_hat
            qd, k = F.normalize(qd, dim=-1) * (math.log(D) * ln_n), F.normalize(k, dim=-1)
        elif entry.row == "logn":  # ssmax: logits (s log n_i + b) z
            qd = qd * ((prm["s"] * ln_n + prm["b"]) / math.sqrt(D))
        elif kind == "ssa":  # the weights need only b z (b > 0)
            qd = qd * (prm["b"] / math.sqrt(D))
        elif entry.row in ("plain", "bias"):  # sigmoid's -log n_i comes in _stage1
            qd = qd / math.sqrt(D)
        else:
            raise ValueError(f"kernels_cpu has no path for scorer {scorer!r} (row setup {entry.row!r})")
        n = prm["n"].expand(B, H, 1, 1).reshape(B * H, 1, 1) if kind == "ssa" else None
        args = (*(x.reshape(B * H, -1, D) for x in (qd, k, v)), n, kind, eps, p, offset)  # (B*H, T, D): bmm
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in args[:4]):
            out = _Attention.apply(*args)
        else:  # inference: no block is kept, memory O(CHUNK * Tk)
            out = _forward(*args, save=False)[0]
    return out.view(B, H, Tq, D).to(q.dtype)
