"""
The language-model suite of reproduce.py (`python reproduce.py --scale cpu|gpu|cpu_char`): its scales and variants,
each seed's steps (training, then eval_long, the copy gate and retrieval) run with lib/runs.py's Steps; reproduce.py
runs them all and writes report.py's summary. reproduce.py's docstring says what it reproduces; lib/synthetic.py is
the other suite.
"""
import itertools, os

from lib import compare, retrieval
from lib.checkpoint import iter_of, read_checkpoint, trained
from lib.folders import copy_whole
from lib.provenance import code, data_identity
from lib.report import read_json
from lib.runs import check_runs, done, keep_train_log
from lib.synthetic_suite import values

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

def kv(d):  # train.py's key=value arguments
    return [f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in d.items()]


def trained_with(S, data):
    """What every variant's training shares (its record: a step reading a checkpoint names the training behind it):
    the command's fields, the sha256 of the splits in `data` and what the command resolves to now but the seed (a
    default edited since changes it; the command's fields do not)."""
    name = S.get("dataset", DATASET)
    now = values(None, [*kv(S["model"]), *kv(S["train"]), f"dataset={name}", f"data_dir={os.path.dirname(data)}"])
    return dict(model=S["model"], train=S["train"], dataset=name, switch_at=SWITCH_AT, sha256=data_identity(data),
                values={k: v for k, v in now.items() if k != "seed"})


def train_all(S, runs, steps, data_dir, seed, variants, threads):
    data = os.path.join(data_dir, S.get("dataset", DATASET))
    check_runs(runs, dict(train=trained_with(S, data), variants={v: VARIANTS[v][0] for v in variants}), steps.redo)
    M = S["train"]["max_iters"]
    base = ["train.py", *kv(S["model"]), *kv(S["train"]), f"dataset={S.get('dataset', DATASET)}",
            f"data_dir={data_dir}", f"seed={seed}"]
    ckpt = lambda v: os.path.join(runs, v, "ckpt.pt")
    run = lambda name, cmd, out=None: steps.run(name + f" (seed {seed})", cmd, out, threads,
                                                clear=[os.path.dirname(out)] if out else ())  # a variant's folder
    # softmax in two legs: (f) branches off at the switch
    k = int(SWITCH_AT * M)
    if iter_of(ckpt("softmax")) != M:
        run("train softmax to the switch", base + kv(dict(scorer="softmax", out_dir=f"{runs}/softmax", max_iters=k,
                                                          resume=True)))
        if iter_of(ckpt("softmax")) == k and not os.path.isfile(ckpt("softmax_at_switch")):
            copy_whole(ckpt("softmax"), ckpt("softmax_at_switch"))  # a kill mid-copy: no cut ckpt.pt
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
            copy_whole(ckpt("softmax_at_switch"), ckpt("ssmax_f"))
        run("train (f) after the switch", base + kv(dict(init_from="resume", scorer="ssmax", overwrite=True,
                                                         out_dir=f"{runs}/ssmax_f")), trained(ckpt("ssmax_f"), M))


def eval_settings(cmd, S, data, seed, reads, **extra):
    """A step's settings: its command, the training of the checkpoints it reads and needle.py's rules (RULES)."""
    extra = {"rules": retrieval.RULES, **extra} if cmd[0] == "needle.py" else extra
    return dict(command=cmd, train=trained_with(S, data), seed=seed, variants={v: VARIANTS[v][0] for v in reads},
                **extra)


def pending(steps, todo):
    """The steps of todo to run: not done, or (redo) done with other settings; StepError for one done with other
    settings without redo, before anything trains. A skipped one (--skip) never runs: Steps.skip() keeps its output
    only where made with the settings asked now (the training summary.json reports)."""
    to_run = []
    for t in todo:
        if t["skipped"]:
            steps.skip(t["name"], t["out"], t["settings"], t["clear"], t["whole"])
        elif not (done(t["out"]) and steps.reuse(t["name"], t["settings"], t["clear"], t["whole"], t["out"])):
            to_run.append(t)
    return to_run


def text_seed(texts, seed):
    """The evaluations' --seed, which draws their test texts: 0 for every training seed ("shared", the default: seeds
    and texts are crossed, so texts can be the unit), or the training seed's own ("per_seed": distinct texts)."""
    return seed if texts == "per_seed" else 0


def complete(out_dir, variants):
    """eval_long.py's summary.json if it holds every variant, else None: one written by an earlier run with fewer
    variants must not pass for done."""
    path = os.path.join(out_dir, "summary.json")
    summary = read_json(path)
    return path if summary and {m["label"] for m in summary["models"]} >= set(variants) else None


def unrecorded_training(results):
    """The training of a folder's outputs from before settings were recorded (runs.Steps' made): its older
    summary.json's config, kept by every later one as unrecorded_training (reproduce.py), as their config says what
    a later call ran (maybe other training); {} in a folder without: not known (runs.mismatch refuses its outputs)."""
    summary = read_json(results, "summary.json") or {}
    return summary.get("unrecorded_training", summary.get("config") and {"dataset": summary.get("dataset"),
                                                                          **summary["config"]}) or {}


def own_args(out, settings):
    """Where the args an output records (its .json's: the scripts write them) differ from its command asked now on
    the test texts' --seed and the --labels, in words: an output from before settings were recorded has no other
    record of them (runs.Steps' own), so --texts per_seed or a --variants subset never takes one made otherwise."""
    args = (read_json(os.path.splitext(out)[0] + ".json") or {}).get("args") if out else None
    cmd, diff = settings.get("command") or [], []
    for key in ("seed", "labels") if args else ():
        if f"--{key}" in cmd and key in args:
            asked = list(itertools.takewhile(lambda x: not x.startswith("--"), cmd[cmd.index(f"--{key}") + 1:]))
            had = [str(x) for x in (args[key] if isinstance(args[key], list) else [args[key]])]
            diff += [f"its args' --{key} {' '.join(had)[:60]} -> {' '.join(asked)[:60]}"] * (had != asked)
    return diff


def made_at(reused):
    """The commits the outputs a call reused (Steps.reused) were made at, from their run_info (their own; a .jsonl's
    .json, a .png's .csv rows): {code (provenance.code, as the synthetic suite's): steps}, "not recorded" where none is."""
    got = {}
    for out in filter(None, reused.values()):
        stem, ext = os.path.splitext(out)
        if ext == ".png":  # bench/attention.py: run_info's fields in every row of its .csv
            info = next(iter(compare.read_csv(stem + ".csv")), {}) if os.path.isfile(stem + ".csv") else {}
        else:
            held = read_checkpoint(out, mmap=True) if ext == ".pt" else read_json(stem + ".json")  # .jsonl: beside
            info = (held or {}).get("run_info") or {}
        sha = code({**info, "git_dirty": str(info.get("git_dirty")) == "True"}) or "not recorded"  # the .csv's "True"
        got[sha] = got.get(sha, 0) + 1
    return got


def seed_steps(S, seed, runs, steps, data, variants, threads, skip, texts=None):
    """One seed: the gates, eval_long under θ x 50 and Dynamic NTK, the copy gate and retrieval, after its training
    (kept as s<seed>/train_log.csv.gz), which runs only when one of them is missing: results resume anywhere."""
    E, N, results = S["eval"], S["model"]["block_size"], steps.results
    ckpts = [os.path.join(runs, v, "ckpt.pt") for v in variants]
    common = ["--data", data, "--seed", str(text_seed(texts, seed))]
    todo = []  # run after training

    def run(name, cmd, out, reads=variants, clear=None, whole=True, skipped=False):
        todo.append(dict(name=name + f" (seed {seed})", cmd=cmd, out=out, clear=clear or [os.path.dirname(out)],
                         settings=eval_settings(cmd, S, data, seed, reads), whole=whole, skipped=skipped))
    # gates (RESULTS.md): loss by position at trained θ; many: position 1 has one token per sequence
    gate = os.path.join(results, f"s{seed}", "gate")
    run("gate", ["eval_long.py", *ckpts, *common, "--length", str(N), "--rope_method", "none", "--num_seqs",
                 str(E["gate_seqs"]), "--batch_size", "32", "--labels", *variants, "--baseline", "softmax",
                 "--out_dir", gate], os.path.join(gate, "summary.json"), whole=bool(complete(gate, variants)))
    for method, scale in (("theta", 50), ("dynamic_ntk", 1)):  # Fig. 5; Table 4
        out = os.path.join(results, f"s{seed}", f"eval_long_{method}")
        run(f"eval_long {method}", ["eval_long.py", *ckpts, *common, "--length", str(E.get("length_x", 10) * N),
                                    "--rope_method", method, "--rope_scale", str(scale), "--num_seqs",
                                    str(E["num_seqs"]), "--batch_size", "4", "--labels", *variants, "--baseline",
                                    "softmax", "--out_dir", out] + (["--fading"] if method == "theta" else []),
            os.path.join(out, "summary.json"), whole=bool(complete(out, variants)), skipped="eval_long" in skip)
    for name, how in COPY_RUNS.items() if "copy_seqs" in E else ():  # the copy gate (eval_copy.py)
        out, some = os.path.join(results, f"s{seed}", name), ["softmax"] if "--logit_scale" in how else variants
        run(name, ["eval_copy.py", *[os.path.join(runs, v, "ckpt.pt") for v in some], *common, "--span",
                   str(S["train"]["copy_span"]), "--num_seqs", str(E["copy_seqs"]), "--distances", *COPY_DISTANCES,
                   "--labels", *some, "--out_dir", out, *(x.format(N=N) for x in how)],
            os.path.join(out, "summary.json"), some)
    for name, how in RETRIEVAL_RUNS.items() if "sft" not in S else ():  # no fine-tuning: every seed's models
        retrieval_steps(E, ckpts, ckpts, variants, common + how, os.path.join(results, f"s{seed}", name),
                        lambda step_name, cmd, out, clear, skipped: run(step_name + name[6:].replace("_", " "), cmd,
                                                                        out, clear=clear, skipped=skipped), skip)
    todo = pending(steps, todo)
    if todo:
        train_all(S, runs, steps, os.path.dirname(data), seed, variants, threads)
        keep_train_log(runs, variants, os.path.join(results, f"s{seed}", "train_log.csv.gz"))
    for t in todo:
        steps.run(t["name"], t["cmd"], t["out"], threads, t["settings"])


# each needle.py mode's files, what --redo clears (needle.py's outputs())
NEEDLE_FILES = {"needle": ["needle"], "needle scores": ["needle_score_heads", "needle_score_trials"],
                "passkey": ["passkey"]}


def retrieval_steps(E, ckpts, sft_ckpts, variants, common, out, run, skip):
    """needle (SSMax Fig. 6) and needle scores (Figs. 7-8) on sft_ckpts, passkey (LSSAR Fig. 3) on ckpts, into out;
    run(name, cmd, out, clear, skipped) with skipped True for those in skip."""
    nl = ["--batch_size", str(E.get("batch_size", 4)), "--max_new_tokens", "8", "--labels", *variants, *common,
          "--out_dir", out]
    files = lambda name: [os.path.join(out, f"{stem}.{ext}") for stem in NEEDLE_FILES[name]
                          for ext in ("csv", "png", "json", "jsonl")]
    run("needle", ["needle.py", "needle", "--ckpt", *sft_ckpts, "--context_sizes", *map(str, E["needle_contexts"]),
                   "--samples", str(E["samples"]), *nl], os.path.join(out, "needle.json"), files("needle"),
        "needle" in skip)
    run("needle scores", ["needle.py", "score", "--ckpt", *sft_ckpts, "--context", str(E["score_context"]),
                          "--trials", str(E["trials"]), *nl], os.path.join(out, "needle_score_trials.json"),
        files("needle scores"), "score" in skip)
    run("passkey", ["needle.py", "passkey", "--ckpt", *ckpts, "--context_sizes", *map(str, E["passkey_contexts"]),
                    "--samples", str(E["passkey_samples"]), *nl], os.path.join(out, "passkey.json"), files("passkey"),
        "passkey" in skip)


def sft_retrieval(S, seed, runs, steps, data, variants, common, skip):
    """Retrieval on the first seed's models after a short retrieval fine-tune (synthetic SFT works offline); the
    models train again (train_all: a no-op when they exist) only when a retrieval output is missing."""
    E, N, sft_dir = S["eval"], S["model"]["block_size"], os.path.join(runs, "sft")
    ckpts, sft_ckpts = ([os.path.join(runs, *sub, v, "ckpt.pt") for v in variants] for sub in ((), ("sft",)))
    todo = []
    retrieval_steps(E, ckpts, sft_ckpts, variants, common, os.path.join(steps.results, "needle"),
                    lambda name, cmd, out, clear, skipped: todo.append(dict(
                        name=name, cmd=cmd, out=out, clear=clear, whole=True, skipped=skipped,
                        settings=eval_settings(cmd, S, data, seed, variants, sft=S["sft"]))), skip)
    todo = pending(steps, todo)
    if not todo:
        return
    train_all(S, runs, steps, os.path.dirname(data), seed, variants, None)
    keep_train_log(runs, variants, os.path.join(steps.results, f"s{seed}", "train_log.csv.gz"))
    if "needle" not in skip or "score" not in skip:
        steps.run("sft data", ["needle.py", "sft_data", "--synthetic", str(S["sft"]["examples"]), "--data", data,
                               "--sft_length", str(N), "--out_dir", sft_dir],
                  os.path.join(sft_dir, "sft_synthetic.jsonl"), clear=[sft_dir])  # its models too: they read it
        sft = dict(sft_data=os.path.join(sft_dir, "sft_synthetic.jsonl"), block_size=N,
                   max_iters=S["sft"]["max_iters"], batch_size=S["sft"]["batch_size"], gradient_accumulation_steps=1,
                   learning_rate=S["sft"]["learning_rate"], lr_schedule="cosine", lr_decay_iters=S["sft"]["max_iters"],
                   min_lr=0.0, warmup_iters=S["sft"]["max_iters"] // 10, beta2=0.999, weight_decay=0.0,
                   eval_interval=S["sft"]["max_iters"], eval_iters=5, log_interval=20, device=S["train"]["device"],
                   sft_val_frac=0.0)  # the committed runs' recipe: every example trains (ckpt.pt is read, not best)
        for v in variants:
            steps.run(f"sft {v}", ["train.py", *kv({**sft, "init_from": os.path.join(runs, v, "ckpt.pt"),
                                                    "out_dir": os.path.join(sft_dir, v), "resume": True})],
                      trained(os.path.join(sft_dir, v, "ckpt.pt"), S["sft"]["max_iters"]),
                      clear=[os.path.join(sft_dir, v)])
    for t in todo:
        steps.run(t["name"], t["cmd"], t["out"], None, t["settings"])
