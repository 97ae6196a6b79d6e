"""
Sample text from a trained checkpoint, one token at a time through the KV cache.

    python sample.py --ckpt out-quick/ckpt.pt                                  # 3 samples of 200 tokens after "\\n"
    python sample.py --ckpt out/ckpt.pt --start "ROMEO:" --num_samples 5 --temperature 0   # greedy
    python sample.py --ckpt out/ckpt.pt --start FILE:prompt.txt --rope_theta 500000        # long prompt, θ extended

--start "" starts from <|endoftext|> (a fresh document; from an imported tokenizer's start of text where it has one).
Text is encoded and decoded with the checkpoint's own codec (GPT-2's BPE, its characters or an imported tokenizer;
--data, if given, must hold the same); a checkpoint older than stored codecs reads the dataset it was trained on (its
meta.json: characters for NAME_char, nanoGPT's rule), or --data's; GPT-2's without one. An imported tokenizer's prompt
starts with its start of text (Llama's <s>), as transformers' does, hidden in the output. Generation may run past the
training length: the rotary tables are built long enough for prompt + new tokens, with the checkpoint's θ or
--rope_theta (same weights).
Samples go to stdout, each followed by a line of dashes; bad input is one "error: ..." line and exit status 1.
"""
import argparse, math, sys
from contextlib import nullcontext

import torch

from lib import dataset, vocab
from lib.checkpoint import CheckpointError, load_checkpoint, pick_device, read_checkpoint
from model import BACKENDS

SEP = "-" * 15  # nanoGPT's separator line
MIN_TEMPERATURE = 1e-3  # below it logits / T part by > 88 nats a 0.1 gap (e^-88 ~ 0): greedy, say 0


def main(argv=None):
    p = argparse.ArgumentParser(description="Checkpoint -> text, sampled with the KV cache.")
    p.error = lambda message: sys.exit(f"error: {message}")  # one line, no usage dump
    p.add_argument("--ckpt", default="out/ckpt.pt", help="checkpoint written by train.py")
    p.add_argument("--start", default="\n", help='prompt text, or "FILE:path" to read it from a file')
    p.add_argument("--num_samples", type=int, default=3)
    p.add_argument("--max_new_tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy (argmax)")
    p.add_argument("--top_k", type=int, default=200, help="sample only among the k most likely tokens")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--rope_theta", type=float, help="RoPE base θ for sampling (default: the checkpoint's)")
    p.add_argument("--data", help="a dataset folder whose meta.json must hold the checkpoint's own codec (an older "
                                  "checkpoint without one: the codec; default: the training run's)")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: model.auto_backend")
    args = p.parse_args(argv)
    for name, low in (("num_samples", 1), ("max_new_tokens", 1), ("top_k", 1)):
        if getattr(args, name) < low:
            p.error(f"--{name} {getattr(args, name)} must be >= {low}")
    if not (args.temperature == 0 or MIN_TEMPERATURE <= args.temperature < math.inf):  # also refuses nan
        p.error(f"--temperature {args.temperature} must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, inf)")
    if args.rope_theta is not None and not 0 < args.rope_theta < math.inf:
        p.error(f"--rope_theta {args.rope_theta} must be > 0 and finite")
    if not 0 <= args.seed < 2**64:  # torch.manual_seed's range
        p.error(f"--seed {args.seed} must be in 0..2**64-1")
    try:
        device = pick_device(args.device)
    except ValueError as e:
        p.error(str(e))

    start = args.start
    if start.startswith("FILE:"):
        try:
            with open(start[5:], encoding="utf-8") as f:
                start = f.read()
        except (OSError, UnicodeDecodeError) as e:
            p.error(f"cannot read the prompt file {start[5:]!r}: {e.strerror if isinstance(e, OSError) else e}")
    try:
        ckpt = vocab.language_model(args.ckpt, read_checkpoint(args.ckpt, mmap=True))  # a task run: before its model
        model = load_checkpoint(args.ckpt, device, backend=args.backend)[0]
        enc = vocab.checkpoint_codec(ckpt, args.data)
        first = vocab.bos(enc)  # an import's texts start with its <s>; a written <|endoftext|> is the trained separator
        ids = first + enc.encode(start, allowed_special={"<|endoftext|>"}) or [enc.eot_token]
    except (CheckpointError, dataset.DataError) as e:  # missing, corrupt, foreign or unsafe, a task run, a bad char
        p.error(str(e))
    model.eval()  # load_checkpoint leaves dropout on
    if args.rope_theta is not None and model.config.pos == "nope":
        p.error(f"--rope_theta {args.rope_theta:g}: this model has no RoPE (pos='nope'), so it would change nothing")
    # size RoPE once for the whole sample: no regrowing
    # set_rope changes no weights, only RoPE buffers
    length = max(len(ids) + args.max_new_tokens, model.config.block_size)
    if args.rope_theta is not None or length > model.rope_cos.size(0):
        model.set_rope(args.rope_theta, None, length)

    torch.manual_seed(args.seed)  # seeds CPU and CUDA: same seed, same samples
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    x = torch.tensor([ids], dtype=torch.long, device=device)
    skip = len(first) or (0 if start else 1)  # hide the model's <s>, or an empty prompt's starting <|endoftext|>
    with torch.no_grad(), ctx:
        for _ in range(args.num_samples):
            y = model.generate(x, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                               vocab=enc.n_vocab)  # a padded vocabulary: only ids the codec knows
            print(enc.decode(y[0, skip:].tolist()), SEP, sep="\n", flush=True)


if __name__ == "__main__":
    main()
