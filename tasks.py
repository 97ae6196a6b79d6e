"""
Synthetic length-generalization tasks: train a tiny model at length N with train.py, test it far beyond N (the suite:
up to 128 N), and see the scorers apart on a laptop CPU.

    python train.py configs/tasks/first.py scorer=ssmax out_dir=out-first-ssmax
    python eval_tasks.py out-first-*/ckpt.pt --lengths 32 64 128 256 512 --out_dir out-first-eval

Tasks (each with its own small vocabulary; targets are -1, or NaN for real-valued ones, except where scored):
- first: a bit string after <bos>; every position's answer is the first bit (Chiang & Cholak 2022, "Overcoming a
  Theoretical Limitation of Self-Attention").
- mqar: multi-query associative recall (Arora et al. 2023, Zoology): D key-value pairs, then the keys queried again
  among filler tokens; the answer is the key's value.
- recall: the content-only variant: D pair tokens "key:value" at random positions among filler, queried by key; a
  longer sequence only adds filler, so n grows and nothing else does.
- flipflop: flip-flop language modelling (Liu et al. 2023, "Exposing Attention Glitches"): write/read/ignore
  instructions with bits, the bit after a read is the last written bit; train FFL(0.8), test FFL(0.98) and FFL(0.1).
- every / some: the quantifier tasks of Naim et al. 2025 (SSA paper, sec. 3-4) on reals: is every (some) number so
  far positive? Ours are balanced: half the sequences hold exactly one counterexample (witness) at a uniform position.
- linear: in-context linear functions y = a x + b (Garg et al. 2022; SSA paper): x1, y1, x2, y2, ..., predict each y
  from its x for the 3rd point on; a, b ~ N(0, task_sigma) (tested at larger sigma), x ~ N(0, 1); eq. 2's squared
  error, averaged over the scored points (eq. 2 divides by N_p: 5 % less at N_p = 40).
Reals enter through a linear embedding x W (features: the value, and for linear which slot it is) and leave through
a scalar head (lib/checkpoint.py's RealGPT). A batch is a pure function of (seed, stream, sample index), so resume and
DDP stay exact.

Adding a task (what can be checked is checked at import or before a run starts):
1. Its sampler `name(L, rng, c, test) -> (x, y)`, drawing from rng alone; a new option: a TaskConfig field (an int
   is a count, >= 1), with a range check in check_config if it needs more.
2. Its Task in TASKS: `vocab` (1: reals; every id drawn must be below it), `loss` and `n_in` that agree (ce: tokens,
   n_in 0; bce, mse: n_in real features), `reads` (every task_* option it reads: another one set is refused), and
   `conditions` that set only options it reads and keep its vocabulary.
3. min_length: the shortest length whose test sequences all hold a scored position (default 1; eval_tasks.py refuses
   a sequence with none). target_positions and TARGETS: where the answer is read from, for eval_tasks.py --diagnose
   (without them its target_mass is NaN, said once).
4. configs/tasks/<name>.py: its recipe, commented with its arithmetic.
5. In the synthetic suite: an Entry in lib/synthetic_suite.SUITE, and its verdict endpoint in
   lib/synthetic_report.PRIMARY (without one, tables.md says "no primary contrast registered for task <name>").
6. Tests: a brute-force checker in tests/test_tasks.py's CHECKERS, recomputing each label from the inputs alone
   (test_every_task_has_a_checker fails without it).
"""
from dataclasses import dataclass, fields, replace

import numpy as np
import torch


@dataclass
class TaskConfig:  # train.py's TrainConfig includes these fields; an int one is a count: >= 1 (check_config)
    task: str = ""  # a task below instead of language modelling on `dataset`
    task_pairs: int = 4  # mqar, recall: key-value pairs D per sequence
    task_keys: int = 16  # mqar, recall: distinct keys (>= task_pairs) and values
    task_filler: str = "pairs"  # recall: "pairs" of unqueried keys (values compete), or "noise"
    task_p_ignore: float = 0.8  # flipflop: P(ignore); write, read: (1 - p) / 2 each
    task_sigma: float = 1.0  # every, some: sd of the numbers; linear: sd of a and b


class TaskError(ValueError):  # a sample no model can read: one error line in train.py and eval_tasks.py
    pass


FILL = 16  # filler tokens, random: none is free to ignore
TRAIN, VAL = 0, 1  # sample streams; each test condition has its own


def first(L, rng, c, test):
    bits = rng.integers(0, 2, L - 1)
    x = np.concatenate([[2], bits])  # 2 = <bos>
    y = np.full(L, -1)
    y[1:] = bits[0]
    return x, y


def _pairs(L, D, rng, test):
    """Positions of D stored items and of their D queries (each query after its item). Test: the queries are the
    last D positions, so the query rows attend to about L keys; training: anywhere, so every n <= N is trained."""
    if test:
        return rng.choice(L - D, D, replace=False), L - D + rng.permutation(D)
    pos = np.sort(rng.choice(L, (D, 2), replace=False), axis=1)
    return pos[:, 0], pos[:, 1]


def recall(L, rng, c, test):
    D, K = c.task_pairs, c.task_keys  # tokens: FILL fillers, K*K pair tokens "k:v", K query tokens, K answers
    keys, vals = rng.choice(K, D, replace=False), rng.integers(0, K, D)
    if c.task_filler == "pairs":  # distractors: unqueried keys' pairs
        others = np.setdiff1d(np.arange(K), keys)
        x = FILL + rng.choice(others, L) * K + rng.integers(0, K, L)
    else:
        x = rng.integers(0, FILL, L)
    y = np.full(L, -1)
    item, query = _pairs(L, D, rng, test)
    x[item], x[query], y[query] = FILL + keys * K + vals, FILL + K * K + keys, FILL + K * K + K + vals
    return x, y


def mqar(L, rng, c, test):
    D, K = c.task_pairs, c.task_keys  # tokens: FILL fillers, K keys, K values; pairs "k v" first, then queries
    keys, vals = rng.choice(K, D, replace=False), rng.integers(0, K, D)
    x, y = rng.integers(0, FILL, L), np.full(L, -1)
    x[0:2 * D:2], x[1:2 * D:2] = FILL + keys, FILL + K + vals
    query = L - D + rng.permutation(D) if test else 2 * D + rng.choice(L - 2 * D, D, replace=False)
    x[query], y[query] = FILL + keys, FILL + K + vals
    return x, y


def flipflop(L, rng, c, test):
    m, p = L // 2, c.task_p_ignore  # m instructions, each followed by a bit: w=0 r=1 i=2, bits 3 and 4
    op = rng.choice(3, m, p=[(1 - p) / 2, (1 - p) / 2, p])
    op[0], op[-1] = 0, 1  # start with a write, end with a read
    bit = rng.integers(0, 2, m)
    written = np.where(op == 0, np.arange(m), 0)
    bit = np.where(op == 1, bit[np.maximum.accumulate(written)], bit)  # a read repeats the last write
    x, y = np.full(L, 2), np.full(L, -1)  # an odd L ends with an ignore
    x[0:2 * m:2], x[1:2 * m:2] = op, 3 + bit
    y[0:2 * m:2] = np.where(op == 1, 3 + bit, -1)
    return x, y


def _quantifier(L, rng, c, sign):
    x = sign * np.abs(rng.normal(0, c.task_sigma, L))  # every: all positive; some: all negative
    witness = rng.integers(0, L) if rng.random() < 0.5 else L  # L: none
    x[witness:witness + 1] *= -1
    before = np.arange(L) < witness
    return x[:, None].astype(np.float32), np.where(before, 1.0, 0.0) if sign > 0 else np.where(before, 0.0, 1.0)


def every(L, rng, c, test):
    return _quantifier(L, rng, c, +1)


def some(L, rng, c, test):
    return _quantifier(L, rng, c, -1)


def linear(L, rng, c, test):
    k = (L + 1) // 2  # points; an odd L ends with an x
    a, b = rng.normal(0, c.task_sigma, 2)
    xs = rng.normal(0, 1, k)
    ys = a * xs + b
    feats = np.zeros((L, 3), np.float32)  # (x, y, is an x slot)
    feats[0::2, 0], feats[0::2, 2], feats[1::2, 1] = xs, 1.0, ys[:L // 2]
    y = np.full(L, np.nan, np.float32)
    y[4::2] = ys[2:]  # predicted at x_k, from the 3rd point on (eq. 2)
    return feats, y


@dataclass
class Task:
    sample: callable  # (L, rng, config, test) -> (inputs (L,) or (L, n_in), targets (L,))
    vocab: callable  # config -> vocabulary size (1: real-valued)
    loss: str = "ce"  # ce: tokens | bce: a yes/no logit | mse
    n_in: int = 0  # real features per position
    conditions: tuple = (("", {}),)  # test conditions: (name, TaskConfig overrides)
    reads: tuple = ()  # the task_* options it reads: another one set is refused (check_config), never ignored

    def __post_init__(self):  # a task registered wrongly fails at import, not as numbers under a wrong name
        name, base = self.sample.__name__, TaskConfig()
        if self.loss not in ("ce", "bce", "mse") or (self.loss == "ce") != (self.n_in == 0):  # build_model: RealGPT
            raise ValueError(f"task {name!r}: loss={self.loss!r} with n_in={self.n_in}; ce reads tokens (n_in=0), bce "
                             "and mse read real features (n_in >= 1)")
        for cond, over in self.conditions:
            if set(over) - set(self.reads):  # eval_tasks would run the trained setting under this condition's name
                raise ValueError(f"task {name!r}: test condition {cond!r} sets {', '.join(sorted(set(over)))}, not "
                                 f"all read by the task (reads: {', '.join(self.reads) or 'none'})")
            if self.vocab(replace(base, **over)) != self.vocab(base):  # the trained model reads only its own ids
                raise ValueError(f"task {name!r}: test condition {cond!r} changes the vocabulary")


SIGMAS = tuple((f"sigma={s}", {"task_sigma": float(s)}) for s in (1, 3, 10))
TASKS = {
    "first": Task(first, lambda c: 3),
    "mqar": Task(mqar, lambda c: FILL + 2 * c.task_keys, reads=("task_pairs", "task_keys")),
    "recall": Task(recall, lambda c: FILL + c.task_keys * (c.task_keys + 2),
                   reads=("task_pairs", "task_keys", "task_filler")),
    # each condition sets what its name says (the first had no override: a run trained at 0.5 was tested at 0.5)
    "flipflop": Task(flipflop, lambda c: 5, conditions=tuple((f"{kind}p_i={p}", {"task_p_ignore": p}) for kind, p in
                                                             (("", 0.8), ("sparse ", 0.98), ("dense ", 0.1))),
                     reads=("task_p_ignore",)),
    "every": Task(every, lambda c: 1, "bce", 1, SIGMAS, reads=("task_sigma",)),
    "some": Task(some, lambda c: 1, "bce", 1, SIGMAS, reads=("task_sigma",)),
    "linear": Task(linear, lambda c: 1, "mse", 3, tuple((f"sigma={s}", {"task_sigma": float(s)}) for s in (1, 2, 4)),
                   reads=("task_sigma",)),
}


def check_config(c):
    """One clear message for a bad task setting (train.py turns it into its error line), and for a task_* option that
    neither the task nor language modelling reads (a typo'd experiment that would run as if it were not there)."""
    if c.task and c.task not in TASKS:
        raise ValueError(f"unknown task {c.task!r}; allowed: {', '.join(TASKS)}")
    if c.task and TASKS[c.task].n_in and getattr(c, "tie_embeddings", False):  # RealGPT: a Linear in, a scalar out
        raise ValueError(f"tie_embeddings=True: task {c.task!r} reads real numbers, with no token embedding to tie")
    unread = [f.name for f in fields(TaskConfig)[1:] if getattr(c, f.name) != f.default
              and f.name not in (TASKS[c.task].reads if c.task else ())]
    if unread:
        raise ValueError(f"{', '.join(f'{k}={getattr(c, k)!r}' for k in unread)}: "
                         + (f"task {c.task!r} does not read it (it reads: {', '.join(TASKS[c.task].reads) or 'none'})"
                            if c.task else "a task option, and this run is language modelling (no task=)"))
    if c.task in ("mqar", "recall") and c.task_keys <= c.task_pairs:
        raise ValueError(f"task_keys={c.task_keys} must be more than task_pairs={c.task_pairs}: the queried keys are "
                         "distinct, and recall's filler pairs use the others")
    for f in fields(TaskConfig):  # any task's, a new one's too: a count of 0 had failed deep in its sampler
        if f.type is int and getattr(c, f.name) < 1:
            raise ValueError(f"{f.name}={getattr(c, f.name)} must be >= 1 (a count)")
    if c.task_filler not in ("pairs", "noise"):
        raise ValueError(f"task_filler={c.task_filler!r}; allowed: pairs, noise")
    if not (0 <= c.task_p_ignore < 1 and c.task_sigma > 0):
        raise ValueError(f"need 0 <= task_p_ignore < 1 and task_sigma > 0, got {c.task_p_ignore}, {c.task_sigma}")


def min_length(c):  # linear: its first answer is the 3rd point's y, at position 5; flipflop: a write, then a read
    return {"mqar": 3 * c.task_pairs, "recall": 2 * c.task_pairs, "flipflop": 4, "first": 2, "linear": 5}.get(c.task, 1)


def get_batch(c, stream, ix, L, test=False):
    """Samples ix (a tensor of indices) of `stream` at length L: (x, y) tensors, each sample from its own seeded
    generator, so any slice of a batch (a DDP rank's) is the same data."""
    task = TASKS[c.task]
    xs, ys = zip(*(task.sample(L, np.random.default_rng([c.seed, stream, int(i)]), c, test) for i in ix.tolist()))
    x, y = np.stack(xs), np.stack(ys)
    if not task.n_in and (x.min() < 0 or max(x.max(), y.max()) >= task.vocab(c)):  # else an IndexError in torch
        raise TaskError(f"task {c.task!r} drew token ids {x.min()}..{max(x.max(), y.max())} at length {L}; its "
                        f"vocabulary holds 0..{task.vocab(c) - 1} (Task.vocab)")
    return (torch.from_numpy(x.astype(np.float32)) if task.n_in else torch.from_numpy(x.astype(np.int64)),
            torch.from_numpy(y.astype(np.float32)) if task.n_in else torch.from_numpy(y.astype(np.int64)))


TARGETS = ("first", "recall", "every", "some")  # the tasks target_positions knows


def target_positions(c, x):
    """Where the final answer is read from, for the attention diagnostics (-1: nowhere, e.g. no witness)."""
    if c.task == "first":
        return torch.ones(len(x), dtype=torch.long)
    if c.task == "recall":  # the pair token of the last query's key
        K = c.task_keys
        key = x[:, -1:] - FILL - K * K
        hit = (x >= FILL) & (x < FILL + K * K) & ((x - FILL) // K == key)
    elif c.task in ("every", "some"):
        v = x[..., 0]
        hit = v < 0 if c.task == "every" else v > 0
    else:  # all -1 had been read as "no witness" in every sequence: target_mass NaN, unexplained
        raise ValueError(f"task {c.task!r}: no target position known; target_positions knows {', '.join(TARGETS)}")
    return torch.where(hit.any(1), hit.float().argmax(1), -1)
