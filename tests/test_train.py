"""train.py's command line: config files and key=value overrides coerced to the field types, one-line errors (unknown
key, wrong type, inapplicable scorer option, missing dataset, zero, negative and impossible values), --help; and the
helpers and fixtures the other test_train_*.py files share (tiny_args, read_log, step_losses, error_of, run_script,
data_dir). Tiny models on tiny random data, CPU only."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import random_ids_data
import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(REPO, "train.py")
VOCAB = 512  # the random datasets' ids are < VOCAB: a small head keeps every step fast
TINY = ["device=cpu", f"vocab_size={VOCAB}", "n_layer=1", "n_head=2", "n_embd=32", "ffn_hidden=64", "block_size=16",
        "batch_size=2", "gradient_accumulation_steps=1", "eval_iters=2", "log_interval=1", "warmup_iters=2",
        "learning_rate=1e-2"]
# a child process must not believe it is a torchrun worker; one thread, like the tests in this process
ENV = {**{k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                            "MASTER_PORT")}, "OMP_NUM_THREADS": "1"}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: tiny models, one thread


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return random_ids_data(tmp_path_factory, VOCAB)


def tiny_args(data_dir, out_dir, *extra):
    return [*TINY, f"data_dir={data_dir}", "dataset=rand", f"out_dir={out_dir}", *extra]


def read_log(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def step_losses(out_dir, since_last_start=False):
    """{iter: training loss} from log.jsonl; a later line of an iter wins (logs from before 2026-11-29 list the steps
    a resumed run ran again twice)."""
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
    assert train.parse_args([str(a), "scorer='softmax'", str(b), "batch_size=8"]) == {
        "learning_rate": 1e-3, "max_iters": 20, "scorer": "softmax", "reweight_p": None, "batch_size": 8}
    with pytest.raises(train.TrainError, match="b.py comes after max_iters=, which it sets too"):
        train.parse_args([str(a), "max_iters=5", str(b)])  # b's 20 silently replaced the typed 5
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
    # an audit's: nan/inf read as text ("wrong type: is float"), or taken where no range applies (trained to nan)
    ("learning_rate=nan", "learning_rate=nan is not a finite number"), ("norm_eps=-1", "norm_eps must be > 0"),
    ("rope_theta=inf", "rope_theta=inf is not a finite number"), ("norm_eps=1e400", "norm_eps=inf is not a finite"),
    ("scorer=ssmax ssmax_s_init=1e400", "ssmax_s_init=inf is not a finite"), ("dataset=", "dataset must be a folder"),
    ("rope_scaling=[1]", "rope_scaling is dict or None"), ("init_from=.", "is a directory, expected a checkpoint"),
    # was accepted: get_lr's cosine fell to min_lr one step after warmup (a constant schedule never reads it)
    ("lr_schedule='cosine' lr_decay_iters=1 max_iters=3", "lr_decay_iters=1 is below warmup_iters=2: cosine would"),
])
def test_zero_negative_and_impossible_values_are_one_error_line(data_dir, tmp_path, arg, words):
    if arg == "device=cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert words in error_of(tiny_args(data_dir, tmp_path / "out", *arg.split()))
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs the Triton kernels")
def test_triton_backend_without_a_gpu_is_one_error_line_not_a_traceback(data_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")  # conftest's test-only interpreter; a user's CPU has none
    assert "need a CUDA GPU" in error_of(tiny_args(data_dir, tmp_path / "out", "backend=triton"))
    assert not (tmp_path / "out").exists()


def test_a_config_file_nan_is_one_error_line_not_a_diverged_run(tmp_path):
    cfg = tmp_path / "nan.py"
    cfg.write_text('scorer = "ssa"\nssa_n = float("inf")\n')  # no range of its own: it trained, and diverged
    assert "ssa_n=inf is not a finite number" in error_of([str(cfg)])


def test_help_prints_the_usage_and_every_config_field(capsys):
    train.main(["--help"])
    printed = capsys.readouterr().out
    assert "usage: python train.py" in printed
    assert all(f"{name}=" in printed for name in train.TrainConfig.__dataclass_fields__)
