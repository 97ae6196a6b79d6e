"""
Reproduce the three papers' experiments at small scale, end to end (RESULTS.md reports what came out).

    python reproduce.py --scale cpu     # 2 CPU cores, ~50 minutes: tiny model, N = 128, evaluation to 10 N
    python reproduce.py --scale gpu     # one H100/H200, ~20 GPU minutes: 6 x 384 model, N = 256, evaluation to 10 N
    python reproduce.py --suite synthetic [--quick]   # synthetic.py: tasks x scorers x 3 seeds on 2 CPU cores

Every variant is trained on the same data, token budget and seed with train.py; then eval_long.py (RoPE θ x 50, the
SSMax paper's Fig. 5, and Dynamic NTK, the LSSAR paper's Table 4), needle.py after a short retrieval fine-tune on
synthetic needles (Fig. 6, needle scores Figs. 7-8) and passkey on the pretrained models (LSSAR Fig. 3). Runs live in
out-repro-<name>/ (checkpoints), results in results/<name>/ (PNG, CSV, JSON); --name defaults to the scale. A step
whose output exists is skipped, so an interrupted reproduction continues where it stopped. Each step's command and
wall time go to results/<name>/steps.jsonl; summary.json gathers the numbers RESULTS.md quotes.
"""
import argparse, json, os, shutil, subprocess, sys, time

import numpy as np
import torch

import compare

# ----------------------------------------------------------------------------------------------------------------
# The two scales. The model fields are GPTConfig's, the rest TrainConfig's (train.py).

SCALES = {
    "cpu": dict(
        # width 64: GPT-2's 50,257-token head is most of the cost, so a narrow model sees more tokens per minute
        model=dict(n_layer=4, n_head=2, n_embd=64, ffn_hidden=176, block_size=128),
        # 8 x 128 = 1,024 tokens/iter x 250 iters = 256,000 tokens per variant and seed (0.11 epoch of `english`)
        train=dict(batch_size=8, gradient_accumulation_steps=1, max_iters=250, learning_rate=3e-3, warmup_iters=25,
                   lr_schedule="constant", eval_interval=125, eval_iters=8, log_interval=50, device="cpu"),
        sft=dict(examples=400, max_iters=40, batch_size=8, learning_rate=5e-4),
        eval=dict(num_seqs=16, needle_contexts=[128, 256, 640, 1280], samples=4, passkey_contexts=[128, 256, 640, 1280],
                  passkey_samples=10, score_context=1024, trials=16, batch_size=4)),
    "gpu": dict(
        model=dict(n_layer=6, n_head=6, n_embd=384, ffn_hidden=1024, block_size=256),
        # 64 x 256 = 16,384 tokens/iter x 1,200 iters = 19.7M tokens per variant (8.2 epochs of `english`)
        train=dict(batch_size=64, gradient_accumulation_steps=1, max_iters=1200, learning_rate=1e-3, warmup_iters=100,
                   lr_schedule="constant", eval_interval=200, eval_iters=20, log_interval=100, device="cuda"),
        sft=dict(examples=4000, max_iters=200, batch_size=32, learning_rate=3e-4),
        eval=dict(num_seqs=64, needle_contexts=[256, 512, 1280, 2560], samples=20, passkey_contexts=[256, 512, 1280,
                  2560], passkey_samples=50, score_context=2048, trials=100, batch_size=16)),
}
SWITCH_AT = 0.875  # variant (f): softmax for the first 87.5 % of the iterations, SSMax for the rest (175k of 200k)
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
}
# glibc keeps freed memory instead of unmapping it (kernels_cpu.reuse_freed_memory, which train.py calls itself):
# the evaluations' B x L x 50,257 logits would page-fault back in at every batch
REUSE_FREED_MEMORY = dict(MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(2**31 - 1))
REPO = os.path.dirname(os.path.abspath(__file__))
DATASET = "english"  # prepare_data.py: Shakespeare + King James Bible, 2.4M train tokens


def kv(d):
    return [f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in d.items()]


def step(name, cmd, results, done=None):
    """Run one command unless `done` (a path) exists; log its command line and wall time."""
    if done and os.path.exists(done):
        print(f"[skip] {name}: {done} exists")
        return
    print(f"[run] {name}: {' '.join(cmd)}", flush=True)
    t0 = time.time()
    subprocess.run([sys.executable, os.path.join(REPO, cmd[0]), *cmd[1:]], check=True,  # outputs under the cwd
                   env={**os.environ, **REUSE_FREED_MEMORY})
    with open(os.path.join(results, "steps.jsonl"), "a") as f:
        f.write(json.dumps(dict(step=name, command=" ".join(cmd), wall_s=round(time.time() - t0, 1))) + "\n")


def iter_of(path):
    from model import read_checkpoint  # weights_only=True; mmap: the pickle is read, the tensors are not
    return read_checkpoint(path, mmap=True)["iter_num"] if os.path.isfile(path) else None


# ----------------------------------------------------------------------------------------------------------------
# Training: nine variants from scratch, (e) and (f) from the softmax run

def train_all(S, runs, results, data_dir, seed):
    M = S["train"]["max_iters"]
    base = ["train.py", *kv(S["model"]), *kv(S["train"]), f"dataset={DATASET}", f"data_dir={data_dir}", f"seed={seed}"]
    ckpt = lambda v: os.path.join(runs, v, "ckpt.pt")
    # softmax in two legs so that (f) can branch off at the switch; the resume is exact (tests/test_train.py)
    k, tag = int(SWITCH_AT * M), f" (seed {seed})"
    if iter_of(ckpt("softmax")) != M:
        step("train softmax to the switch" + tag, base + kv(dict(scorer="softmax", out_dir=f"{runs}/softmax",
                                                                   max_iters=k, resume=True)), results)
        if iter_of(ckpt("softmax")) == k and not os.path.isfile(ckpt("softmax_at_switch")):
            os.makedirs(os.path.join(runs, "softmax_at_switch"), exist_ok=True)
            shutil.copy(ckpt("softmax"), ckpt("softmax_at_switch"))
        step("train softmax" + tag, base + kv(dict(scorer="softmax", out_dir=f"{runs}/softmax", resume=True)), results)
    for v, (over, _) in VARIANTS.items():
        if over is None or v == "softmax":
            continue
        step(f"train {v}{tag}", base + kv({**over, "out_dir": f"{runs}/{v}", "resume": True}), results,
             done=ckpt(v) if iter_of(ckpt(v)) == M else None)
    # (e): convert, no training (max_iters=0 evaluates and saves). (f): the softmax run resumed at the switch with
    # scorer=ssmax (s0): its data stream and AdamW state continue, as the SSMax paper continues pretraining
    step("convert softmax -> ssmax (e)" + tag, base + kv(dict(init_from=ckpt("softmax"), scorer="ssmax", max_iters=0,
                                                              out_dir=f"{runs}/ssmax_e")), results, done=ckpt("ssmax_e"))
    if not os.path.isfile(ckpt("ssmax_f")):
        os.makedirs(os.path.join(runs, "ssmax_f"), exist_ok=True)
        shutil.copy(ckpt("softmax_at_switch"), ckpt("ssmax_f"))
    step("train (f) after the switch" + tag, base + kv(dict(init_from="resume", scorer="ssmax",
                                                            out_dir=f"{runs}/ssmax_f")),
         results, done=ckpt("ssmax_f") if iter_of(ckpt("ssmax_f")) == M else None)


def loss_curves(roots, results, M):
    """SSMax Fig. 4: every variant's training loss (moving average), mean over the seeds' runs with their range;
    train_loss.csv: every eval of every seed."""
    k, rows, curves = int(SWITCH_AT * M), [], {}
    read = lambda path: [json.loads(l) for l in open(path)]
    for v in VARIANTS:
        for seed, runs in roots.items():
            log = read(os.path.join(runs, v, "log.jsonl"))
            if v == "ssmax_f":  # (f) continues the softmax run at the switch (its log starts there)
                log = [r for r in read(os.path.join(runs, "softmax", "log.jsonl")) if r["iter"] < k] + log
            curves.setdefault(v, []).append(dict(sorted((r["iter"], r["loss"]) for r in log if "loss" in r)))
            rows += [dict(variant=v, seed=seed, iter=r["iter"], train_loss=r["train_loss"], val_loss=r["val_loss"])
                     for r in log if "val_loss" in r]
    w = max(1, M // 20)
    fig, (ax,) = compare.figure(1.6)
    for c, (v, runs) in enumerate(curves.items()):
        x = sorted(set.intersection(*(set(r) for r in runs)))
        if len(x) > w:
            y = np.array([compare.moving_average([r[i] for i in x], w) for r in runs])  # (seeds, points)
            ax.plot(x[w - 1:], y.mean(0), color=f"C{c % 10}", ls="--" if c >= 10 else "-", label=VARIANTS[v][1])
            ax.fill_between(x[w - 1:], y.min(0), y.max(0), color=f"C{c % 10}", alpha=0.15, lw=0)
    ax.axvline(k, color="gray", ls=":", lw=0.8)
    ax.set(xlabel="iteration", ylabel=f"training loss (moving average of {w} steps)",
           title=f"Training loss (SSMax paper Fig. 4): mean of {len(roots)} seeds, band = their range; dotted: the "
                 "(f) switch")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7)
    fig.savefig(os.path.join(results, "train_loss.png"), dpi=120)
    compare.write_csv(os.path.join(results, "train_loss.csv"), rows, ("variant", "seed", "iter", "train_loss",
                                                                      "val_loss"))
    return rows


def context_gates(curve, N):
    """The validity gates of RESULTS.md from one model's native-θ per-position loss (positions 1..N): context use =
    loss at position 1 minus the mean over N/2+1..N; distant context = positions 9-16 minus N/2+1..N."""
    far = float(np.mean(curve[N // 2:N]))
    return dict(context_gain=float(curve[0]) - far, distant_gain=float(np.mean(curve[8:16])) - far)


def summarize(S, a, roots, results, rows, t0):
    """summary.json: what RESULTS.md quotes, read back from the steps' own outputs, each number over the seeds."""
    N, seeds = S["model"]["block_size"], list(roots)
    read = lambda *p: json.load(open(os.path.join(*p))) if os.path.isfile(os.path.join(*p)) else None
    last = {(r["variant"], r["seed"]): r for r in rows}  # the last eval of each run (rows are in iteration order)
    losses = {}
    for v in VARIANTS:
        val = [last[v, s]["val_loss"] for s in seeds]
        paired = [last[v, s]["val_loss"] - last["softmax", s]["val_loss"] for s in seeds]
        losses[v] = dict(per_seed={s: last[v, s] for s in seeds}, val=compare.seed_interval(val),
                         train=compare.seed_interval([last[v, s]["train_loss"] for s in seeds]),
                         val_minus_softmax=compare.seed_interval(paired))
    summary = dict(scale=a.scale, dataset=DATASET, config=S, seeds=seeds, variants={v: l for v, (_, l) in
                   VARIANTS.items()}, tokens_per_variant=S["train"]["batch_size"] * S["train"]
                   ["gradient_accumulation_steps"] * N * S["train"]["max_iters"], losses=losses,
                   interval="mean, sample sd and 95% Student-t interval over seeds (compare.seed_interval)",
                   wall_s=round(time.time() - t0, 1))
    for method in ("theta", "dynamic_ntk"):
        per_seed = [read(results, f"s{s}", f"eval_long_{method}", "summary.json") for s in seeds]
        if not all(per_seed):
            continue
        windows = {}
        for rope, key in (("extended", None), ("native", "native")):
            for m in per_seed[0]["models"]:
                got = [next(x for x in p["models"] if x["label"] == m["label"]) for p in per_seed]
                got = [g[key] if key else g for g in got]
                windows.setdefault(rope, {})[m["label"]] = {w: compare.seed_interval([g["windows"][w]["mean_loss"]
                                                            for g in got]) for w in m["windows"]}
        diffs = compare.across_seeds([p["differences"] for p in per_seed])
        summary[f"eval_long_{method}"] = dict(windows=windows, differences=diffs)
        compare.plot_differences(os.path.join(results, f"eval_long_{method}_differences.png"), diffs, list(VARIANTS),
                                 {"extended": per_seed[0]["models"][0]["rope_method"], "native": "native θ"},
                                 f"{method}: mean over {len(seeds)} seeds of each model's paired difference to "
                                 "softmax, 95% t interval over seeds")
        if method == "theta":  # the gates read the native curves' trained positions 1..N
            curves = [compare.read_csv(os.path.join(results, f"s{s}", "eval_long_theta", "per_position.csv"))
                      for s in seeds]
            gates = {v: [context_gates([float(r[f"{v} [native]"]) for r in c], N) for c in curves] for v in VARIANTS}
            summary["gates"] = {v: {g: compare.seed_interval([x[g] for x in gs]) for g in gs[0]}
                                for v, gs in gates.items()}
    for name in ("needle", "passkey", "needle_score_trials"):
        s = read(results, "needle", f"{name}.json")
        if s:
            summary[name] = s["cells"]
            if "scores" in s:  # the needle score's means beside its control span and uniform baseline
                summary["needle_scores"] = s["scores"]
    with open(os.path.join(results, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


# ----------------------------------------------------------------------------------------------------------------

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", choices=SCALES, default="cpu")
    p.add_argument("--max_iters", type=int, help="override the scale's training iterations (report it if you do)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1337, 1338, 1339],
                   help="training seeds of the LM runs (retrieval runs on the first seed's models)")
    p.add_argument("--name", help="folders out-repro-<name>/ and results/<name>/ (default: the scale)")
    p.add_argument("--skip", nargs="*", default=[], choices=["eval_long", "needle", "passkey", "score", "bench"])
    p.add_argument("--suite", choices=["lm", "synthetic"], default="lm",
                   help="lm: the papers' language-model experiments (--scale); synthetic: synthetic.py's task suite")
    p.add_argument("--quick", action="store_true", help="--suite synthetic: FIRST and recall, 3 settings (~10 min)")
    p.add_argument("--jobs", type=int, default=2, help="--suite synthetic: runs at once, one core each")
    p.add_argument("--tasks", nargs="+", help="--suite synthetic: a subset of synthetic.SUITE")
    p.add_argument("--settings", nargs="+", help="--suite synthetic: a subset of synthetic.SETTINGS")
    a = p.parse_args(argv)
    if a.suite == "synthetic":
        import synthetic
        bad = sorted(set(a.tasks or []) - set(synthetic.SUITE)) + sorted(set(a.settings or []) -
                                                                         set(synthetic.SETTINGS))
        if bad or a.jobs < 1:
            sys.exit(f"error: unknown --tasks/--settings {bad} or --jobs {a.jobs} < 1; tasks: "
                     f"{', '.join(synthetic.SUITE)}; settings: {', '.join(synthetic.SETTINGS)}")
        return synthetic.main(quick=a.quick, jobs=a.jobs, settings=a.settings, task_names=a.tasks, name=a.name)
    S = SCALES[a.scale]
    if a.max_iters:  # a copy: SCALES stays what the docs say
        S = {**S, "train": {**S["train"], "max_iters": a.max_iters}}
    if a.scale == "gpu" and not torch.cuda.is_available():
        sys.exit("error: --scale gpu needs CUDA; use --scale cpu here")
    name = a.name or a.scale
    root, results, data_dir = f"out-repro-{name}", os.path.join("results", name), "data"
    roots = {seed: os.path.join(root, f"s{seed}") for seed in a.seeds}  # every seed's runs: its own folder
    os.makedirs(results, exist_ok=True)
    t0 = time.time()
    import prepare_data
    prepare_data.prepare(DATASET, out_dir=data_dir)  # a no-op when up to date
    E, N, data = S["eval"], S["model"]["block_size"], os.path.join(data_dir, DATASET)
    common = ["--data", data, "--seed", "0"]  # the same test sequences for every model and seed
    for seed, runs in roots.items():
        train_all(S, runs, results, data_dir, seed)
        ckpts = [os.path.join(runs, v, "ckpt.pt") for v in VARIANTS]
        for method, scale in (("theta", 50), ("dynamic_ntk", 1)) * ("eval_long" not in a.skip):  # Fig. 5; Table 4
            out = os.path.join(results, f"s{seed}", f"eval_long_{method}")
            step(f"eval_long {method} (seed {seed})", ["eval_long.py", *ckpts, *common, "--length", str(10 * N),
                 "--rope_method", method, "--rope_scale", str(scale), "--num_seqs", str(E["num_seqs"]),
                 "--batch_size", "4", "--labels", *VARIANTS, "--baseline", "softmax", "--out_dir", out]
                 + (["--fading"] if method == "theta" else []), results, done=os.path.join(out, "summary.json"))
    rows = loss_curves(roots, results, S["train"]["max_iters"])
    # retrieval on the first seed's models: a retrieval fine-tune on synthetic needles (SQuAD is online), then the
    # needle, needle-score and passkey evaluations
    runs, needle_dir = roots[a.seeds[0]], os.path.join(results, "needle")
    if "needle" not in a.skip or "score" not in a.skip:
        step("sft data", ["needle.py", "sft_data", "--synthetic", str(S["sft"]["examples"]), "--data", data,
                          "--sft_length", str(N), "--out_dir", os.path.join(runs, "sft")], results,
             done=os.path.join(runs, "sft", "sft_synthetic.jsonl"))
        sft = dict(sft_data=os.path.join(runs, "sft", "sft_synthetic.jsonl"), block_size=N,
                   max_iters=S["sft"]["max_iters"], batch_size=S["sft"]["batch_size"], gradient_accumulation_steps=1,
                   learning_rate=S["sft"]["learning_rate"], lr_schedule="cosine", lr_decay_iters=S["sft"]["max_iters"],
                   min_lr=0.0, warmup_iters=S["sft"]["max_iters"] // 10, beta2=0.999, weight_decay=0.0,
                   eval_interval=S["sft"]["max_iters"], eval_iters=5, log_interval=20, device=S["train"]["device"])
        for v in VARIANTS:
            step(f"sft {v}", ["train.py", *kv({**sft, "init_from": os.path.join(runs, v, "ckpt.pt"),
                                               "out_dir": os.path.join(runs, "sft", v)})], results,
                 done=os.path.join(runs, "sft", v, "ckpt.pt"))
    ckpts, sft_ckpts = ([os.path.join(runs, *sub, v, "ckpt.pt") for v in VARIANTS] for sub in ((), ("sft",)))
    nl = ["--batch_size", str(E["batch_size"]), "--max_new_tokens", "8", "--labels", *VARIANTS, *common,
          "--out_dir", needle_dir]
    if "needle" not in a.skip:
        step("needle", ["needle.py", "needle", "--ckpt", *sft_ckpts, "--context_sizes", *map(str, E["needle_contexts"]),
                        "--samples", str(E["samples"]), *nl], results, done=os.path.join(needle_dir, "needle.json"))
    if "score" not in a.skip:
        step("needle scores", ["needle.py", "score", "--ckpt", *sft_ckpts, "--context", str(E["score_context"]),
                               "--trials", str(E["trials"]), *nl], results,
             done=os.path.join(needle_dir, "needle_score_trials.json"))
    if "passkey" not in a.skip:
        step("passkey", ["needle.py", "passkey", "--ckpt", *ckpts, "--context_sizes", *map(str, E["passkey_contexts"]),
                         "--samples", str(E["passkey_samples"]), *nl], results,
             done=os.path.join(needle_dir, "passkey.json"))
    if a.scale == "gpu" and "bench" not in a.skip:
        step("kernel benchmark", [os.path.join("bench", "attention.py"), "--out", os.path.join(results, "kernels")],
             results, done=os.path.join(results, "kernels.png"))
    summarize(S, a, roots, results, rows, t0)
    print(f"done: {results}/summary.json")

if __name__ == "__main__":
    main()
