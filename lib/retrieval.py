"""
The retrieval tasks that needle.py runs: needle-in-a-haystack (SSMax paper, Nakanishi 2025, Fig. 6) and passkey
(LSSAR paper, Gao & Spratling 2025, Fig. 3) prompts, answer grading, the needle score (SSMax Figs. 7-8) with its
baselines, and the retrieval fine-tuning sets (SQuAD 2.0, synthetic needles). No model here: needle.py runs them.

Prompts are built in token space, each piece encoded on its own as it reads inside running text (vocab.continuation),
exactly the context size, with the needle (or pass key) at a boundary near depth % of the haystack (build_prompt); the
depth it went to is recorded as actual_depth.
"""
import functools, itertools, os, re

import numpy as np
import torch

from lib import dataset, vocab
from lib.dataset import DataError  # bad input, shown in one line

NEEDLE_HEAD, NEEDLE_TAIL = " The special magic {city} number is:", " {number}."  # the needle score's span: the tail
NEEDLE_QUESTION = "\nWhat is the special magic {city} number?\nThe special magic {city} number is:"
# passkey prompt of Mohtashami & Jaggi 2023
PASSKEY_INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
                 "I will quiz you about the important information there.")
PASSKEY_FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY = " The pass key is {k}. Remember it. {k} is the pass key."
PASSKEY_QUESTION = " What is the pass key? The pass key is"
# per codec: GPT-2's BPE gets the papers' prompts; characters get shorter ones of the same shape, so that a needle and
# its question fit a model trained on N = 64 characters with room for haystack (the question repeats the needle's
# head, whose continuation is the answer). digits: of the needle's number (the passkey has 5 in both, as LSSAR's);
# symbols: how digits 0-9 are written. Characters write them as letters a-j: english_char's text has almost no
# digits, so its models never copy one (RESULTS.md: probability 0.00 for a copied digit, 0.3-0.6 for a letter)
DIGITS = "0123456789"
PROMPTS = {
    "bpe": dict(head=NEEDLE_HEAD, tail=NEEDLE_TAIL, question=NEEDLE_QUESTION, digits=7, symbols=DIGITS,
                intro=PASSKEY_INTRO, filler=PASSKEY_FILLER, passkey=PASSKEY, passkey_question=PASSKEY_QUESTION),
    "char": dict(head=" The {city} code is", tail=" {number}.", question=" The {city} code is", digits=5,
                 symbols="abcdefghij", intro="", filler=" The grass is green. The sky is blue.",
                 passkey=" The pass key is {k}.", passkey_question=" The pass key is")}
# how far from the asked depth (a share of the haystack) a sentence end may take the needle: a short haystack holds
# 1-2, and the nearest one put every depth at one place; past it, the nearest word start
DEPTH_TOLERANCE = 0.1
# How needle.py's numbers are made, recorded in a suite step's settings: a step made under older rules is not reused
RULES = "answers: a whole word of symbols (bed08be); score: the row after the answer's lead (3dbeab2)"
FIG7_NUMBER = 8106422  # the SSMax paper's Fig. 7 needle (its first `digits` digits for a shorter number)
SQUAD_PROMPT = "{context}\n{question}\nAnswer:"  # answer: " " + the first answer text
# train/eval: disjoint cities and parities, no leak
EVAL_CITIES = ("Tokyo", "Paris", "Cairo", "Lima", "Oslo", "Nairobi", "Toronto", "Mumbai", "Sydney", "Berlin",
               "Madrid", "Seoul", "Istanbul", "Chicago", "Bangkok", "Dublin", "Havana", "Jakarta", "Lagos", "Vienna")
TRAIN_CITIES = ("London", "Rome", "Moscow", "Beijing", "Delhi", "Lisbon", "Athens", "Prague", "Warsaw", "Boston",
                "Denver", "Manila", "Karachi", "Dhaka", "Tehran", "Riyadh", "Santiago", "Bogota", "Quebec", "Helsinki")

# ----------------------------------------------------------------------------------------------------------------
# Prompts and scoring

def prompts_of(enc):
    return PROMPTS["char" if isinstance(enc, vocab.CharCodec) else "bpe"]

def spell(number, enc):
    """number as enc's prompts write it (characters: 48126 -> "eibcg")."""
    return str(number).translate(str.maketrans(DIGITS, prompts_of(enc)["symbols"]))

def draw_number(rng, split, digits=7):
    n = int(rng.integers(10**(digits - 1), 10**digits))
    return n - n % 2 + (split == "train")  # odd for training, even for evaluation

def score_answer(text, number, enc=None):
    """The first run of digits in text against the number; digits as enc's prompts write them (default: as digits).
    Single spaces inside a run are allowed (" 8 1 0" reads 810) except for characters, whose letter digits would
    read the next word's a-j as digits (" eibcg and": 48126, not 481260); and for characters a run is a whole word
    (" The eibcg": 48126; the h, e of " The" or the e of " tell" are no digits; a word of a-j alone, " bad", reads
    103)."""
    symbols = prompts_of(enc)["symbols"] if enc else DIGITS
    if symbols != DIGITS:  # read enc's symbols as digits, and a written digit as no digit
        text = text.translate(str.maketrans(symbols + DIGITS, DIGITS + "?" * 10))
    m = re.search(r"\d(?: ?\d)*" if symbols == DIGITS else r"(?<!\w)\d+(?!\w)", text)  # a whole word
    digits = m.group().replace(" ", "") if m else ""
    return "exact" if digits == str(number) else "first_digit" if digits[:1] == str(number)[0] else "wrong"

def cells(rows, keys):
    """Accuracy = exact answers; first_digit = answers whose first digit is right (exact ones included);
    actual_depth: the mean depth % the needles went to (rows that record it)."""
    groups, out = {}, []
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    for g, rs in groups.items():
        s = [r["score"] for r in rs]
        out.append(dict(zip(keys, g), n=len(s), accuracy=s.count("exact") / len(s),
                        first_digit=1 - s.count("wrong") / len(s)))
        if "actual_depth" in rs[0]:
            out[-1]["actual_depth"] = round(float(np.mean([r["actual_depth"] for r in rs])), 1)
    return out

@functools.cache
def boundaries(enc):
    """Per id: does it end a sentence, does it start a word? Every id decoded: BPE merges "." and " " into others."""
    text = [enc.decode_single_token_bytes(i) for i in range(enc.n_vocab)]
    return np.array([t.endswith((b".", b"!", b"?")) for t in text]), np.array([t[:1].isspace() for t in text])

def build_prompt(enc, hay, insert, question, L, depth, prefix=()):
    """prefix + hay[:pos] + insert + hay[pos:n] + question, exactly L ids; pos is the boundary right after the
    sentence-end id nearest to depth % of the n haystack ids if one is within DEPTH_TOLERANCE * n of it, else the
    nearest word start, else (no word start) depth % itself. Returns (ids, position of insert, actual depth %)."""
    n = L - len(prefix) - len(insert) - len(question)
    if n < 1:
        raise DataError(f"context size {L} is too short to hold the needle and the question: they take {L - n} "
                        f"tokens, so use at least {L - n + 1} (and more, for a haystack)")
    hay = np.asarray(hay[:n])
    if len(hay) < n:
        raise DataError(f"the haystack text has {len(hay)} tokens, fewer than the {n} that context {L} needs")
    sentence_end, word_start = boundaries(enc)
    target, ends = depth / 100 * n, np.flatnonzero(sentence_end[hay]) + 1
    ends = ends[np.abs(ends - target) <= DEPTH_TOLERANCE * n]
    cuts = ends if len(ends) else np.flatnonzero(word_start[hay])
    pos = int(cuts[np.abs(cuts - target).argmin()]) if len(cuts) else round(target)
    ids = np.concatenate([prefix, hay[:pos], insert, hay[pos:], question]).astype(np.int64)
    return ids, len(prefix) + pos, round(100 * pos / n, 1)

def needle_trial(enc, hay, L, depth, city, number, prefix=()):
    P = prompts_of(enc)
    piece = functools.partial(vocab.continuation, enc)  # each piece's ids as inside the running text
    head, tail = piece(P["head"].format(city=city)), piece(P["tail"].format(number=spell(number, enc)))
    question = piece(P["question"].format(city=city))
    ids, pos, actual = build_prompt(enc, hay, head + tail, question, L, depth, prefix)
    return dict(context=L, depth=depth, actual_depth=actual, city=city, number=number, ids=ids, pos=pos,
                span=(pos + len(head), pos + len(head) + len(tail)), question=len(ids) - len(question),
                lead=answer_lead(enc, tail))

def answer_lead(enc, tail):
    """The ids an answer (tail: the needle's " {number}.", which the answer repeats) writes before its number's first
    symbol: none for GPT-2's BPE (" 81" holds one), " " for characters, SentencePiece's "▁" piece. The needle score
    reads the row after them: the one that writes the number, not its space."""
    symbols, lead = prompts_of(enc)["symbols"], []
    for i in tail:
        if any(c in symbols for c in enc.decode_single_token_bytes(i).decode(errors="replace")):
            break
        lead.append(i)
    return lead

def window_start(hay, L, rng):  # where a random stretch of L tokens of hay starts
    return int(rng.integers(max(len(hay) - L, 0) + 1))

def needle_in_window(enc, hay, L, depth, city, number, rng, prefix=()):
    """needle_trial in a random stretch of hay."""
    s = window_start(hay, L, rng)
    return needle_trial(enc, hay[s:s + L], L, depth, city, number, prefix)

def control_span(t, rng):
    """[c, c + n): n haystack tokens, n the length of the needle's number span, drawn uniformly among the stretches
    that overlap neither the needle sentence nor the question: the weight any such span gets. Token 0 is left
    out: it is an attention sink."""
    a, e = t["span"]  # e also ends the needle sentence
    starts = np.r_[1:t["pos"] - (e - a) + 1, e:t["question"] - (e - a) + 1]
    if len(starts) == 0:
        raise DataError(f"context size {t['context']} leaves no {e - a}-token stretch of haystack beside the needle "
                        "for the control span: use a longer context")
    c = int(rng.choice(starts))
    return c, c + e - a

def trials(args, enc, hay, L, rng):
    """The prompts of one context size, made lazily: long prompts add up. Each starts as the model's texts did in
    pretraining (vocab.bos: an import's <s>)."""
    P, first = prompts_of(enc), vocab.bos(enc)
    for flag in ("context_sizes", "depths"):  # a repeat: one cell counted twice (a context seeds its prompts)
        given = list(getattr(args, flag, None) or ())
        if len(set(given)) < len(given):
            raise DataError(f"--{flag} {' '.join(map(str, given))}: give each value once")
    needle = lambda depth: needle_in_window(enc, hay, L, depth, EVAL_CITIES[rng.integers(len(EVAL_CITIES))],
                                            draw_number(rng, "eval", P["digits"]), rng, first)
    if args.mode == "needle":
        yield from (dict(needle(d), trial=i) for d in args.depths for i in range(args.samples))
    elif args.mode == "passkey":
        piece = functools.partial(vocab.continuation, enc)  # after the intro, as inside the running text
        filler = piece(P["filler"])
        for i in range(args.samples):
            k, depth = draw_number(rng, "eval", 5), int(rng.integers(0, 101))  # even: no fine-tune answer (odd)
            key = piece(P["passkey"].format(k=spell(k, enc)))
            filled = filler * (L // len(filler) + 1)
            ids, pos, actual = build_prompt(enc, filled, key, piece(P["passkey_question"]), L, depth,
                                            first + enc.encode(P["intro"]))
            yield dict(trial=i, context=L, depth=depth, actual_depth=actual, number=k, ids=ids, pos=pos)
    else:  # score: Fig. 7's fixed needle, then Fig. 8's random ones
        # own rng: controls leave the prompts unchanged
        scored = lambda t, i: dict(t, trial=i, control=control_span(t, np.random.default_rng([args.seed, L, i])))
        fig7 = int(str(FIG7_NUMBER)[:P["digits"]])  # the paper's needle
        yield scored(needle_in_window(enc, hay, L, args.depth, "Tokyo", fig7, rng, first), 0)
        yield from (scored(needle(int(rng.integers(0, 101))), i) for i in range(1, args.trials + 1))

# ----------------------------------------------------------------------------------------------------------------
# The needle score and its baselines
# control span: a max over heads is high by selection alone

def with_lead(idx, batch):
    """(B, T + n): the prompts idx (B, T), each followed by its trial's answer lead (n ids; none for GPT-2's BPE):
    the last row of these writes the number's first symbol, where the needle score reads the attention."""
    lead = torch.tensor([t["lead"] for t in batch], dtype=idx.dtype, device=idx.device)  # (B, n)
    return torch.cat([idx, lead], 1)

def needle_scores(w, spans):
    """(B, n_layer, n_head): each prompt's weight on its span [a, e); w (n_layer, B, n_head, T) holds one query row
    per prompt (needle.py: the last of prompt + answer lead, which writes the number's first symbol)."""
    return torch.stack([w[:, b, :, a:e].sum(-1) for b, (a, e) in enumerate(spans)])

def score_trials(w, spans, controls):
    """Per prompt: the weight on its needle and control spans at the best head (each span's own max, so both gain
    the same from selection) and at the mean head; uniform: span tokens / keys the row attends to (T: causal)."""
    heads, control, T = needle_scores(w, spans), needle_scores(w, controls), w.size(-1)  # (B, n_layer, n_head)
    out = []
    for b, ((a, e), (c, _)) in enumerate(zip(spans, controls)):
        top_layer, top_head = divmod(int(heads[b].argmax()), heads.size(2))  # Fig. 8 marks a trial by its top head
        out.append(dict(heads=heads[b], top_score=heads[b].max().item(), top_layer=top_layer, top_head=top_head,
                        mean_score=heads[b].mean().item(), control_top_score=control[b].max().item(),
                        control_mean_score=control[b].mean().item(), uniform=(e - a) / T, span_start=a,
                        span_tokens=e - a, control_start=c, keys=T))
    return out

def ranked_heads(rows):
    """Fig. 7's table: each row's heads ((n_layer, n_head) needle scores) from the highest score down, rank 1 first."""
    return [dict(model=r["model"], rank=i + 1, layer=j // r["heads"].size(1), head=j % r["heads"].size(1),
                 score=r["heads"].flatten()[j].item())
            for r in rows for i, j in enumerate(r["heads"].flatten().argsort(descending=True).tolist())]

# ----------------------------------------------------------------------------------------------------------------
# Retrieval fine-tuning data

def squad_examples(source):
    """(prompt, answer) of the SQuAD 2.0 examples whose context, question and answer are all non-empty."""
    import datasets  # slow import, needed only here
    ext = os.path.splitext(source)[1].lower()
    kw = dict(path=source) if ext not in (".json", ".jsonl", ".parquet") else dict(
        path="parquet" if ext == ".parquet" else "json", data_files=source)
    try:  # streaming: no copy in the datasets cache
        rows = iter(datasets.load_dataset(**kw, split="train", streaming=True))
        first = next(rows, None)
    except Exception as e:  # offline hub, bad name or path: one line
        raise DataError(f"cannot load SQuAD from {source!r}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}")
    if first is None or not {"context", "question", "answers"} <= set(first):
        raise DataError(f"{source!r} needs columns context, question, answers{{text}}; has {list(first or [])}")
    fields = (((ex["context"] or "").strip(), (ex["question"] or "").strip(),
               (((ex["answers"] or {}).get("text") or [""])[0] or "").strip()) for ex in itertools.chain([first], rows))
    return ({"prompt": SQUAD_PROMPT.format(context=c, question=q), "answer": " " + a}
            for c, q, a in fields if c and q and a)

def synthetic_examples(enc, hay, n, length, rng):
    """Needles in train-split text, the question at the end; the model's start of text (vocab.bos: an import's <s>,
    which load_sft puts first) + prompt + answer = length tokens as load_sft reads them back. The prompt's text,
    encoded again, may be longer (SentencePiece gives its first word a "▁"): its text window is then trimmed on the
    left and the needle placed in what is left."""
    P, first = prompts_of(enc), vocab.bos(enc)
    for _ in range(n):
        city, number = TRAIN_CITIES[rng.integers(len(TRAIN_CITIES))], draw_number(rng, "train", P["digits"])
        answer = P["tail"].format(number=spell(number, enc))
        n_answer = len(vocab.continuation(enc, answer))
        depth, room = int(rng.integers(0, 101)), length - len(first) - n_answer  # room: the prompt's tokens
        s, trim, over = window_start(hay, room, rng), 0, 1
        try:
            while over > 0:
                t = needle_trial(enc, hay[s + trim:s + room], room - trim, depth, city, number)
                prompt = enc.decode(t["ids"].tolist())
                over = len(enc.encode_ordinary(prompt)) - room
                trim += over
        except DataError as e:  # report it in --sft_length's terms
            m = re.search(r"at least (\d+)", str(e))
            if not m:
                raise
            raise DataError(f"--sft_length {length} is too short for a synthetic example: its "
                            f"{'start of text, ' * bool(first)}needle, question and answer take "
                            f"{int(m.group(1)) + n_answer + len(first) - 1} tokens (more with a longer city name), "
                            f"and the haystack needs room too") from None
        yield {"prompt": prompt, "answer": answer}

def sft_examples(args, enc):
    """(name, examples) of `needle.py sft_data`: args.synthetic needles in train-split text, or else SQuAD 2.0."""
    if not args.synthetic:
        return "sft_squad", squad_examples(args.squad)
    rng = np.random.default_rng(args.seed)
    return "sft_synthetic", synthetic_examples(enc, load_hay(args.data, "train"), args.synthetic, args.sft_length, rng)

def load_hay(data_dir, split, vocab_size=None):
    """The split as one running text; vocab_size: each id below it (a model's), else DataError."""
    tokens = np.asarray(dataset.load_split(data_dir, split))  # DataError if the split is missing
    if vocab_size is not None:
        dataset.check_ids(data_dir, split, vocab_size)
    return tokens[tokens != vocab.codec(data_dir).eot_token]  # one running text

