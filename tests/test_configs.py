"""configs/: every file parses and validates; the arithmetic in the comments matches the fields; the quick GPU configs
share one recipe under a token budget and the paper's recipe lives in configs/paper/; the CPU cost check stops a long
run before it starts and lets a tiny one through; a task config with a setting its task cannot run is one error line
naming it. CPU only."""
import dataclasses
import functools
import glob
import os
import re
import runpy

import pytest
import torch

import tasks
import train
from lib import config as config_lib
from lib import cost
from lib import dataset
from lib.config import MODEL_FIELDS, SCORER_OPTIONS
from lib.tracking import PEAK_BF16_FLOPS
from model import GPT, GPTConfig
from scorers import SCORERS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(REPO, "configs", "*.py")))
PAPER = sorted(glob.glob(os.path.join(REPO, "configs", "paper", "*.py")))
TASKS = sorted(glob.glob(os.path.join(REPO, "configs", "tasks", "*.py")))
CPU = ("cpu_quick.py", "cpu_char.py")  # small CPU runs, not the quick GPU recipe
QUICK = [p for p in CONFIGS if os.path.basename(p) not in (*CPU, "sft.py")]  # one per scorer setting
QUICK_TOKEN_BUDGET = 1_000_000_000  # about an hour of the 162M model on one H100 (configs/softmax.py's arithmetic)
SCORER_FIELDS = ["scorer", "reweight_p", *SCORER_OPTIONS]
# "16 batch x 1,024 tokens x 16 accum = 262,144 tokens/iter x 3,800 iters = 996,147,200 tokens" (accum, iters optional)
ARITHMETIC = re.compile(r"([\d,]+) batch x ([\d,]+) tokens(?: x ([\d,]+) accum)? = ([\d,]+) tokens/iter"
                        r"(?: x ([\d,]+) iters = ([\d,]+) tokens)?")


def config(path, *overrides):
    return train.TrainConfig(**train.parse_args([path, *overrides]))


def number(text):
    return int(text.replace(",", ""))


def name(path):
    return os.path.relpath(path, os.path.join(REPO, "configs"))


@functools.cache
def flops_per_token_162m(T):
    with torch.device("meta"):  # shapes only: no memory, no init
        return GPT(GPTConfig()).flops_per_token(T)


# ----------------------------------------------------------------------------------------------------------------
# Every file

@pytest.mark.parametrize("path", CONFIGS + PAPER + TASKS, ids=name)
def test_every_config_file_parses_and_validates(path):
    explicit = train.parse_args([path])
    assert explicit
    cfg = train.TrainConfig(**explicit)
    GPTConfig(**{k: getattr(cfg, k) for k in MODEL_FIELDS})  # a scorer option of another scorer raises
    if cfg.task:
        tasks.check_config(cfg)
    assert cfg.gradient_accumulation_steps % (8 if path in PAPER else 1) == 0  # torchrun divides it among 8 GPUs


@pytest.mark.parametrize("path", QUICK + PAPER + [os.path.join(REPO, "configs", f) for f in (*CPU, "sft.py")],
                         ids=name)
def test_comment_arithmetic_matches_the_fields(path):
    comment = "\n".join(line for line in open(path) if line.startswith("#"))
    if not ARITHMETIC.search(comment) and "base" in runpy.run_path(path):  # the recipe's arithmetic is its base's
        comment = "\n".join(line for line in open(os.path.join(os.path.dirname(path), runpy.run_path(path)["base"]))
                            if line.startswith("#"))
    m = ARITHMETIC.search(comment)
    assert m, f"{name(path)}: no 'B batch x T tokens [x A accum] = ... tokens/iter' line in its comment"
    cfg = config(path)
    batch, T, accum, per_iter, iters, total = (None if g is None else number(g) for g in m.groups())
    assert (batch, T, accum or 1) == (cfg.batch_size, cfg.block_size, cfg.gradient_accumulation_steps)
    assert per_iter == batch * T * (accum or 1)
    if path.endswith("sft.py"):  # iterations come from the data (sft_epochs)
        return
    assert (iters, total) == (cfg.max_iters, per_iter * cfg.max_iters)


# ----------------------------------------------------------------------------------------------------------------
# The quick single-GPU configs and the paper's recipe

def test_quick_gpu_configs_train_the_162m_model_on_fineweb_edu_in_one_recipe_under_the_token_budget():
    settings = [(config(p).init_from, *(getattr(config(p), k) for k in SCORER_FIELDS)) for p in QUICK]
    assert len(set(settings)) == len(QUICK)  # one config per scorer setting (a start, a scorer and its options)
    assert all(config(p).scorer in SCORERS for p in QUICK) and {"softmax.py", "ssmax_swap.py"} <= set(map(name, QUICK))
    base = config(os.path.join(REPO, "configs", "softmax.py"))
    assert (base.n_layer, base.n_head, base.n_embd, base.ffn_hidden, base.block_size) == (12, 12, 768, 2048, 1024)
    assert base.dataset == "fineweb_edu" and base.device == "auto" and base.init_from == "scratch"
    tokens = base.batch_size * base.block_size * base.gradient_accumulation_steps * base.max_iters
    assert tokens <= QUICK_TOKEN_BUDGET and tokens <= dataset.NAMED["fineweb_edu"][1]  # at most one pass
    assert base.max_iters // base.eval_interval >= 10  # a curve, not two points
    # pos: the zoo's papers use no RoPE
    leg = {"scorer", "out_dir", "init_from", "max_iters", "warmup_iters", "eval_interval", "compile", "pos",
           *SCORER_FIELDS}
    for path in QUICK:
        cfg = config(path)  # compiled wherever timed faster on a GPU (#33): all but fox's float mask
        assert cfg.compile == (cfg.scorer != "fox"), name(path)
        differs = {k for k in train.TrainConfig.__dataclass_fields__ if getattr(cfg, k) != getattr(base, k)}
        assert differs <= leg, f"{name(path)} changes the shared recipe: {sorted(differs - leg)}"
        assert cfg.out_dir != base.out_dir or path.endswith("softmax.py")
        own = {k for k in runpy.run_path(path) if not k.startswith("_")} - {"base"}  # override-only, as paper/ is
        assert path.endswith("softmax.py") or (runpy.run_path(path)["base"] == "softmax.py" and own <= leg), name(path)
    swap, switch = config(os.path.join(REPO, "configs", "ssmax_swap.py")), round(0.875 * base.max_iters)
    assert swap.max_iters == base.max_iters - switch and f"ckpt_{switch}.pt" in swap.init_from  # variant (f)


def test_a_config_applies_its_base_first_and_a_bad_base_is_one_error_line(tmp_path):
    (tmp_path / "a.py").write_text('n_layer = 3\nout_dir = "out-a"\n')
    (tmp_path / "b.py").write_text('base = "a.py"\nout_dir = "out-b"\n')
    assert train.parse_args([str(tmp_path / "b.py"), "n_head=1"]) == dict(n_layer=3, out_dir="out-b", n_head=1)
    for base in ('"missing.py"', '"b.py"', "3"):  # missing, leading back to itself, not a file name
        (tmp_path / "b.py").write_text(f"base = {base}\n")
        with pytest.raises(train.TrainError, match=r"base=.* must name another config file") as e:
            train.parse_args([str(tmp_path / "b.py")])
        assert "\n" not in str(e.value)


def test_the_hour_in_softmax_py_is_its_flops_at_the_stated_mfu():
    comment = "".join(line for line in open(os.path.join(REPO, "configs", "softmax.py")) if line.startswith("#"))
    cfg = config(os.path.join(REPO, "configs", "softmax.py"))
    tokens = cfg.batch_size * cfg.block_size * cfg.gradient_accumulation_steps * cfg.max_iters
    per_token = number(re.search(r"([\d,]+) FLOP/token", comment).group(1))
    assert per_token == flops_per_token_162m(cfg.block_size)
    mfu, peak = (float(x) for x in re.search(r"(\d+) % MFU of (\d+) TFLOP/s", comment).groups())
    assert peak * 1e12 == PEAK_BF16_FLOPS["H100"]
    rate = mfu / 100 * peak * 1e12 / per_token  # tokens/s
    assert abs(rate - number(re.search(r"~([\d,]+) tokens/s", comment).group(1))) < 1000
    assert abs(tokens / rate / 60 - int(re.search(r"= (\d+) min", comment).group(1))) < 1


def test_paper_configs_keep_the_papers_recipe_for_every_quick_scorer_setting():
    assert {name(p).removeprefix("paper/") for p in PAPER} <= {name(p) for p in QUICK}  # each with its quick twin
    for path in PAPER:
        cfg, quick = config(path), config(os.path.join(REPO, "configs", os.path.basename(path)))
        assert {k: getattr(cfg, k) for k in SCORER_FIELDS} == {k: getattr(quick, k) for k in SCORER_FIELDS}
        swap = path.endswith("ssmax_swap.py")
        assert (cfg.batch_size, cfg.block_size, cfg.gradient_accumulation_steps) == (16, 1024, 128)  # 2,097,152 tokens
        assert cfg.max_iters == (25_000 if swap else 200_000) and cfg.warmup_iters == 1000
        assert not swap or cfg.init_from.endswith("ckpt_175000.pt")  # (f): 87.5 %, not the finished softmax run
        assert (cfg.learning_rate, cfg.lr_schedule, cfg.weight_decay, cfg.beta1, cfg.beta2, cfg.grad_clip) == (
            6e-4, "constant", 0.1, 0.9, 0.95, 1.0)
        assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.ffn_hidden) == (12, 12, 768, 2048)
        assert cfg.out_dir.startswith("out-paper-")  # never the quick run's folder


def test_sft_config_keeps_the_papers_settings_and_starts_from_the_quick_ssmax_run():
    sft, ssmax = config(os.path.join(REPO, "configs", "sft.py")), config(os.path.join(REPO, "configs", "ssmax.py"))
    assert sft.init_from == f"{ssmax.out_dir}/ckpt.pt" and sft.out_dir != ssmax.out_dir
    assert (sft.sft_epochs, sft.learning_rate, sft.lr_schedule, sft.beta2, sft.weight_decay) == (
        10, 2e-5, "cosine", 0.999, 0.0)
    assert sft.batch_size * sft.gradient_accumulation_steps == 128


# ----------------------------------------------------------------------------------------------------------------
# The CPU cost check

def test_cpu_cost_check_stops_the_quick_gpu_run_on_a_cpu_with_its_cost_and_the_way_out(capsys):
    cfg = config(os.path.join(REPO, "configs", "ssmax.py"))
    with pytest.raises(train.TrainError) as e:
        cost.cpu_cost_check(cfg, "cpu", rate=1e11)  # 1e11 FLOP/s: a fast 2-core CPU
    msg = str(e.value)
    assert "\n" not in msg and "configs/cpu_quick.py" in msg and "allow_slow=True" in msg
    hours = 996_147_200 * flops_per_token_162m(1024) / 1e11 / 3600  # ~3,000 (the exact count vs the 6N formula: <0.1%)
    assert abs(float(re.search(r"~([\d,]+) hours", msg).group(1).replace(",", "")) / hours - 1) < 1e-3
    assert "996,147,200 tokens" in capsys.readouterr().out
    assert cost.cpu_cost_check(cfg, "cuda", rate=1e11) is None  # a GPU is never checked
    assert cost.cpu_cost_check(config(os.path.join(REPO, "configs", "ssmax.py"), "allow_slow=True"), "cpu",
                                rate=1e11) is None
    assert cost.cpu_cost_check(cfg, "cpu", start_iter=3799, rate=1e11) is None  # a resume: what is left counts


def test_cpu_cost_check_lets_tiny_runs_start_without_a_measurement(monkeypatch, capsys):
    def measured(*args):
        raise AssertionError("a tiny run must not be measured")
    monkeypatch.setattr(torch, "mm", measured)
    tiny = ["device=cpu", "vocab_size=512", "n_layer=1", "n_head=2", "n_embd=32", "ffn_hidden=64", "block_size=16",
            "batch_size=2", "gradient_accumulation_steps=1"]  # tests/test_train.py's, at the default 200,000 iters
    task_runs = [config(p) for p in TASKS]  # with the task's vocabulary, as train() checks them
    task_runs = [dataclasses.replace(c, vocab_size=tasks.TASKS[c.task].vocab(c)) for c in task_runs]
    for cfg in (config(os.path.join(REPO, "configs", "cpu_quick.py")), train.TrainConfig(**train.parse_args(tiny)),
                *task_runs):
        assert cost.cpu_cost_check(cfg, "cpu") is None
    assert capsys.readouterr().out == ""


def test_the_measured_cpu_rate_stops_a_long_run_of_a_small_model(capsys):
    small = ["vocab_size=512", "n_layer=1", "n_head=2", "n_embd=32", "ffn_hidden=64", "max_iters=100000000"]
    cfg = config(os.path.join(REPO, "configs", "cpu_quick.py"), *small)  # 1e11 tokens: weeks on any CPU
    with pytest.raises(train.TrainError, match="allow_slow=True"):
        cost.cpu_cost_check(cfg, "cpu")
    assert "measured fp32 matmul rate" in capsys.readouterr().out


def test_train_on_a_cpu_stops_before_it_fetches_data_or_writes_a_run(tmp_path, monkeypatch):
    monkeypatch.setattr(cost, "cpu_cost_check", functools.partial(cost.cpu_cost_check, rate=1e11))
    monkeypatch.setattr(dataset, "fetch", lambda *a: pytest.fail("fetched before the cost check"))
    with pytest.raises(SystemExit) as e:
        train.main([os.path.join(REPO, "configs", "ssmax.py"), "device=cpu", f"data_dir={tmp_path / 'data'}",
                    f"out_dir={tmp_path / 'out'}"])
    assert str(e.value.code).startswith("error: this run would take at least ~")
    assert "configs/cpu_quick.py" in str(e.value.code)
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------------------------------------------
# Task configs: a setting the task cannot run

def train_error(*argv):
    with pytest.raises(SystemExit) as e:
        train.main(list(argv))
    assert str(e.value.code).startswith("error: ") and "\n" not in str(e.value.code), e.value.code
    return str(e.value.code)


def test_too_few_task_keys_for_the_pairs_is_one_error_line_naming_task_keys(tmp_path):
    recall = os.path.join(REPO, "configs", "tasks", "recall.py")
    assert train_error(recall, "task_keys=0", f"out_dir={tmp_path / 'x'}") == (
        "error: task_keys=0 must be more than task_pairs=4: the queried keys are distinct, and recall's filler pairs "
        "use the others")  # it once said: task_pairs=4 must be in 1..task_keys - 1 = -1
    assert not (tmp_path / "x").exists()


def test_a_linear_run_too_short_for_its_first_answer_is_too_short_not_diverged(tmp_path):
    linear = os.path.join(REPO, "configs", "tasks", "linear.py")
    msg = train_error(linear, "block_size=4", f"out_dir={tmp_path / 'x'}")  # it once trained on a NaN loss
    assert msg == "error: block_size=4 is too short for task 'linear': at least 5" and not (tmp_path / "x").exists()
    c = config(linear)
    for L, answers in ((4, 0), (5, 1)):  # the first answer, the 3rd point's y, is predicted at position 5
        assert (~torch.isnan(tasks.get_batch(c, 0, torch.arange(2), L)[1])).sum(1).tolist() == [answers] * 2


def test_the_quick_skip_of_the_cost_check_bounds_heads_of_their_own_width():
    # head_dim 128 at width 64, 8 heads: attention is 1024 wide, 16x n_embd. The skip's bound counted it n_embd wide
    # (5.9 MFLOP/token against the exact 57.5), so a 6.5-hour run at 1e10 FLOP/s started unchecked (cpu_hours 0)
    args = ["vocab_size=256", "n_layer=4", "n_head=8", "n_embd=64", "head_dim=128", "ffn_hidden=176", "block_size=1024",
            "batch_size=8", "gradient_accumulation_steps=1", "max_iters=500"]
    cfg = train.TrainConfig(**train.parse_args(args))
    hours = cost.cpu_hours(cfg, rate=1e10)
    with torch.device("meta"):
        exact = GPT(GPTConfig(**{f: getattr(cfg, f) for f in MODEL_FIELDS})).flops_per_token(1024)
    assert abs(hours / (500 * 8 * 1024 * exact / 1e10 / 3600) - 1) < 1e-9 and hours > 6
    with pytest.raises(train.TrainError, match="allow_slow=True"):
        cost.cpu_cost_check(cfg, "cpu", rate=1e10)
