"""
Exact attention on the CPU for every scorer whose registry entry lists "cpu" (all but fox) and re-weighting on any
normalised one (SCORERS.md): model.attention(backend="cpu"), and backend="auto" on the CPU where SDPA can't run it.

The reference (backend="torch") lets autograd differentiate the equations: many (Tq, Tk) temporaries, both
branches of every torch.where, every chunk scored against the full square of its keys. The same math runs here
- by blocks of CHUNK query rows against only the keys they see (causal: about half of the T x T square);
- for every row-template scorer from its registry entry alone (_template): its `logit` (and `den_logit`, `eps`) on
  each block of scores, their derivative by autograd on the block in the backward: a new scorer needs no code here;
- by hand for the scorers in FAST, where that measured faster (bench/attention_cpu.py --generic): the per-head and
  per-row factors folded into q before the product (ssmax's (s log n_i + b)/sqrt(d), ssa's b/sqrt(d), lssa's log(d)
  log(n_i) and the norms), so autograd differentiates those on (T, D) tensors, not (T, T), and a backward over the
  saved weights, in place, where autograd makes temporaries. stickbreaking, no row template, only so.
Same formulas and dtype as the reference (fp32 for half inputs), so it differs from it by rounding only.
torch.compile traces all of it, the autograd.Function too, into the model's one graph.
"""
import math

import torch
import torch.nn.functional as F

import scorers

CHUNK = 128  # query rows per block: per-op cost vs masked work
# hand-written paths by the registry's kernel flags (ROW, LOGIT, ONLINE_MAX, NORMALISE, SUMS_TO_ONE), kept where the
# template timed > 10 % slower (bench/attention_cpu.py --generic; softmax: ssmax's path): does its backward read x
FAST = {("plain", "linear", True, True, True): False, ("logn", "linear", True, True, True): False,
        ("plain", "ssa", True, True, True): True, ("norm", "softplus", False, True, True): False,
        ("bias", "sigmoid", False, False, False): False, ("plain", "softpick", True, True, False): True,
        ("plain", "stickbreaking", False, False, False): True}
READS = {("logn", "linear"): {"s", "b"}, ("plain", "ssa"): {"b", "n"}}  # the parameters they read; the others: none
MULTIPLY_MASK = ("softplus", "sigmoid", "softpick", "stickbreaking")  # LOGITs that cut future keys by a product


def _fast(entry):
    """The LOGIT of the hand-written path that runs the entry (FAST: its flags, and the parameters that path reads), or
    None: the template, from its logits (a new scorer with softmax's flags and a parameter of its own ran softmax)."""
    flags, names = tuple(entry.kernel_flags().values()), {prm.name for prm in entry.params} | dict(entry.fixed).keys()
    return flags[1] if flags in FAST and names == READS.get(flags[:2], set()) else None


def _blocks(Tq):
    return [(t0, min(t0 + CHUNK, Tq)) for t0 in range(0, Tq, CHUNK)]


def _stage1(x, kind, n, mask, ln_n):
    """Stage-1 weights P of one block from x = q' k'^T (B*H, m, Tk), whose last m keys are the diagonal block. Future
    keys are cut by mask (m, m): multiplied by 0 for MULTIPLY_MASK, else -inf added (cheaper than a boolean masked
    fill). lssa returns the row sums S too (P = A / S), softpick e^-m / S."""
    m = x.size(-2)
    if kind == "sigmoid":  # w = sigmoid(z - log n_i): not normalised
        P = torch.sigmoid(x.sub_(ln_n))
        P[..., -m:].mul_(mask)
        return P, None
    if kind == "stickbreaking":  # log A = log sigmoid(x_ij) + sum_{j<k<i} log(1 - sigmoid(x_ik)), keys j < i
        strict = mask.tril(-1)
        rest = F.logsigmoid(x).sub_(x)  # log(1 - sigmoid(x))
        rest[..., -m:].mul_(strict)
        after = F.pad(rest[..., 1:], (0, 1)).flip(-1).cumsum_(-1).flip(-1)  # over k > j: exact, no total - prefix
        A = after.add_(rest).add_(x)  # rest + x = log sigmoid(x)
        A[..., -m:].masked_fill_(strict == 0, -math.inf)  # before exp: a future key's large x would make inf * 0
        return A.exp_(), None
    if kind == "softplus":  # lssa's A = softplus(u) is bounded: plain sums
        A = F.softplus(x)
        A[..., -m:].mul_(mask)
        S = A.sum(-1, keepdim=True)
        return A.div_(S), S
    if kind == "softpick":  # e^x - 1 = e^m (u - e^-m), u = e^(x - m), m = max(0, max_j x): num ReLU, den |.|
        x[..., -m:].mul_(mask)  # 0: not above m; its terms cut below
        mx = x.amax(-1, keepdim=True).clamp_(min=0)
        e, c = torch.exp(-mx), (mx - 80).clamp_(min=0)  # e^(x - c) - e^-c = expm1(x - c) + 1 - e^-c: exact at x ~ 0
        u = x.sub_(c).expm1_().add_(1 - torch.exp(-c)).mul_(torch.exp(c - mx))  # (c = 0 unless a logit passes 80)
        u[..., -m:].mul_(mask)
        S = u.abs().sum(-1, keepdim=True).add_(e * scorers.SOFTPICK_EPS)
        u.div_(S)
        return u.clamp(min=0), e.div_(S)
    if kind == "ssa":  # x = b z; a new tensor: the backward needs x
        x = x.abs().log1p_().copysign_(x).mul_(n)
    x[..., -m:].add_(mask)
    return torch.softmax(x, dim=-1), None


def _template(z, entry, prm, ln_n, ln_d, mask):
    """Stage 1 of the row template from the registry's logits x (logit) and xd (den_logit, else x) of the block's
    scores z: P = e^x / L, L = sum_j e^xd + eps, over m = max_j xd (and 0 with eps, so eps e^-m stays finite); rows
    not divided: P = e^x. mask (m, m): -inf on future keys. P and, for a divisor of its own, each row's log L."""
    x = _masked(entry.logit(z, ln_n, ln_d, **prm), z, mask)
    if entry.sums_to_one:  # a softmax of the logits, fused
        return torch.softmax(x, dim=-1), None
    if not entry.row_sum:
        return x.exp_(), None
    xd = x if entry.den_logit is None else _masked(entry.den_logit(z, ln_n, ln_d, **prm), z, mask)
    mx = xd.amax(-1, keepdim=True)
    mx = mx.clamp_(min=0) if entry.eps else mx
    P = x.sub_(mx).exp_()
    S = (P if xd is x else xd.sub_(mx).exp_()).sum(-1, keepdim=True).add_(torch.exp(-mx).mul_(entry.eps))
    return P.div_(S), mx.add_(S.log_())


def _masked(x, z, mask):  # -inf on future keys, in place unless x is z (kept for the backward)
    x = x.clone() if x is z else x
    x[..., -mask.size(-1):].add_(mask)
    return x


def _template_grads(z, P, lse, dP, d, entry, prm, need, ln_n, ln_d, mask):
    """dL/dz and dL/d each parameter in `need` of one block by the vjp of the registry's logits: dL/dx =
    P dP - sigma_i e^xd / L, sigma_i = sum_j P dP (d; P (dP - d) while L sums e^x; P dP without L)."""
    def logits(z, *learn):
        kw = {**prm, **dict(zip(need, learn))}
        x = entry.logit(z, ln_n, ln_d, **kw)
        return (x,) if entry.den_logit is None else (x, entry.den_logit(z, ln_n, ln_d, **kw))

    xs, vjp = torch.func.vjp(logits, z, *(prm[name] for name in need))
    if not entry.row_sum:
        grads = (dP.mul_(P),)
    elif entry.den_logit is None:
        grads = (dP.sub_(d).mul_(P),)
    else:
        grads = (dP.mul_(P), _masked(xs[1] - lse, None, mask).exp_().mul_(-d))
    dz, *dprm = vjp(grads)
    return dz, dict(zip(need, dprm))


def _forward(q, k, v, prm, scorer, kind, p, offset, save):
    """q, k, v (B*H, T, D) after the folds of attention(); prm: the scorer's parameters (B*H, 1, 1) by name. Returns
    out and, with save, each block's tensors for the backward: x (the scores z for the template; a FAST kind's
    logits where its backward reads them), P (stage 1), its S (lssa, softpick; the template: log L), P2
    (re-weighted), the rows that re-weighted."""
    entry = scorers.SCORERS[scorer]
    eps = torch.finfo(q.dtype).eps
    out, saved = torch.empty_like(q), []
    keep = torch.ones(CHUNK, CHUNK, dtype=q.dtype, device=q.device).tril_()  # 1 on and below the diagonal
    mask = keep if kind in MULTIPLY_MASK else keep.log_()  # log 1 = 0, log 0 = -inf
    ln_d = math.log(q.size(-1))
    keep_x = kind is None or FAST[tuple(entry.kernel_flags().values())]  # the template's: the scores z
    for t0, t1 in _blocks(q.size(1)):
        Tk = offset + t1
        x = q[:, t0:t1] @ k[:, :Tk].transpose(1, 2)  # (B*H, m, Tk)
        ln_n = _rows(offset, t0, t1, x)[0].log()
        if kind is None:
            P, S = _template(x, entry, prm, ln_n, ln_d, mask[:t1 - t0, :t1 - t0])
        else:
            P, S = _stage1(x, kind, prm.get("n"), mask[:t1 - t0, :t1 - t0], ln_n)
        P2 = has = None
        if p is not None:  # scorers.reweight: P2 = softmax(p log x), x above the tie tolerance
            n_i, inv_o = _rows(offset, t0, t1, P)
            tol = scorers.tie_tolerance(n_i, _lse(P, x, S, kind, entry, prm, ln_n, ln_d), eps) / n_i  # on P - o/n
            # thresholds, not log(0) or masked fills (slow on the CPU): cut y -> inf, then -p log x -> -inf
            # log of x = n_i y, not y ~ 1/n_i: p log(n_i) eps less error
            y = F.threshold_(P - (inv_o + tol), 0.0, math.inf)
            has = y.amin(-1, keepdim=True) < math.inf
            logR = F.threshold_(y.add_(tol).mul_(n_i).log_().mul_(-p), -p * math.log(1.5 * Tk), math.inf).neg_()
            P2 = torch.softmax(logR, dim=-1)
            P2 = P2 if _all(has) else torch.where(has, P2, P)
        out[:, t0:t1] = torch.bmm(P if P2 is None else P2, v[:, :Tk])
        if save:
            saved.append((x if keep_x else None, P, S, P2, has))
    return out, saved


def _lse(P, x, S, kind, entry, prm, ln_n, ln_d):
    """Each row's ln sum_j e^logit (scorers.row_lse) for the tie tolerance: the logit at the row's largest P less
    log P there (P = e^(logit - lse)); lssa: the log of its row sum S."""
    if kind == "softplus":
        return S.log()
    Pm, j = P.max(-1, keepdim=True)
    xj = x.gather(-1, j)
    if kind is None:  # the template's x: the scores
        xj = entry.logit(xj, ln_n, ln_d, **prm)
    elif kind == "ssa":  # x = b z
        xj = xj.abs().log1p_().copysign_(xj).mul_(prm["n"])
    return xj - Pm.log()


def _all(has):  # every row re-weighted; compiling: assume not, as a branch on data would break the graph
    return not torch.compiler.is_compiling() and bool(has.all())


def _rows(offset, t0, t1, like):  # n_i and o_i / n_i as (m, 1): o_i = 1 for n_i > 3, else 0
    n_i = torch.arange(offset + t0 + 1, offset + t1 + 1, device=like.device, dtype=like.dtype)[:, None]
    return n_i, (n_i > 3).to(like.dtype) / n_i


def _backward(do, q, k, v, prm, need, out, saved, scorer, kind, p, offset):
    entry = scorers.SCORERS[scorer]
    dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dprm = {name: torch.zeros_like(prm[name]) for name in need}
    tie = scorers.TIE * torch.finfo(q.dtype).eps  # guards p / y only: P2 = 0 at y below the forward's tolerance
    delta = torch.linalg.vecdot(do, out).unsqueeze(-1)  # sum_j P dP of the last stage
    # dx's head, row and constant factors scale q, k or dq,
    # not the (m, Tk) blocks
    alpha = 1.0 if p is None else p
    row = torch.cat([-1.0 / S for _, _, S, _, _ in saved], dim=1) if kind == "softplus" else 1.0  # (B*H, Tq, 1)
    fk = alpha * prm["n"] if kind == "ssa" else alpha
    q, k = q * (fk * row), k * fk
    mask = torch.ones(CHUNK, CHUNK, dtype=q.dtype, device=q.device).tril_().log_()
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
        if kind is None:  # the row template: autograd through the registry's logits
            ln_n = _rows(offset, t0, t1, x)[0].log()
            dx, g = _template_grads(x, P, S, dP, d, entry, prm, need, ln_n, math.log(q.size(-1)),
                                    mask[:t1 - t0, :t1 - t0])
            for name in need:
                dprm[name] += g[name] * alpha
        elif kind == "stickbreaking":  # dx = G sigmoid(-x) - sigmoid(x) sum_{j'<j} G_ij', G = dP A
            G = dP.mul_(P)
            dx = G.sub_(torch.sigmoid(x).mul_(F.pad(G[..., :-1], (1, 0)).cumsum_(-1).add_(G)))
            dx[..., -(t1 - t0):].tril_(-1)  # keys j >= i: no gradient
        elif kind == "sigmoid":  # dx = dP w (1 - w): no row sum
            dx = dP.mul_(P).mul_(1.0 - P)
        elif kind == "softplus":  # dx = (dP - d) sigmoid(x) / S, sigmoid(x) = -expm1(-A)
            dx = dP.sub_(d).mul_(torch.mul(P, -S).expm1_())  # times -1/S: row
        elif kind == "softpick":  # dx = e^x / S (dP [u > 0] - d sgn u); x: u / S, S: e^-m / S
            dx = dP.mul_(x > 0).sub_(x.sign().mul_(d)).mul_(x + S)
        else:  # a softmax of the logits: dlogits = P (dP - d)
            dx = dP.sub_(d).mul_(P)
            if kind == "ssa":  # dx = dlogits n / (1 + |x|), dn = sum dlogits logits / n
                if "n" in need:
                    f = x.abs().log1p_().copysign_(x)  # logits / n
                    dprm["n"] += alpha * (dx * f).sum((1, 2), keepdim=True)
                dx.div_(x.abs().add_(1.0))  # times n: in q and k
        dq[:, t0:t1] = torch.bmm(dx, k[:, :Tk])
        dk[:, :Tk] += torch.bmm(dx.transpose(1, 2), q[:, t0:t1])
    return (dq.mul_(row) if kind == "softplus" else dq), dk, dv, dprm


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scorer, kind, p, offset, names, *prm):
        prm = dict(zip(names, prm))
        out, saved = _forward(q, k, v, prm, scorer, kind, p, offset, save=True)
        ctx.save_for_backward(q, k, v, out, *prm.values())
        ctx.blocks, ctx.cfg = saved, (scorer, kind, p, offset, names)  # made here, not inputs or outputs: on ctx
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        q, k, v, out, *prm = ctx.saved_tensors
        scorer, kind, p, offset, names = ctx.cfg
        need = [name for name, x in zip(names, ctx.needs_input_grad[8:]) if x]
        dq, dk, dv, dprm = _backward(do.contiguous(), q, k, v, dict(zip(names, prm)), need, out, ctx.blocks,
                                     scorer, kind, p, offset)
        return dq, dk, dv, None, None, None, None, None, *(dprm.get(name) for name in names)


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
        kind = _fast(entry)
        if kind is None and entry.logit is None:  # no row template, no hand-written path
            raise ValueError(f"kernels_cpu has no path for scorer {scorer!r}: no logit, no hand-written path")
        if entry.cosine:  # lssa: the row factor log(d) log(n_i) rides on q_hat
            qd, k = F.normalize(qd, dim=-1), F.normalize(k, dim=-1)
            qd = qd if kind is None else qd * (math.log(D) * ln_n)
        elif kind == "linear" and entry.row == "logn":  # ssmax: logits (s log n_i + b) z
            qd = qd * ((prm["s"] * ln_n + prm["b"]) / math.sqrt(D))
        elif kind == "ssa":  # the weights need only b z (b > 0)
            qd = qd * (prm["b"] / math.sqrt(D))
        else:  # sigmoid's -log n_i comes in _stage1
            qd = qd / math.sqrt(D)
        names = tuple(name for name in prm if kind is None or (kind, name) == ("ssa", "n"))  # read in the blocks
        ps = [prm[name].expand(B, H, 1, 1).reshape(B * H, 1, 1) for name in names]
        args = (*(x.reshape(B * H, -1, D) for x in (qd, k, v)), scorer, kind, p, offset, names)
        if torch.is_grad_enabled() and any(t.requires_grad for t in [*args[:3], *ps]):
            out = _Attention.apply(*args, *ps)
        else:  # inference: no block is kept, memory O(CHUNK * Tk)
            out = _forward(*args[:3], dict(zip(names, ps)), *args[3:7], save=False)[0]
    return out.view(B, H, Tq, D).to(q.dtype)
