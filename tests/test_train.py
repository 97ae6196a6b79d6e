"""train.py: config files and key=value overrides coerced to the field types, one-line errors (unknown key, wrong
type, inapplicable scorer option, missing dataset, bad SFT file, divergence), the resolved config in the checkpoint,
exact resume (in-process and after a SIGKILL), the NaN stop keeping the last good checkpoint, the softmax->SSMax
switch, SFT targets and runs, DDP on CPU (torchrun, gloo) equal to one process, the embedded dataset prepared on
demand, progress lines, log.jsonl and loss.png. Tiny models on tiny random data, CPU only."""
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from lib import vocab
from lib import retrieval
from lib import config
import train
from conftest import code_carrying_copy
from lib.checkpoint import load_checkpoint, run_info
from model import ssmax_s_for_switch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(REPO, "train.py")
VOCAB = 512  # the random datasets' ids are < VOCAB: a small head keeps every step fast
TINY = ["device=cpu", f"vocab_size={VOCAB}", "n_layer=1", "n_head=2", "n_embd=32", "ffn_hidden=64", "block_size=16",
        "batch_size=2", "gradient_accumulation_steps=1", "eval_iters=2", "log_interval=1", "warmup_iters=2",
        "learning_rate=1e-2"]
# a child process must not believe it is a torchrun worker; one thread, like the tests in this process
ENV = {**{k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                            "MASTER_PORT")}, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread on a shared CPU (and runs compared across processes match)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """<data_dir>/rand/{train,val}.bin: uint16 random token ids, what dataset.load_split reads."""
    d = tmp_path_factory.mktemp("data")
    os.makedirs(d / "rand")
    rng = np.random.default_rng(0)
    for split, n in (("train", 4096), ("val", 1024)):
        rng.integers(0, VOCAB, n).astype(np.uint16).tofile(d / "rand" / f"{split}.bin")
    return str(d)


def tiny_args(data_dir, out_dir, *extra):
    return [*TINY, f"data_dir={data_dir}", "dataset=rand", f"out_dir={out_dir}", *extra]


def read_log(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def step_losses(out_dir, since_last_start=False):
    """{iter: training loss} from log.jsonl; a later line of an iter wins (a resumed run re-logs it)."""
    rows = read_log(out_dir)
    if since_last_start:
        rows = rows[max(i for i, r in enumerate(rows) if "start_iter" in r):]
    return {r["iter"]: r["loss"] for r in rows if "loss" in r}


def error_of(argv):
    """main's one-line error (what it prints to stderr) for argv."""
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    msg = e.value.code
    assert isinstance(msg, str) and msg.startswith("error: ") and "\n" not in msg, msg
    return msg


def run_script(*argv, cwd=REPO):
    return subprocess.Popen([sys.executable, TRAIN, *argv], cwd=cwd, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


# ----------------------------------------------------------------------------------------------------------------
# Config parsing


@pytest.mark.parametrize("arg,key,want", [
    ("max_iters=2e2", "max_iters", 200),
    ("learning_rate=1", "learning_rate", 1.0),
    ("dataset=kjv", "dataset", "kjv"),
    ("out_dir=123", "out_dir", "123"),
    ("init_from=out-a/ckpt.pt", "init_from", "out-a/ckpt.pt"),
    ("reweight_p=None", "reweight_p", None),
    ("reweight_p=2", "reweight_p", 2.0),
    ("resume=True", "resume", True),
    ("--batch_size=8", "batch_size", 8),
    ("scorer='ssmax'", "scorer", "ssmax"),
])
def test_override_is_literal_eval_coerced_to_the_field_type(arg, key, want):
    got = train.parse_args([arg])
    assert got == {key: want} and type(got[key]) is type(want)


def test_config_files_then_overrides_apply_in_order_and_skip_private_names_constants_modules_functions(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import math\n_scratch = 5\nSTEPS = 7\ndef helper():\n    return 1\n"
                 "learning_rate = math.sqrt(1e-6)\nmax_iters = 2e3\nscorer = 'ssmax'\nreweight_p = None\n")
    b.write_text("max_iters = 20\nbatch_size = 4\n")
    assert train.parse_args([str(a), "max_iters=5", str(b), "batch_size=8"]) == {
        "learning_rate": 1e-3, "max_iters": 20, "scorer": "ssmax", "reweight_p": None, "batch_size": 8}
    assert train.parse_args([str(b), str(a)])["max_iters"] == 2000  # the later file wins
    assert type(train.parse_args([str(a)])["max_iters"]) is int


def test_every_shipped_config_file_parses_into_valid_fields():
    configs = sorted(os.path.join(REPO, "configs", f) for f in os.listdir(os.path.join(REPO, "configs"))
                     if f.endswith(".py"))
    assert configs
    for path in configs:
        explicit = train.parse_args([path])
        assert explicit and set(explicit) <= {f for f in train.TrainConfig.__dataclass_fields__}, path
        train.TrainConfig(**explicit)  # every value has its field's type
    quick = train.parse_args([os.path.join(REPO, "configs", "cpu_quick.py"), "scorer=softmax"])
    assert quick["scorer"] == "softmax" and quick["block_size"] == 128 and quick["max_iters"] == 200


@pytest.mark.parametrize("argv,words", [
    (["badkey=1"], "unknown config key 'badkey'"),
    (["learning_rat=1e-3"], "did you mean 'learning_rate'?"),
    (["max_iters=1.5"], "max_iters=1.5 has the wrong type"),
    (["learning_rate=fast"], "learning_rate='fast' has the wrong type"),
    (["compile=1"], "compile=1 has the wrong type"),
    (["resume=yes"], "resume='yes' has the wrong type"),
    (["configs/nope.py"], "neither an existing config file"),
])
def test_bad_override_is_one_error_line(argv, words):
    assert words in error_of(argv)


def test_typo_inside_a_config_file_is_one_error_line_naming_key_and_file(tmp_path):
    cfg = tmp_path / "typo.py"
    cfg.write_text("max_iters = 10\nlearing_rate = 1e-3\n")
    msg = error_of([str(cfg)])
    assert "'learing_rate'" in msg and str(cfg) in msg and "did you mean 'learning_rate'?" in msg
    cfg.write_text("max_iters = 1 / 0\n")
    assert "ZeroDivisionError" in error_of([str(cfg)])


def test_command_line_errors_are_one_stderr_line_without_traceback(data_dir, tmp_path):
    typo = tmp_path / "typo.py"
    typo.write_text("n_layer = 2\nn_heads = 2\n")
    out = str(tmp_path / "out")
    cases = [(["badkey=1"], "badkey"),
             ([str(typo)], "n_heads"),
             (tiny_args(data_dir, out, "scorer=softmax", "ssmax_s_init=0.5"), "ssmax_s_init")]
    procs = [run_script(*argv) for argv, _ in cases]
    for p, (argv, words) in zip(procs, cases):
        _, err = p.communicate(timeout=120)
        assert p.returncode != 0 and "Traceback" not in err, (argv, err)
        assert err.startswith("error: ") and err.count("\n") == 1 and words in err, (argv, err)
    assert not os.path.exists(out)  # nothing was started


def test_scorer_option_for_another_scorer_and_missing_dataset_are_one_error_line(data_dir, tmp_path):
    msg = error_of(tiny_args(data_dir, tmp_path / "out", "scorer=softmax", "ssmax_s_init=0.5"))
    assert "ssmax_s_init=0.5 does not apply to scorer='softmax'" in msg
    msg = error_of(tiny_args(data_dir, tmp_path / "out", "scorer=lssa", "ssa_n=2.0"))
    assert "ssa_n=2.0 does not apply" in msg
    msg = error_of([*TINY, f"data_dir={tmp_path}", "dataset=nowhere", f"out_dir={tmp_path / 'out'}"])
    assert "dataset" in msg and "nowhere" in msg and "prepare_data.py" in msg
    assert "does not exist" in error_of(tiny_args(data_dir, tmp_path / "out", "init_from=resume"))
    assert not (tmp_path / "nowhere").exists() and not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------------------------------
# The resolved config, progress, log.jsonl, loss.png


def test_resolved_config_is_printed_with_every_field_whole_and_stored_in_the_checkpoint(data_dir, tmp_path, capsys):
    out = tmp_path / ("out-" + "-".join(["hyphenated"] * 12))  # a long path with hyphens is not split across lines
    train.main(tiny_args(data_dir, out, "max_iters=2", "eval_interval=2", "scorer=ssmax", "ssmax_s_init=0.5"))
    printed = capsys.readouterr().out
    ckpt = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)
    cfg = ckpt["config"]
    want = {**vars(train.TrainConfig()), **train.parse_args(tiny_args(data_dir, out, "max_iters=2", "eval_interval=2",
                                                                     "scorer=ssmax", "ssmax_s_init=0.5"))}
    assert cfg == want  # every field: the defaults, then what the command set
    assert cfg["max_iters"] == 2 and cfg["scorer"] == "ssmax" and cfg["ssmax_s_init"] == 0.5 and cfg["n_embd"] == 32
    assert ckpt["model_args"] == {k: cfg[k] for k in config.MODEL_FIELDS} and ckpt["iter_num"] == 2
    assert printed.startswith("config: ")
    config_text = printed[:printed.index("M parameters")]  # the config lines, up to the parameter count
    for k, v in cfg.items():
        assert f"{k}={v!r}" in config_text
    assert read_log(out)[0]["config"] == cfg


def test_progress_line_per_log_step_jsonl_line_per_step_and_loss_png_at_eval(data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    train.main(tiny_args(data_dir, out, "max_iters=5", "eval_interval=2", "log_interval=2"))
    printed = capsys.readouterr().out
    progress = re.findall(r"^iter (\d+): loss (\d+\.\d{4}), lr (\S+), ([\d,]+) tok/s, mfu n/a, eta (\d+:\d\d:\d\d)$",
                          printed, re.M)
    assert [int(p[0]) for p in progress] == [0, 2, 4]  # every log_interval-th step
    rows = read_log(out)
    assert rows[0]["start_iter"] == 0 and "config" in rows[0] and "run_info" in rows[0]
    steps = [r for r in rows if "loss" in r]
    assert [r["iter"] for r in steps] == [0, 1, 2, 3, 4]  # one line per step
    for r in steps:
        assert {"iter", "loss", "lr", "tokens_per_s", "mfu", "eta_s", "elapsed"} <= set(r)
        assert math.isfinite(r["loss"]) and r["tokens_per_s"] > 0 and r["mfu"] is None and r["eta_s"] >= 0
    assert [r["lr"] for r in steps] == pytest.approx([1e-2 / 3, 2e-2 / 3, 1e-2, 1e-2, 1e-2])  # warmup, constant
    for it, loss, lr, _, _ in progress:
        assert loss == f"{steps[int(it)]['loss']:.4f}" and lr == f"{steps[int(it)]['lr']:.2e}"
    evals = [r for r in rows if "val_loss" in r]
    assert [r["iter"] for r in evals] == [0, 2, 4, 5]  # every eval_interval and at the end
    assert all(math.isfinite(r["train_loss"]) and math.isfinite(r["val_loss"]) for r in evals)
    assert re.search(r"^iter 4: train loss \d+\.\d{4}, val loss \d+\.\d{4}", printed, re.M)
    with open(out / "loss.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert {"ckpt.pt", "best.pt", "log.jsonl", "loss.png"} <= set(os.listdir(out))


# ----------------------------------------------------------------------------------------------------------------
# Resume


def test_resume_after_k_iterations_gives_the_losses_and_weights_of_an_uninterrupted_run(data_dir, tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    common = ["eval_interval=3", "dropout=0.1"]  # dropout: the torch RNG state must be restored too
    train.main(tiny_args(data_dir, whole, *common, "max_iters=7"))
    # resume=True: a relaunch of the same command; the first launch finds no checkpoint and starts from scratch
    train.main(tiny_args(data_dir, parts, *common, "max_iters=3", "resume=True"))
    assert torch.load(parts / "ckpt.pt", weights_only=True)["iter_num"] == 3
    train.main(tiny_args(data_dir, parts, *common, "max_iters=7", "resume=True"))
    want = step_losses(whole)
    assert list(want) == list(range(7)) and len(set(want.values())) == 7
    assert step_losses(parts) == want  # exact float equality, step by step
    assert list(step_losses(parts, since_last_start=True)) == [3, 4, 5, 6]  # the resumed run did only the rest
    a, b = (torch.load(d / "ckpt.pt", map_location="cpu", weights_only=True) for d in (whole, parts))
    assert a["iter_num"] == b["iter_num"] == 7
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(v, b["model"][k]) for k, v in a["model"].items())
    evals = {r["iter"]: r["val_loss"] for r in read_log(parts) if "val_loss" in r}
    assert evals == {r["iter"]: r["val_loss"] for r in read_log(whole) if "val_loss" in r}


def test_a_killed_run_resumed_in_a_new_process_continues_with_the_uninterrupted_losses(data_dir, tmp_path):
    out, ref = tmp_path / "killed", tmp_path / "ref"
    def args(out_dir, max_iters):
        return tiny_args(data_dir, out_dir, "eval_interval=4", "eval_iters=1", "log_interval=1000",
                         f"max_iters={max_iters}")
    p = run_script(*args(out, 100000))  # would run for a long time
    deadline, evals = time.time() + 120, []
    while time.time() < deadline and p.poll() is None:
        if os.path.exists(out / "log.jsonl"):
            with open(out / "log.jsonl") as f:  # an eval line is written after its checkpoint
                evals = [r["iter"] for r in map(json.loads, f.read().splitlines()[:-1]) if "val_loss" in r]
            if evals and evals[-1] >= 4:
                break
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    _, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL and evals and evals[-1] >= 4, err  # killed mid-way, past a checkpoint
    k = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)["iter_num"]
    assert k >= 4 and k % 4 == 0
    n = k + 5
    before_kill = step_losses(out)
    r = subprocess.run([sys.executable, TRAIN, "init_from=resume", f"out_dir={out}", f"max_iters={n}"], cwd=REPO,
                       env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    train.main(args(ref, n))  # the same run, never stopped
    want = step_losses(ref)
    resumed = step_losses(out, since_last_start=True)
    assert list(resumed) == list(range(k, n))
    assert resumed == {i: want[i] for i in range(k, n)}  # exactly
    assert all(want[i] == loss for i, loss in before_kill.items() if i < n)
    a, b = (torch.load(d / "ckpt.pt", map_location="cpu", weights_only=True)["model"] for d in (out, ref))
    assert all(torch.equal(v, b[key]) for key, v in a.items())


def test_resume_refuses_to_change_the_architecture_or_the_options_of_a_kept_scorer(data_dir, tmp_path):
    out = tmp_path / "out"
    train.main(tiny_args(data_dir, out, "max_iters=1", "eval_interval=1", "scorer=ssmax"))
    assert "n_layer=2 differs from the checkpoint's 1" in error_of(tiny_args(data_dir, out, "init_from=resume",
                                                                              "n_layer=2"))
    # its s exists already: a new init would not apply (a scorer switch may set it: tests below)
    msg = error_of(tiny_args(data_dir, out, "init_from=resume", "scorer=ssmax", "ssmax_s_init=0.5"))
    assert "ssmax_s_init=0.5 differs from the checkpoint's 1.0: it cannot change when resuming with the same " \
           "scorer" in msg
    msg = error_of(tiny_args(data_dir, out, "init_from=resume", "scorer=softmax", "n_embd=64"))
    assert "n_embd=64 differs from the checkpoint's 32: it cannot change when resuming" in msg  # a switch too


# ----------------------------------------------------------------------------------------------------------------
# Divergence


def test_nan_loss_stops_with_one_line_and_keeps_the_last_good_checkpoint(data_dir, tmp_path):
    out = tmp_path / "out"
    msg = error_of(tiny_args(data_dir, out, "learning_rate=1e6", "grad_clip=0", "warmup_iters=0", "max_iters=100",
                             "eval_interval=2", "eval_iters=1"))
    m = re.match(r"error: (eval )?loss (is nan|is inf|.*) at iter (\d+).*the run diverged and stops; the last good "
                 r"checkpoint (\S+) is kept$", msg)
    assert m and m.group(4) == str(out / "ckpt.pt"), msg
    failed_at = int(m.group(3))
    ckpt = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)
    assert 0 < ckpt["iter_num"] <= failed_at < 100 and failed_at - ckpt["iter_num"] <= 2
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())
    model, _ = load_checkpoint(str(out / "ckpt.pt"))  # it still loads, and computes a finite loss
    x = torch.from_numpy(np.fromfile(os.path.join(data_dir, "rand", "val.bin"), dtype=np.uint16)[:17].astype(np.int64))
    _, loss = model(x[None, :-1], x[None, 1:])
    assert math.isfinite(loss.item())
    logged = [r for r in read_log(out) if "loss" in r or "val_loss" in r]
    assert all(math.isfinite(v) for r in logged for k, v in r.items() if "loss" in k)  # no NaN was logged
    assert max(r["iter"] for r in logged) < failed_at or "eval" in msg


# ----------------------------------------------------------------------------------------------------------------
# softmax -> SSMax switch


def test_init_from_softmax_checkpoint_with_scorer_ssmax_sets_s0_and_keeps_every_other_weight(data_dir, tmp_path):
    src, dst = tmp_path / "softmax", tmp_path / "ssmax"
    train.main(tiny_args(data_dir, src, "max_iters=2", "eval_interval=2"))
    train.main(tiny_args(data_dir, dst, f"init_from={src / 'ckpt.pt'}", "scorer=ssmax", "max_iters=0"))
    a = torch.load(src / "ckpt.pt", map_location="cpu", weights_only=True)
    b = torch.load(dst / "ckpt.pt", map_location="cpu", weights_only=True)
    s0 = ssmax_s_for_switch(16)
    assert s0 == pytest.approx(1 / np.mean(np.log(np.arange(1, 17))), rel=1e-12)
    assert a["model_args"]["scorer"] == "softmax" and b["iter_num"] == 0
    assert b["model_args"] == {**a["model_args"], "scorer": "ssmax", "ssmax_s_init": s0}
    assert b["config"]["scorer"] == "ssmax" and b["config"]["ssmax_s_init"] == s0
    added = set(b["model"]) - set(a["model"])
    assert added == {"transformer.h.0.attn.ssmax_s"} and set(a["model"]) <= set(b["model"])
    assert torch.equal(b["model"]["transformer.h.0.attn.ssmax_s"], torch.full((2,), s0))
    assert all(torch.equal(v, b["model"][k]) for k, v in a["model"].items())
    assert [r["iter"] for r in read_log(dst) if "val_loss" in r] == [0]  # converted, evaluated, saved
    assert not step_losses(dst)
    # an explicit s0 wins, and the switched model trains on
    train.main(tiny_args(data_dir, tmp_path / "s05", f"init_from={src / 'ckpt.pt'}", "scorer=ssmax",
                         "ssmax_s_init=0.5", "max_iters=1", "eval_interval=1"))
    c = torch.load(tmp_path / "s05" / "ckpt.pt", map_location="cpu", weights_only=True)
    assert c["model_args"]["ssmax_s_init"] == 0.5 and c["iter_num"] == 1


def test_init_from_a_checkpoint_trains_at_its_block_size_unless_the_command_sets_one(data_dir, tmp_path, capsys):
    src = tmp_path / "src"
    train.main(tiny_args(data_dir, src, "max_iters=1", "eval_interval=1"))
    no_length = [a for a in tiny_args(data_dir, tmp_path / "a", "max_iters=1", "eval_interval=1")
                 if not a.startswith("block_size=")]
    capsys.readouterr()
    train.main([*no_length, f"init_from={src / 'ckpt.pt'}"])  # TrainConfig's default would be 1,024
    assert " 32 tokens per iteration" in capsys.readouterr().out  # batch 2 x 16 tokens, not 2 x 1,024
    a = torch.load(tmp_path / "a" / "ckpt.pt", map_location="cpu", weights_only=True)
    assert a["config"]["block_size"] == a["model_args"]["block_size"] == 16


# ----------------------------------------------------------------------------------------------------------------
# The switch during pretraining (SSMax paper variant f): a resume that changes the scorer


def param_states(ckpt):
    """{parameter name: AdamW state (or None: never stepped)} of a checkpoint, by the model's own parameter order."""
    from model import GPT, GPTConfig
    m = GPT(GPTConfig(**ckpt["model_args"]))
    name = {id(p): n for n, p in m.named_parameters()}
    order = [name[id(p)] for g in m.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu").param_groups
             for p in g["params"]]
    return {n: ckpt["optimizer"]["state"].get(i) for i, n in enumerate(order)}


def branch(src, dst):
    """A copy of src's checkpoint, as a run to resume in dst (the run at the switch)."""
    os.makedirs(dst)
    with open(src / "ckpt.pt", "rb") as a, open(dst / "ckpt.pt", "wb") as b:
        b.write(a.read())


def test_a_scorer_switching_resume_trains_on_the_batches_an_unswitched_resume_draws(data_dir, tmp_path, monkeypatch):
    src, plain, switched = tmp_path / "softmax", tmp_path / "plain", tmp_path / "switched"
    seen = {}
    def recording(out):  # the token ids of every training micro-batch (evals run without grad)
        seen[out] = []
        def get_batch(cfg, data, split, ix, device):
            x, y = real(cfg, data, split, ix, device)
            if torch.is_grad_enabled():
                seen[out].append(x.clone())
            return x, y
        monkeypatch.setattr(train, "get_batch", get_batch)
    real = train.get_batch
    recording(src)
    train.main(tiny_args(data_dir, src, "max_iters=2", "eval_interval=2"))
    branch(src, plain)
    branch(src, switched)
    recording(plain)
    train.main(tiny_args(data_dir, plain, "init_from=resume", "max_iters=5"))
    recording(switched)
    train.main(tiny_args(data_dir, switched, "init_from=resume", "max_iters=5", "scorer=ssmax", "overwrite=True"))
    assert len(seen[src]) == 2 and len(seen[plain]) == len(seen[switched]) == 3
    assert all(torch.equal(a, b) for a, b in zip(seen[plain], seen[switched]))  # the same token ids, batch by batch
    assert not any(torch.equal(a, b) for a in seen[src] for b in seen[switched])  # not the first batches again
    log = read_log(switched)
    assert log[0]["start_iter"] == 2 and log[0]["switch"] == {"scorer": ["softmax", "ssmax"],
                                                                "ssmax_s_init": [1.0, ssmax_s_for_switch(16)]}
    assert [r["iter"] for r in log if "val_loss" in r] == [2, 4, 5]  # the switched model is evaluated first
    assert list(step_losses(switched)) == [2, 3, 4]
    assert "switch" not in read_log(plain)[0]
    train.main(tiny_args(data_dir, switched, "init_from=resume", "max_iters=6", "scorer=ssmax"))  # a relaunch
    assert "switch" not in read_log(switched)[-3] and list(step_losses(switched, since_last_start=True)) == [5]


@pytest.mark.parametrize("extra,s", [((), ssmax_s_for_switch(16)), (("ssmax_s_init=0.3", "ssmax_bias=True"), 0.3)],
                         ids=["s0", "given"])
def test_a_scorer_switching_resume_keeps_adamw_state_of_shared_weights_and_starts_s_fresh(data_dir, tmp_path,
                                                                                         extra, s):
    src, dst = tmp_path / "softmax", tmp_path / "ssmax"
    train.main(tiny_args(data_dir, src, "max_iters=3", "eval_interval=3"))
    branch(src, dst)
    train.main(tiny_args(data_dir, dst, "init_from=resume", "max_iters=3", "scorer=ssmax", "overwrite=True", *extra))
    a, b = (torch.load(d / "ckpt.pt", map_location="cpu", weights_only=True) for d in (src, dst))
    assert b["iter_num"] == 3 and b["model_args"]["scorer"] == "ssmax" and b["model_args"]["ssmax_s_init"] == s
    assert torch.equal(b["model"]["transformer.h.0.attn.ssmax_s"], torch.full((2,), s))  # the requested init
    new = {"transformer.h.0.attn.ssmax_s"} | ({"transformer.h.0.attn.ssmax_b"} if extra else set())
    assert set(b["model"]) - set(a["model"]) == new
    old_state, new_state = param_states(a), param_states(b)
    assert set(new_state) - set(old_state) == new and all(new_state[k] is None for k in new)  # fresh
    for k, state in old_state.items():
        assert state is not None and state.keys() == new_state[k].keys() == {"step", "exp_avg", "exp_avg_sq"}
        assert all(torch.equal(v, new_state[k][key]) for key, v in state.items()), k  # step 3 and both moments
    groups = [{k: v for k, v in g.items() if k != "params"} for g in a["optimizer"]["param_groups"]]
    assert groups == [{k: v for k, v in g.items() if k != "params"} for g in b["optimizer"]["param_groups"]]
    train.main(tiny_args(data_dir, dst, "init_from=resume", "max_iters=4", "scorer=ssmax", *extra))  # it trains on
    c = torch.load(dst / "ckpt.pt", map_location="cpu", weights_only=True)
    assert param_states(c)["transformer.h.0.attn.ssmax_s"]["step"] == 1 and c["iter_num"] == 4


# ----------------------------------------------------------------------------------------------------------------
# SFT

SFT_ROWS = [{"prompt": "Question: What is the capital of France?\nAnswer:", "answer": " Paris"},
            {"prompt": "Question: Who wrote Hamlet?\nAnswer:", "answer": " William Shakespeare"},
            {"prompt": "Where is Denver?", "answer": " Colorado, in the United States"},
            {"prompt": "2 + 2 =", "answer": " 4"}]


def write_sft(path, rows=SFT_ROWS):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_sft_targets_are_answer_and_endoftext_with_minus_one_on_prompt_and_padding(tmp_path):
    enc, T = vocab.get_tokenizer(), 32
    examples = retrieval.load_sft(write_sft(tmp_path / "sft.jsonl"), T)
    assert len(examples) == len(SFT_ROWS)
    for (ids, n_prompt), row in zip(examples, SFT_ROWS):
        p, a = enc.encode_ordinary(row["prompt"]), enc.encode_ordinary(row["answer"])
        assert ids.tolist() == p + a + [vocab.EOT] and n_prompt == len(p)
    x, y = retrieval.sft_batch(examples, torch.tensor([1, 3, 0]), T)
    assert x.shape == y.shape == (3, T) and x.dtype == y.dtype == torch.long
    for b, i in enumerate([1, 3, 0]):
        ids, n_prompt = examples[i]
        n = len(ids) - 1
        assert x[b, :n].tolist() == ids[:-1].tolist()
        assert (x[b, n:] == 0).all()  # padding: an id every vocabulary has (its targets are -1)
        answer = enc.encode_ordinary(SFT_ROWS[i]["answer"]) + [vocab.EOT]
        assert y[b].tolist() == [-1] * (n_prompt - 1) + answer + [-1] * (T - n)


def test_sft_crops_long_prompts_on_the_left_and_long_answers_on_the_right(tmp_path):
    enc, T = vocab.get_tokenizer(), 8
    rows = [{"prompt": "one two three four five six seven eight nine ten", "answer": " eleven twelve"},
            {"prompt": "short", "answer": " a b c d e f g h i j k l m n o p"}]
    examples = retrieval.load_sft(write_sft(tmp_path / "sft.jsonl", rows), T)
    (ids0, n0), (ids1, n1) = examples
    p0, a0 = enc.encode_ordinary(rows[0]["prompt"]), enc.encode_ordinary(rows[0]["answer"]) + [vocab.EOT]
    assert len(ids0) == T + 1 and ids0.tolist() == p0[-(T + 1 - len(a0)):] + a0 and n0 == T + 1 - len(a0)
    a1 = enc.encode_ordinary(rows[1]["answer"])
    assert ids1.tolist() == a1[:T + 1] and n1 == 0  # the answer's beginning, no prompt left
    x, y = retrieval.sft_batch(examples, torch.tensor([0, 1]), T)
    assert y[0].tolist() == [-1] * (n0 - 1) + a0 and y[1].tolist() == a1[1:T + 1]


@pytest.mark.parametrize("content,words", [
    (None, "does not exist"),
    ("a directory", "is a directory, expected a .jsonl file"),
    ("", "every line must be"),
    ('{"prompt": "a", "answer": "b"}\nnot json\n', "every line must be"),
    ('{"prompt": "a"}\n', "every line must be"),
    ('{"prompt": "a", "answer": 3}\n', "every line must be"),
    ('["a", "b"]\n', "every line must be"),
])
def test_bad_sft_file_is_one_error_line(content, words, tmp_path):
    path = tmp_path / "sft.jsonl"
    if content == "a directory":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    msg = error_of(["device=cpu", f"sft_data={path}", f"out_dir={tmp_path / 'out'}", "n_layer=1", "n_head=2",
                    "n_embd=32", "ffn_hidden=64", "block_size=16", "max_iters=1"])
    assert words in msg and str(path) in msg


def test_sft_run_in_epochs_lowers_the_answer_loss(tmp_path, capsys):
    out = tmp_path / "out"
    path = write_sft(tmp_path / "sft.jsonl")
    train.main(["device=cpu", f"sft_data={path}", f"out_dir={out}", "n_layer=1", "n_head=2", "n_embd=32",
                "ffn_hidden=64", "block_size=32", "batch_size=2", "gradient_accumulation_steps=1", "sft_epochs=5",
                "learning_rate=1e-2", "weight_decay=0", "eval_interval=100", "eval_iters=2"])
    assert "iterations per epoch" in capsys.readouterr().out
    ckpt = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)
    cfg = ckpt["config"]  # 4 examples / (1 x 2 per iteration) = 2 iterations per epoch
    assert cfg["max_iters"] == cfg["lr_decay_iters"] == 10 and cfg["warmup_iters"] == 2 and ckpt["iter_num"] == 10
    evals = [r for r in read_log(out) if "val_loss" in r]
    assert [r["iter"] for r in evals] == [0, 10]
    assert evals[-1]["val_loss"] < 0.7 * evals[0]["val_loss"]  # the answers are being learned
    # the loss sums the answer tokens' losses per sequence (>= 2 tokens each), not their mean: at init > log(vocab)
    assert evals[0]["val_loss"] > 1.5 * math.log(vocab.VOCAB_SIZE)


# ----------------------------------------------------------------------------------------------------------------
# DDP, and the embedded dataset prepared on demand


def test_torchrun_two_cpu_processes_equal_one_process_and_only_rank0_writes(data_dir, tmp_path):
    ddp_out, one_out = tmp_path / "ddp", tmp_path / "one"
    # gradient_accumulation_steps is global: 2 micro-steps on each of 2 processes = 4 on one
    common = ["gradient_accumulation_steps=4", "max_iters=4", "eval_interval=2"]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", TRAIN,
                        *tiny_args(data_dir, ddp_out, *common)], cwd=cwd, env=ENV,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("config: ") == 1 and "2 process(es)" in r.stdout
    train.main(tiny_args(data_dir, one_out, *common))
    ddp, one = step_losses(ddp_out), step_losses(one_out)
    assert list(ddp) == list(one) == [0, 1, 2, 3]
    np.testing.assert_allclose(list(ddp.values()), list(one.values()), rtol=1e-5, atol=0)
    assert len(set(ddp.values())) == 4  # it trained
    # only rank 0 wrote: the usual files, each log line once, nothing in the working directory
    assert sorted(os.listdir(ddp_out)) == ["best.pt", "ckpt.pt", "log.jsonl", "loss.png"]
    rows = read_log(ddp_out)
    assert sum("config" in r for r in rows) == 1 and len(rows) == 1 + 4 + 3  # config, 4 steps, evals at 0, 2, 4
    assert os.listdir(cwd) == []
    a, b = (torch.load(d / "ckpt.pt", map_location="cpu", weights_only=True) for d in (ddp_out, one_out))
    assert a["iter_num"] == 4 and a["config"]["gradient_accumulation_steps"] == 4
    for k, v in a["model"].items():
        torch.testing.assert_close(v, b["model"][k], rtol=1e-4, atol=1e-6)


def test_missing_embedded_dataset_is_prepared_automatically(tmp_path, capsys):
    out = tmp_path / "out"
    train.main(["device=cpu", f"data_dir={tmp_path / 'data'}", f"out_dir={out}", "n_layer=1", "n_head=2",
                "n_embd=32", "ffn_hidden=64", "block_size=16", "batch_size=2", "gradient_accumulation_steps=1",
                "max_iters=1", "eval_interval=1", "eval_iters=1"])  # dataset: the default, shakespeare
    printed = capsys.readouterr().out
    d = tmp_path / "data" / "shakespeare"
    with open(d / "meta.json") as f:
        meta = json.load(f)
    assert meta["source"] == "shakespeare" and meta["tokens"]["train"] > 1_000_000
    assert os.path.getsize(d / "train.bin") == 2 * meta["tokens"]["train"]
    assert "unigram entropy of train" in printed and "\nsample:\n" in printed  # GPT-2 vocabulary: a sample
    ckpt = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)
    assert ckpt["config"]["dataset"] == "shakespeare" and ckpt["iter_num"] == 1


# ----------------------------------------------------------------------------------------------------------------
# No lost work: an existing run is never overwritten unasked; an eval cut by a kill is finished by the resume


def test_a_new_run_refuses_an_out_dir_holding_a_run_unless_resume_or_overwrite(data_dir, tmp_path):
    out = tmp_path / "out"
    train.main(tiny_args(data_dir, out, "max_iters=2", "eval_interval=2"))
    before = {f: (out / f).read_bytes() for f in ("ckpt.pt", "best.pt", "log.jsonl")}
    msg = error_of(tiny_args(data_dir, out, "max_iters=3", "eval_interval=3"))
    assert "already holds a run" in msg and "resume=True" in msg and "overwrite=True" in msg and "out_dir" in msg
    assert {f: (out / f).read_bytes() for f in before} == before  # nothing was touched
    train.main(tiny_args(data_dir, out, "max_iters=3", "eval_interval=3", "overwrite=True"))
    log = read_log(out)
    assert log[0]["start_iter"] == 0 and sum("config" in r for r in log) == 1  # a new log, not appended
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 3
    (tmp_path / "file").write_text("x")
    assert "is a file" in error_of(tiny_args(data_dir, tmp_path / "file", "max_iters=1"))


class _Killed(BaseException):
    """A SIGKILL in the middle of a checkpoint write, simulated in-process."""


def _kill_during_eval(monkeypatch, at_iter, file):
    """best.pt: killed while writing it; ckpt.pt: killed just after writing it, before best.pt and the log line."""
    real = train.save_checkpoint
    def save(state, path):
        if path.endswith(file) and state["iter_num"] == at_iter:
            if file == "best.pt":
                open(f"{path}.tmp", "wb").write(b"half a zip")  # what a kill mid-write leaves behind
            else:
                real(state, path)
            raise _Killed
        real(state, path)
    monkeypatch.setattr(train, "save_checkpoint", save)


@pytest.mark.parametrize("kill_at,file", [(0, "best.pt"), (4, "ckpt.pt")], ids=["writing-best", "final-eval"])
def test_a_kill_during_an_eval_is_finished_by_the_resume(data_dir, tmp_path, monkeypatch, capsys, kill_at, file):
    out, ref = tmp_path / "out", tmp_path / "ref"
    args = ["max_iters=4", "eval_interval=2", "resume=True"]
    train.main(tiny_args(data_dir, ref, *args))
    with monkeypatch.context() as m:
        _kill_during_eval(m, kill_at, file)
        with pytest.raises(_Killed):
            train.main(tiny_args(data_dir, out, *args))
    assert kill_at not in [r["iter"] for r in read_log(out) if "val_loss" in r]
    assert (out / "best.pt.tmp").exists() == (file == "best.pt")
    capsys.readouterr()
    train.main(tiny_args(data_dir, out, *args))
    printed = capsys.readouterr().out
    evals = {r["iter"]: r["val_loss"] for r in read_log(out) if "val_loss" in r}
    assert evals == {r["iter"]: r["val_loss"] for r in read_log(ref) if "val_loss" in r}  # the record is back
    assert "done: val loss" in printed and not list(out.glob("*.tmp"))
    best, want = (torch.load(d / "best.pt", weights_only=True) for d in (out, ref))
    assert best["iter_num"] == want["iter_num"] and "optimizer" not in best
    assert all(torch.equal(v, want["model"][k]) for k, v in best["model"].items())
    capsys.readouterr()
    log = read_log(out)
    train.main(tiny_args(data_dir, out, *args))  # relaunching a finished run says so and changes nothing
    assert "already done" in capsys.readouterr().out and read_log(out) == log


def test_best_pt_holds_what_evaluation_needs_and_is_smaller_than_ckpt_pt(data_dir, tmp_path):
    out = tmp_path / "out"
    train.main(tiny_args(data_dir, out, "max_iters=0"))  # one eval: the best
    best, ckpt = (torch.load(out / f, weights_only=True) for f in ("best.pt", "ckpt.pt"))
    assert set(best) == set(train.BEST_KEYS) and {"optimizer", "rng", "data_state"} <= set(ckpt)
    assert os.path.getsize(out / "best.pt") < os.path.getsize(out / "ckpt.pt")
    a, _ = load_checkpoint(str(out / "best.pt"))
    b, _ = load_checkpoint(str(out / "ckpt.pt"))
    x = torch.randint(0, VOCAB, (2, 16))
    assert torch.equal(a(x, x)[1], b(x, x)[1])  # both evaluate identically


def test_a_full_disk_while_checkpointing_is_one_error_line_and_leaves_no_partial_file(data_dir, tmp_path,
                                                                                     monkeypatch):
    def full(obj, f):
        open(f, "wb").write(b"partial")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(torch, "save", full)
    msg = error_of(tiny_args(data_dir, tmp_path / "out", "max_iters=1"))
    assert "No space left on device" in msg and "no checkpoint was written yet" in msg
    assert not list((tmp_path / "out").glob("*.tmp"))


@pytest.mark.parametrize("arg,words", [
    ("batch_size=0", "batch_size=0 is out of range: batch_size must be > 0"),
    ("eval_interval=0", "eval_interval must be > 0"), ("log_interval=0", "log_interval must be > 0"),
    ("n_head=0", "n_head must be > 0"), ("n_layer=0", "n_layer must be > 0"),
    ("gradient_accumulation_steps=0", "gradient_accumulation_steps must be > 0"),
    ("block_size=-4", "block_size must be > 0"), ("block_size=0", "block_size must be > 0"),
    ("eval_iters=0", "eval_iters must be > 0"), ("rope_theta=0", "rope_theta must be > 0"),
    ("max_iters=-1", "max_iters must be >= 0"), ("learning_rate=-1e-3", "learning_rate must be >= 0"),
    ("dropout=1", "dropout must be in [0, 1)"), ("dropout=-0.1", "dropout must be in [0, 1)"),
    ("device=cuda", "sees no CUDA GPU"), ("device=gpu", "is not a torch device"),
])
def test_zero_negative_and_impossible_values_are_one_error_line(data_dir, tmp_path, arg, words):
    if arg == "device=cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert words in error_of(tiny_args(data_dir, tmp_path / "out", arg))
    assert not (tmp_path / "out").exists()


def test_help_prints_the_usage_and_every_config_field(capsys):
    train.main(["--help"])
    printed = capsys.readouterr().out
    assert "usage: python train.py" in printed
    assert all(f"{name}=" in printed for name in train.TrainConfig.__dataclass_fields__)


def test_a_truncated_or_missing_split_is_one_error_line_or_an_embedded_corpus_is_prepared_again(data_dir, tmp_path,
                                                                                                capsys):
    d = tmp_path / "data" / "mine"
    os.makedirs(d)
    for split in ("train", "val"):
        (d / f"{split}.bin").write_bytes(open(os.path.join(data_dir, "rand", f"{split}.bin"), "rb").read())
    (d / "meta.json").write_text(json.dumps({"tokens": {"train": 4096, "val": 1024}}))
    with open(d / "train.bin", "r+b") as f:
        f.truncate(1000)  # a preparation killed mid-write
    args = [*TINY, f"data_dir={tmp_path / 'data'}", "dataset=mine", f"out_dir={tmp_path / 'out'}", "max_iters=1"]
    assert "train.bin is truncated: 500 tokens on disk vs 4,096 in meta.json" in error_of(args)
    os.remove(d / "train.bin")
    assert "train.bin is missing" in error_of(args) and not (tmp_path / "out").exists()
    e = tmp_path / "emb" / "kjv"
    os.makedirs(e)
    (e / "val.bin").write_bytes(b"\0\0" * 10)  # an embedded corpus whose train.bin is missing: prepared again
    train.main([*TINY, f"data_dir={tmp_path / 'emb'}", "dataset=kjv", f"out_dir={tmp_path / 'out2'}", "max_iters=0",
                "vocab_size=50257"])
    assert os.path.getsize(e / "train.bin") == 2 * json.load(open(e / "meta.json"))["tokens"]["train"]


def test_init_from_or_resume_of_a_checkpoint_carrying_code_is_refused_and_the_code_never_runs(data_dir, tmp_path):
    src = tmp_path / "src"
    train.main(tiny_args(data_dir, src, "max_iters=0"))
    evil = code_carrying_copy(src / "ckpt.pt", tmp_path / "evil.pt", tmp_path / "pwned")
    msg = error_of(tiny_args(data_dir, tmp_path / "out", f"init_from={evil}"))
    assert "cannot be loaded safely" in msg and "evil.pt" in msg
    code_carrying_copy(src / "ckpt.pt", src / "ckpt.pt", tmp_path / "pwned")
    assert "cannot be loaded safely" in error_of(tiny_args(data_dir, src, "resume=True"))
    assert not (tmp_path / "pwned").exists()


def test_sigmoid_attention_trains_through_train_py(data_dir, tmp_path):
    # the sixth scorer: rows not normalised, the CPU path (kernels_cpu) under backend=auto; loss falls, no s/b/n
    out = tmp_path / "out"
    train.main(tiny_args(data_dir, out, "max_iters=6", "eval_interval=6", "scorer=sigmoid"))
    ckpt = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)
    losses = step_losses(out)
    assert ckpt["model_args"]["scorer"] == "sigmoid" and ckpt["iter_num"] == 6
    assert all(math.isfinite(v) for v in losses.values()) and losses[5] < losses[0]
    assert not any(k.endswith(("_s", "_b", "_raw")) for k in ckpt["model"])


def test_run_info_flags_a_tree_with_uncommitted_code_but_not_untracked_files_or_results(tmp_path):
    git = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=tmp_path,
                                    check=True, capture_output=True)
    (tmp_path / "results").mkdir()
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "results" / "summary.json").write_text("{}\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "c")
    clean = run_info(0, repo=tmp_path)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert clean["git_sha"] == sha and clean["git_dirty"] is False and clean["git_diff_sha256"] is None
    (tmp_path / "out").mkdir()  # an untracked out_dir, and results a run rewrote: the code is still the commit's
    (tmp_path / "out" / "ckpt.pt").write_text("w")
    (tmp_path / "results" / "summary.json").write_text('{"loss": 1}\n')
    assert run_info(0, repo=tmp_path)["git_dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")  # uncommitted code: flagged, with a hash naming the diff
    one = run_info(0, repo=tmp_path)
    (tmp_path / "code.py").write_text("x = 3\n")
    two = run_info(0, repo=tmp_path)
    assert one["git_dirty"] is two["git_dirty"] is True and len(one["git_diff_sha256"]) == 16
    assert one["git_diff_sha256"] != two["git_diff_sha256"]
    inside = run_info(0, repo=tmp_path / "out")  # a folder inside the tree reports the whole tree
    assert inside["git_sha"] == sha and inside["git_diff_sha256"] == two["git_diff_sha256"]
    not_a_repo = tmp_path.parent / f"{tmp_path.name}-plain"
    not_a_repo.mkdir()
    assert run_info(0, repo=not_a_repo)["git_sha"] is None and run_info(0, repo=not_a_repo)["git_dirty"] is None
