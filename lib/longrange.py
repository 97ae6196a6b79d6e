"""
Long-range structure inside natural text, the same in training and in the copy gate: a span of a window's own text
repeated later in the window. train.py's copy_frac gives that to a share of training windows (insert_copies);
eval_copy.py measures the loss on the second copy against a control span (copy_sequences), at distances up to N and
beyond.

Why: a small model trained on plain text uses only the last ~10-16 tokens (RESULTS.md, the CPU scale), so no claim
about distant context can be tested on it. A repeated span pays off only to a model that looks back d tokens.

The layout of one window of T + 1 tokens (the inputs are its first T, the targets its last T):
    [ text ... | span: text[a : a+L] | text ... | copy of the span at b = a + d | text ... ]
d is drawn uniformly in [L, T + 1 - L], then a uniformly in [0, T + 1 - L - d]: every distance the window holds is
equally likely, so the model sees copies as far back as its training length allows. The first token of a copy cannot
be foreseen (nothing marks where it starts), so the gate scores the copy's tokens 1..L-1.

The gate compares the second copy with a control: the same sequence with a span of other text at b. Both break the
text at b and sit at the same positions, so what differs is only whether the span was seen d tokens before. (The
first copy is no control: it continues its text, and beyond N the second copy also sits at untrained positions.)
"""
import numpy as np

# the copy gate, stated before any result: at distance GATE_DISTANCE x N, the second copy's loss is at most GATE_RATIO
# of the control span's (per token, the span's first token left out), in the mean over seeds
GATE_DISTANCE = 0.5
GATE_RATIO = 0.5
DISTANCES = (0.125, 0.25, 0.5, 0.75, 1, 2, 4, 8)  # x N: the copy gate's default distances
LEAD = 16  # tokens of text before the first copy in the gate's sequences: the span does not open the sequence


def window_rng(seed, offset):
    """The generator of one training window: the same window (seed, offset) gets the same copy on every visit and
    after a resume, with no state to save."""
    return np.random.default_rng([seed, offset])


def place(rng, T1, L):
    """(a, b): the span's start and its copy's start in a window of T1 tokens, b - a uniform in [L, T1 - L]."""
    d = int(rng.integers(L, T1 - L + 1))
    a = int(rng.integers(0, T1 - L - d + 1))
    return a, a + d


KINDS = ("text", "random")


def check_config(cfg):
    """ValueError (one line) unless the run's copy_* fields make sense: a language-model window that holds both
    copies, a known kind."""
    if cfg.copy_kind not in KINDS:
        raise ValueError(f"copy_kind={cfg.copy_kind!r} is not one of {', '.join(KINDS)}")
    if cfg.copy_frac > 0 and (cfg.task or cfg.sft_data or 2 * cfg.copy_span > cfg.block_size):
        raise ValueError(f"copy_frac={cfg.copy_frac} repeats a span of copy_span={cfg.copy_span} tokens inside a "
                         f"language-model window: it needs 2 x copy_span <= block_size={cfg.block_size}, and no task "
                         f"or sft_data")


def insert_copies(windows, offsets, frac, L, seed, kind="text"):
    """Repeat a span in a share `frac` of windows, in place. windows: (B, T + 1) token ids, offsets: their starts in
    train.bin (they seed each window's draw). kind text: the span is the window's own text at a; random: L tokens
    drawn from the window at random (its symbols, no words: only a copy predicts them), written at a and at b.
    Returns [(row, a, b)] of the copies made."""
    T1, made = windows.shape[1], []
    if 2 * L > T1:
        raise ValueError(f"a span of {L} tokens and its copy do not fit in a window of {T1} tokens")
    for row, offset in enumerate(offsets):
        rng = window_rng(seed, offset)
        if rng.random() < frac:
            a, b = place(rng, T1, L)
            if kind == "random":
                windows[row, a:a + L] = windows[row, rng.integers(0, T1, L)]
            windows[row, b:b + L] = windows[row, a:a + L]
            made.append((row, a, b))
    return made


def copy_sequences(tokens, d, L, num_seqs, seed, lead=LEAD, kind="text"):
    """num_seqs sequences of lead + d + L tokens of `tokens` (the val split), each with its text at lead..lead+L-1
    repeated at lead+d, and their controls, the same with L tokens from elsewhere in the split at lead+d:
    -> (x, control: (num_seqs, lead + d + L) int64, a = lead, b = lead + d). kind random: the span at a is L tokens
    drawn from the sequence at random, and the control's span at b another such draw. Drawn with
    default_rng([seed, d]): every model gets the same sequences."""
    n = lead + d + L
    if d < L or len(tokens) < n:
        raise ValueError(f"distance {d} must be >= the span {L}, and the split must hold {n:,} tokens "
                         f"(it has {len(tokens):,})")
    rng = np.random.default_rng([seed, d])
    starts, others = (rng.integers(0, len(tokens) - k + 1, size=num_seqs) for k in (n, L))
    x = np.stack([np.asarray(tokens[s:s + n], dtype=np.int64) for s in starts])
    source = x.copy()  # both random spans are drawn from the sequence as it was, never from the copy
    if kind == "random":
        x[:, lead:lead + L] = np.take_along_axis(source, rng.integers(0, n, (num_seqs, L)), 1)
    control = x.copy()
    x[:, lead + d:] = x[:, lead:lead + L]
    control[:, lead + d:] = (np.take_along_axis(source, rng.integers(0, n, (num_seqs, L)), 1) if kind == "random" else
                             np.stack([np.asarray(tokens[o:o + L], dtype=np.int64) for o in others]))
    return x, control, lead, lead + d


def gate(ratio_by_seed):
    """The copy gate on one model's ratios (second copy's loss / control's at GATE_DISTANCE x N), one per seed."""
    return bool(np.mean(ratio_by_seed) <= GATE_RATIO)
