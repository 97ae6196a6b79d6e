"""
Reproduce the three papers' experiments at small scale, end to end (RESULTS.md reports what came out).

    python reproduce.py --scale cpu     # 2 CPU cores, ~2 hours: 4 x 64 model, N = 128, 3 seeds, evaluation to 10 N
    python reproduce.py --scale gpu     # one H100/H200, ~1 GPU hour: 6 x 384, N = 256, 3 seeds, evaluation to 10 N
    python reproduce.py --scale cpu_char --seeds 1337 1338 1339 1340 1341   # characters with copies (#32), ~3 h
    python reproduce.py --suite synthetic [--quick]   # synthetic.py: tasks x scorers x 5-10 seeds on 2 CPU cores

Every variant trains on the same data and token budget, once per seed (--seeds), with train.py; then eval_long.py
(RoPE θ x 50: SSMax Fig. 5; Dynamic NTK: LSSAR Table 4), and on the first seed's models needle.py after a short
retrieval fine-tune (Figs. 6-8) and passkey (LSSAR Fig. 3). cpu_char trains on characters whose training windows
repeat a code (train.py's copy_frac), adds the copy gate (eval_copy.py) and the zoo, evaluates to 16 N, and runs
needle, needle scores and passkey in characters on every seed's models, without a fine-tune. Runs live in
out-repro-<name>/s<seed>/, results in out-results/<name>/ (results/<name>/ with --commit-results). A step whose
output exists is skipped, so an interrupted reproduction resumes; on a CPU, --jobs seeds run at once (one core each).
The runs are scratch: training runs only when an evaluation is missing, and what the report needs of it is kept in
the results (lib/runs.py), so results/<name>/ alone resumes on a new machine (--commit-results gzips its CSVs).
report.py writes summary.json, the numbers RESULTS.md quotes.
"""
import argparse, os, shutil, sys, time
from concurrent.futures import ThreadPoolExecutor

import torch

from lib import report
from lib.runs import (REPO, complete, done, iter_of, keep_train_log, kv, pack, read_train_logs, step,
                      trained)

# ----------------------------------------------------------------------------------------------------------------
# Scales: model = GPTConfig, train = TrainConfig

SCALES = {
    "cpu": dict(
        # narrow: the vocabulary head dominates the cost
        model=dict(n_layer=4, n_head=2, n_embd=64, ffn_hidden=176, block_size=128),
        train=dict(batch_size=8, gradient_accumulation_steps=1, max_iters=250, learning_rate=3e-3, warmup_iters=25,
                   lr_schedule="constant", eval_interval=125, eval_iters=8, log_interval=50, device="cpu"),
        sft=dict(examples=400, max_iters=40, batch_size=8, learning_rate=5e-4),
        eval=dict(num_seqs=16, gate_seqs=256, needle_contexts=[128, 256, 640, 1280], samples=4,
                  passkey_contexts=[128, 256, 640, 1280], passkey_samples=10, score_context=1024, trials=16,
                  batch_size=4)),
    "gpu": dict(
        model=dict(n_layer=6, n_head=6, n_embd=384, ffn_hidden=1024, block_size=256),
        train=dict(batch_size=64, gradient_accumulation_steps=1, max_iters=1200, learning_rate=1e-3, warmup_iters=100,
                   lr_schedule="constant", eval_interval=200, eval_iters=20, log_interval=100, device="cuda"),
        sft=dict(examples=4000, max_iters=200, batch_size=32, learning_rate=3e-4),
        eval=dict(num_seqs=64, gate_seqs=1024, needle_contexts=[256, 512, 1280, 2560], samples=20,
                  passkey_contexts=[256, 512, 1280, 2560], passkey_samples=50, score_context=2048, trials=100,
                  batch_size=16)),
    "cpu_char": dict(
        # copies in every window: at 0.25 or 0.5 no model learnt to copy within 3,000 iterations (RESULTS.md)
        dataset="english_char",
        model=dict(n_layer=2, n_head=4, n_embd=128, ffn_hidden=352, block_size=64),
        train=dict(batch_size=32, gradient_accumulation_steps=1, max_iters=3000, learning_rate=3e-3, warmup_iters=50,
                   lr_schedule="constant", eval_interval=1000, eval_iters=8, log_interval=250, device="cpu",
                   copy_frac=1.0, copy_span=16, copy_kind="random"),
        # retrieval on every seed's models, without fine-tuning (the codes taught copying): characters, to 8 N
        eval=dict(num_seqs=32, gate_seqs=256, length_x=16, copy_seqs=64, needle_contexts=[64, 128, 256, 512],
                  samples=8, passkey_contexts=[64, 128, 256, 512], passkey_samples=40, score_context=256, trials=40,
                  batch_size=8),
        variants=("softmax", "ssmax", "ssmax_nos", "ssmax_bias", "ssmax_e", "ssmax_f", "ssa", "lssa", "lssar",
                  "softpick", "stickbreaking", "fox")),
}
SWITCH_AT = 0.875  # (f): the SSMax paper switches at 175k of 200k
VARIANTS = {  # name -> (overrides, paper label)
    "softmax": (dict(scorer="softmax"), "(a) softmax"),
    "ssmax": (dict(scorer="ssmax"), "(b) SSMax, learnable s"),
    "ssmax_nos": (dict(scorer="ssmax", ssmax_learn_s=False), "(c) SSMax without s"),
    "ssmax_bias": (dict(scorer="ssmax", ssmax_bias=True), "(d) SSMax with bias"),
    "ssmax_e": (None, "(e) softmax -> SSMax after pretraining"),
    "ssmax_f": (None, "(f) softmax -> SSMax for the last 12.5 %"),
    "ssa": (dict(scorer="ssa"), "SSA, n = 1.5"),
    "ssa_learn_n": (dict(scorer="ssa", ssa_learn_n=True), "SSA, learnable n"),
    "lssa": (dict(scorer="lssa"), "LSSA"),
    "lssar": (dict(scorer="lssar"), "LSSAR, p = 15"),
    "softmax_p3": (dict(scorer="softmax", reweight_p=3.0), "softmax re-weighted, p = 3"),
    "softpick": (dict(scorer="softpick"), "softpick"),
    "stickbreaking": (dict(scorer="stickbreaking", pos="nope"), "stick-breaking, NoPE"),
    "fox": (dict(scorer="fox", pos="nope"), "FoX, NoPE"),
}
PAPERS = tuple(VARIANTS)[:11]  # the cpu and gpu scales' variants: the three papers'
# the copy gate's runs (folder -> eval_copy.py options): native θ, θ x 50, and softmax rescaled (llama4's F = N, as in
# the synthetic suite: Llama 4's 8,192 changes nothing below 8,192 tokens)
COPY_RUNS = {"copy": [], "copy_theta50": ["--rope_method", "theta", "--rope_scale", "50"],
             **{f"copy_{k}": ["--logit_scale", k] for k in ("qwen", "yarn")},
             "copy_llama4": ["--logit_scale", "llama4", "--llama4_floor", "{N}"]}
# retrieval without fine-tuning (characters): θ x 50 (needle.py's default, the SSMax paper's) and native θ, where the
# retrieval gate is read (θ x 50 also changes a model inside N)
RETRIEVAL_RUNS = {"needle": [], "needle_native": ["--rope_method", "none"]}
COPY_DISTANCES = ["0.25", "0.5", "0.75", "1", "2", "4", "8", "16"]
DATASET = "english"  # prepare_data.py: Shakespeare + King James Bible


# ----------------------------------------------------------------------------------------------------------------
# Training: (e) and (f) start from the softmax run

def train_all(S, runs, results, data_dir, seed, variants, threads):
    M = S["train"]["max_iters"]
    base = ["train.py", *kv(S["model"]), *kv(S["train"]), f"dataset={S.get('dataset', DATASET)}",
            f"data_dir={data_dir}", f"seed={seed}"]
    ckpt = lambda v: os.path.join(runs, v, "ckpt.pt")
    run = lambda name, cmd, out=None: step(name + f" (seed {seed})", cmd, results, out, threads)
    # softmax in two legs: (f) branches off at the switch
    k = int(SWITCH_AT * M)
    if iter_of(ckpt("softmax")) != M:
        run("train softmax to the switch", base + kv(dict(scorer="softmax", out_dir=f"{runs}/softmax", max_iters=k,
                                                          resume=True)))
        if iter_of(ckpt("softmax")) == k and not os.path.isfile(ckpt("softmax_at_switch")):
            os.makedirs(os.path.join(runs, "softmax_at_switch"), exist_ok=True)
            shutil.copy(ckpt("softmax"), ckpt("softmax_at_switch"))
        run("train softmax", base + kv(dict(scorer="softmax", out_dir=f"{runs}/softmax", resume=True)))
    for v in variants:
        over = VARIANTS[v][0]
        if over is not None and v != "softmax":
            run(f"train {v}", base + kv({**over, "out_dir": f"{runs}/{v}", "resume": True}), trained(ckpt(v), M))
    if "ssmax_e" in variants:  # (e): convert only (max_iters=0 evaluates and saves)
        run("convert softmax -> ssmax (e)", base + kv(dict(init_from=ckpt("softmax"), scorer="ssmax", max_iters=0,
                                                           out_dir=f"{runs}/ssmax_e")), ckpt("ssmax_e"))
    if "ssmax_f" in variants:  # (f): SSMax resumes softmax's data and AdamW state
        if not os.path.isfile(ckpt("ssmax_f")):
            os.makedirs(os.path.join(runs, "ssmax_f"), exist_ok=True)
            shutil.copy(ckpt("softmax_at_switch"), ckpt("ssmax_f"))
        run("train (f) after the switch", base + kv(dict(init_from="resume", scorer="ssmax", overwrite=True,
                                                         out_dir=f"{runs}/ssmax_f")), trained(ckpt("ssmax_f"), M))


def seed_steps(S, seed, runs, results, data, variants, threads, skip):
    """One seed: the gates, eval_long under θ x 50 and Dynamic NTK, the copy gate and retrieval, after its training
    (kept as s<seed>/train_log.csv.gz), which runs only when one of them is missing: results resume anywhere."""
    E, N = S["eval"], S["model"]["block_size"]
    ckpts, common = [os.path.join(runs, v, "ckpt.pt") for v in variants], ["--data", data, "--seed", "0"]
    todo = []  # (name, command, output): run after training
    run = lambda name, cmd, out: todo.append((name + f" (seed {seed})", cmd, out))
    # gates (RESULTS.md): loss by position at trained θ; many: position 1 has one token per sequence
    gate = os.path.join(results, f"s{seed}", "gate")
    run("gate", ["eval_long.py", *ckpts, *common, "--length", str(N), "--rope_method", "none", "--num_seqs",
                 str(E["gate_seqs"]), "--batch_size", "32", "--labels", *variants, "--baseline", "softmax",
                 "--out_dir", gate], complete(gate, variants))
    for method, scale in (("theta", 50), ("dynamic_ntk", 1)) * ("eval_long" not in skip):  # Fig. 5; Table 4
        out = os.path.join(results, f"s{seed}", f"eval_long_{method}")
        run(f"eval_long {method}", ["eval_long.py", *ckpts, *common, "--length", str(E.get("length_x", 10) * N),
                                    "--rope_method", method, "--rope_scale", str(scale), "--num_seqs",
                                    str(E["num_seqs"]), "--batch_size", "4", "--labels", *variants, "--baseline",
                                    "softmax", "--out_dir", out] + (["--fading"] if method == "theta" else []),
            complete(out, variants))
    for name, how in COPY_RUNS.items() if "copy_seqs" in E else ():  # the copy gate (eval_copy.py)
        out, some = os.path.join(results, f"s{seed}", name), ["softmax"] if "--logit_scale" in how else variants
        run(name, ["eval_copy.py", *[os.path.join(runs, v, "ckpt.pt") for v in some], *common, "--span",
                   str(S["train"]["copy_span"]), "--num_seqs", str(E["copy_seqs"]), "--distances", *COPY_DISTANCES,
                   "--labels", *some, "--out_dir", out, *(x.format(N=N) for x in how)],
            os.path.join(out, "summary.json"))
    for name, how in RETRIEVAL_RUNS.items() if "sft" not in S else ():  # no fine-tuning: every seed's models
        retrieval_steps(E, ckpts, ckpts, variants, common + how, os.path.join(results, f"s{seed}", name),
                        lambda step_name, cmd, out: run(step_name + name[6:].replace("_", " "), cmd, out), skip)
    if not all(done(out) for *_, out in todo):
        train_all(S, runs, results, os.path.dirname(data), seed, variants, threads)
        keep_train_log(runs, variants, os.path.join(results, f"s{seed}", "train_log.csv.gz"))
    for name, cmd, out in todo:
        step(name, cmd, results, out, threads)


def retrieval_steps(E, ckpts, sft_ckpts, variants, common, out, run, skip):
    """needle (SSMax Fig. 6) and needle scores (Figs. 7-8) on sft_ckpts, passkey (LSSAR Fig. 3) on ckpts, into out."""
    nl = ["--batch_size", str(E.get("batch_size", 4)), "--max_new_tokens", "8", "--labels", *variants, *common,
          "--out_dir", out]
    if "needle" not in skip:
        run("needle", ["needle.py", "needle", "--ckpt", *sft_ckpts, "--context_sizes", *map(str, E["needle_contexts"]),
                       "--samples", str(E["samples"]), *nl], os.path.join(out, "needle.json"))
    if "score" not in skip:
        run("needle scores", ["needle.py", "score", "--ckpt", *sft_ckpts, "--context", str(E["score_context"]),
                              "--trials", str(E["trials"]), *nl], os.path.join(out, "needle_score_trials.json"))
    if "passkey" not in skip:
        run("passkey", ["needle.py", "passkey", "--ckpt", *ckpts, "--context_sizes", *map(str, E["passkey_contexts"]),
                        "--samples", str(E["passkey_samples"]), *nl], os.path.join(out, "passkey.json"))


def sft_retrieval(S, seed, runs, results, data, variants, common, skip):
    """Retrieval on the first seed's models after a short retrieval fine-tune (synthetic SFT works offline); the
    models train again (train_all: a no-op when they exist) only when a retrieval output is missing."""
    E, N, sft_dir = S["eval"], S["model"]["block_size"], os.path.join(runs, "sft")
    ckpts, sft_ckpts = ([os.path.join(runs, *sub, v, "ckpt.pt") for v in variants] for sub in ((), ("sft",)))
    todo = []
    retrieval_steps(E, ckpts, sft_ckpts, variants, common, os.path.join(results, "needle"),
                    lambda name, cmd, out: todo.append((name, cmd, out)), skip)
    if all(done(out) for *_, out in todo):
        return
    train_all(S, runs, results, os.path.dirname(data), seed, variants, None)
    keep_train_log(runs, variants, os.path.join(results, f"s{seed}", "train_log.csv.gz"))
    if "needle" not in skip or "score" not in skip:
        step("sft data", ["needle.py", "sft_data", "--synthetic", str(S["sft"]["examples"]), "--data", data,
                          "--sft_length", str(N), "--out_dir", sft_dir], results,
             os.path.join(sft_dir, "sft_synthetic.jsonl"))
        sft = dict(sft_data=os.path.join(sft_dir, "sft_synthetic.jsonl"), block_size=N,
                   max_iters=S["sft"]["max_iters"], batch_size=S["sft"]["batch_size"], gradient_accumulation_steps=1,
                   learning_rate=S["sft"]["learning_rate"], lr_schedule="cosine", lr_decay_iters=S["sft"]["max_iters"],
                   min_lr=0.0, warmup_iters=S["sft"]["max_iters"] // 10, beta2=0.999, weight_decay=0.0,
                   eval_interval=S["sft"]["max_iters"], eval_iters=5, log_interval=20, device=S["train"]["device"])
        for v in variants:
            step(f"sft {v}", ["train.py", *kv({**sft, "init_from": os.path.join(runs, v, "ckpt.pt"),
                                               "out_dir": os.path.join(sft_dir, v), "resume": True})],
                 results, trained(os.path.join(sft_dir, v, "ckpt.pt"), S["sft"]["max_iters"]))
    for name, cmd, out in todo:
        step(name, cmd, results, out)


# ----------------------------------------------------------------------------------------------------------------

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", choices=SCALES, default="cpu")
    p.add_argument("--max_iters", type=int, help="override the scale's training iterations (report it if you do)")
    p.add_argument("--seeds", type=int, nargs="+", help="training seeds (lm: 1337 1338 1339, retrieval on the "
                   "first seed's models; synthetic: each task's own count, 0, 1, ...)")
    p.add_argument("--name", help="folders out-repro-<name>/ and out-results/<name>/ (default: the scale)")
    p.add_argument("--commit-results", action="store_true",
                   help="write the committed results/<name>/ (RESULTS.md's numbers) instead of out-results/<name>/")
    p.add_argument("--skip", nargs="*", default=[], choices=["eval_long", "needle", "passkey", "score", "bench"])
    p.add_argument("--suite", choices=["lm", "synthetic"], default="lm",
                   help="lm: the papers' language-model experiments (--scale); synthetic: synthetic.py's task suite")
    p.add_argument("--quick", action="store_true", help="--suite synthetic: FIRST, 3 settings x 6 seeds (~6 min)")
    p.add_argument("--jobs", type=int, default=2, help="on a CPU, runs at once, one core each (lm: seeds)")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, help="lm: a subset of the scale's (softmax among them)")
    p.add_argument("--tasks", nargs="+", help="--suite synthetic: a subset of synthetic.SUITE")
    p.add_argument("--settings", nargs="+", help="--suite synthetic: a subset of synthetic.SETTINGS")
    a = p.parse_args(argv)
    if a.suite != "synthetic" and (a.quick or a.tasks or a.settings):  # else they'd silently run the LM suite
        sys.exit("error: --quick, --tasks and --settings need --suite synthetic")
    if a.jobs < 1:
        sys.exit(f"error: --jobs {a.jobs}: must be >= 1")
    if a.suite == "synthetic":
        from lib import synthetic
        for flag, given, allowed in (("--tasks", a.tasks, synthetic.SUITE), ("--settings", a.settings,
                                                                             synthetic.SETTINGS)):
            if set(given or []) - set(allowed):
                sys.exit(f"error: {flag} {' '.join(sorted(set(given) - set(allowed)))}: unknown; allowed: "
                         f"{', '.join(allowed)}")
        return synthetic.main(quick=a.quick, jobs=a.jobs, settings=a.settings, task_names=a.tasks, name=a.name,
                              seeds=a.seeds, commit=a.commit_results)
    S = SCALES[a.scale]
    if a.max_iters:  # a copy: SCALES stays what the docs say
        S = {**S, "train": {**S["train"], "max_iters": a.max_iters}}
    if a.scale == "gpu" and not torch.cuda.is_available():
        sys.exit("error: --scale gpu needs CUDA; use --scale cpu here")
    variants = [v for v in S.get("variants", PAPERS) if not a.variants or v in a.variants]
    # softmax: the baseline, and where (e) and (f) start
    if "softmax" not in variants or set(a.variants or []) - set(variants):
        sys.exit(f"error: --variants {' '.join(a.variants)}: they must be {a.scale}'s and include softmax; "
                 f"{a.scale}'s: {' '.join(S.get('variants', PAPERS))}")
    name, a.seeds = a.name or a.scale, a.seeds or [1337, 1338, 1339]
    root, data_dir = f"out-repro-{name}", "data"
    results = os.path.join("results" if a.commit_results else "out-results", name)
    roots = {seed: os.path.join(root, f"s{seed}") for seed in a.seeds}  # every seed's runs: its own folder
    os.makedirs(results, exist_ok=True)
    labels = {v: VARIANTS[v][1] for v in variants}
    t0 = time.time()
    from lib import dataset
    DATA = S.get("dataset", DATASET)
    dataset.prepare(DATA, out_dir=data_dir)  # a no-op when up to date
    E, N, data = S["eval"], S["model"]["block_size"], os.path.join(data_dir, DATA)
    common = ["--data", data, "--seed", "0"]  # the same test sequences for every model and seed
    jobs = 1 if S["train"]["device"] != "cpu" else max(1, min(a.jobs, len(roots)))  # one GPU: one at a time
    with ThreadPoolExecutor(jobs) as pool:  # each seed's steps in order; seeds side by side, a core each
        list(pool.map(lambda sr: seed_steps(S, *sr, results, data, variants, 1 if jobs > 1 else None, a.skip),
                      roots.items()))
    M = S["train"]["max_iters"]
    rows = report.loss_curves(read_train_logs(results, a.seeds), results, labels, int(SWITCH_AT * M), M)
    if "sft" in S:  # else every seed's retrieval ran in seed_steps
        sft_retrieval(S, a.seeds[0], roots[a.seeds[0]], results, data, variants, common, a.skip)
    if a.scale == "gpu" and "bench" not in a.skip:
        step("kernel benchmark", [os.path.join("bench", "attention.py"), "--out", os.path.join(results, "kernels")],
             results, os.path.join(results, "kernels.png"))
    report.summarize(results, roots, labels, N, rows, list(COPY_RUNS), scale=a.scale, dataset=DATA, config=S,
                     tokens_per_variant=S["train"]["batch_size"] * N * M
                     * S["train"]["gradient_accumulation_steps"], wall_s=round(time.time() - t0, 1))
    if a.commit_results:
        pack(results, a.seeds)
    print(f"done: {results}/summary.json")

if __name__ == "__main__":
    main()
