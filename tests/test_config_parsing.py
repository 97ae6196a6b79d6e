"""lib/config.py's edges, pinned by a mutation audit: every range's bound taken and the value past it refused in one
line, bools kept apart from numbers, an override's value holding '=', a chain of base files, what a resume keeps
from its checkpoint's config, the cross-field checks at their bounds, what a scorer switch changes, and the CPU cost
at a measured rate and for an SFT run in epochs. CPU only, no training."""
import math
import types

import pytest
import torch

from lib import config as config_lib
from lib import cost
from lib.config import TrainConfig, TrainError, model_config, parse_args, resolve
from model import GPT, GPTConfig

TINY = dict(vocab_size=64, n_layer=1, n_head=2, n_embd=16, ffn_hidden=32, block_size=64)


def error(*argv):
    with pytest.raises(TrainError) as e:
        parse_args(list(argv))
    assert "\n" not in str(e.value)
    return str(e.value)


# ----------------------------------------------------------------------------------------------------------------
# Overrides: ranges, types, values

@pytest.mark.parametrize("arg,want", [
    ("learning_rate=1e30", 1e30), ("learning_rate=0", 0.0), ("min_lr=0", 0.0), ("seed=0", 0),
    ("seed=9223372036854775807", 2 ** 63 - 1), ("max_iters=0", 0), ("warmup_iters=0", 0), ("grad_clip=0", 0.0),
    ("weight_decay=0", 0.0), ("copy_frac=1", 1.0), ("copy_frac=0", 0.0), ("sft_val_frac=0", 0.0), ("dropout=0", 0.0),
    ("beta2=0.999", 0.999), ("ffn_hidden=1", 1), ("head_dim=None", None), ("head_dim=64.0", 64),
])
def test_each_range_takes_its_bound(arg, want):
    key = arg.split("=")[0]
    got = parse_args([arg])[key]
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize("arg,msg", [
    ("ffn_hidden=0", "ffn_hidden=0 is out of range: ffn_hidden must be > 0"),
    ("vocab_size=0", "vocab_size=0 is out of range: vocab_size must be > 0"),
    ("n_embd=0", "n_embd=0 is out of range: n_embd must be > 0"),
    ("copy_span=0", "copy_span=0 is out of range: copy_span must be > 0"),
    ("ssa_b_init=0", "ssa_b_init=0.0 is out of range: ssa_b_init must be > 0"),
    ("warmup_iters=-1", "warmup_iters=-1 is out of range: warmup_iters must be >= 0"),
    ("lr_decay_iters=-1", "lr_decay_iters=-1 is out of range: lr_decay_iters must be >= 0"),
    ("grad_clip=-1", "grad_clip=-1.0 is out of range: grad_clip must be >= 0"),
    ("weight_decay=-0.1", "weight_decay=-0.1 is out of range: weight_decay must be >= 0"),
    ("sft_epochs=-1", "sft_epochs=-1 is out of range: sft_epochs must be >= 0"),
    ("learning_rate=1e31", "learning_rate=1e+31 is out of range: learning_rate must be >= 0 and <= 1e30 (more "
                           "overflows AdamW's float32 step)"),
    ("seed=-1", "seed=-1 is out of range: seed must be in [0, 2**63)"),
    ("seed=9223372036854775808", "seed=9223372036854775808 is out of range: seed must be in [0, 2**63)"),
    ("out_dir= ", "out_dir=' ' is out of range: out_dir must be a folder name, not empty"),
    ("norm_eps=0", "norm_eps=0.0 is out of range: norm_eps must be > 0"),
    ("beta1=1", "beta1=1.0 is out of range: beta1 must be in [0, 1)"),
    ("beta2=1", "beta2=1.0 is out of range: beta2 must be in [0, 1)"),
    ("sft_val_frac=1", "sft_val_frac=1.0 is out of range: sft_val_frac must be in [0, 1)"),
    ("copy_frac=1.5", "copy_frac=1.5 is out of range: copy_frac must be in [0, 1]"),
])
def test_the_value_just_past_a_bound_is_one_line_naming_it_and_the_range(arg, msg):
    assert error(arg) == msg


@pytest.mark.parametrize("arg,msg", [
    ("learning_rate=True", "learning_rate=True has the wrong type: learning_rate is float"),
    ("max_iters=True", "max_iters=True has the wrong type: max_iters is int"),
    ("n_layer=None", "n_layer=None has the wrong type: n_layer is int"),
    ("head_dim=64.5", "head_dim=64.5 has the wrong type: head_dim is int or None"),
    ("reweight_p='high'", "reweight_p='high' has the wrong type: reweight_p is float or None"),
    ("learning_rate=-inf", "learning_rate=-inf is not a finite number: learning_rate must be finite"),
    ("ssa_n=+nan", "ssa_n=nan is not a finite number: ssa_n must be finite"),
])
def test_a_bool_is_no_number_none_only_optional_and_signed_nan_inf_not_finite(arg, msg):
    assert error(arg) == msg


def test_an_override_value_may_hold_an_equals_sign():
    assert parse_args(["wandb_run_name=lr=3e-4", "init_from=runs/a=1/ckpt.pt"]) == {
        "wandb_run_name": "lr=3e-4", "init_from": "runs/a=1/ckpt.pt"}


# ----------------------------------------------------------------------------------------------------------------
# Config files

def test_a_chain_of_bases_applies_the_deepest_first_and_a_cycle_or_non_py_base_is_refused(tmp_path):
    (tmp_path / "a.py").write_text('n_layer = 3\nn_head = 3\nout_dir = "out-a"\n')
    (tmp_path / "b.py").write_text('base = "a.py"\nn_head = 4\nout_dir = "out-b"\n')
    (tmp_path / "c.py").write_text('base = "b.py"\nout_dir = "out-c"\n')
    assert parse_args([str(tmp_path / "c.py")]) == dict(n_layer=3, n_head=4, out_dir="out-c")
    (tmp_path / "a.py").write_text('base = "c.py"\n')  # c -> b -> a -> c
    (tmp_path / "d.txt").write_text("n_layer = 2\n")
    (tmp_path / "e.py").write_text('base = "d.txt"\n')
    (tmp_path / "f.py").write_text('base = "nope.py"\n')
    for path, why in (("c.py", "leads back to it"), ("e.py", "is not a .py file"), ("f.py", "is no such file")):
        assert f"must name another config file (.py) in its folder; this one {why}" in error(str(tmp_path / path))


def test_a_config_files_overwrite_without_an_out_dir_overwrites_nothing(tmp_path):
    (tmp_path / "o.py").write_text("overwrite = True\nmax_iters = 5\n")
    assert parse_args([str(tmp_path / "o.py")]) == {"max_iters": 5}  # not the default out_dir "out"
    assert parse_args([str(tmp_path / "o.py"), "overwrite=True"]) == {"max_iters": 5, "overwrite": True}


# ----------------------------------------------------------------------------------------------------------------
# Resolution

def test_a_resume_keeps_the_stored_config_under_this_commands_and_its_own_out_dir():
    ckpt = {"config": {"out_dir": "moved-from", "max_iters": 10, "n_layer": 3, "a_retired_field": 1}}
    cfg = resolve(TrainConfig(max_iters=20), {"max_iters": 20}, ckpt, resuming=True, world=1)
    assert (cfg.out_dir, cfg.max_iters, cfg.n_layer) == ("out", 20, 3)


def test_init_from_takes_the_checkpoints_model_fields_except_those_this_command_sets():
    ckpt = {"model_args": {"n_layer": 3, "block_size": 64, "scorer": "ssmax"}}
    cfg = resolve(TrainConfig(block_size=128), {"block_size": 128}, ckpt, resuming=False, world=1)
    assert (cfg.n_layer, cfg.block_size, cfg.scorer) == (3, 128, "ssmax")


def cross_checked(*argv):
    return resolve(TrainConfig(**parse_args(list(argv))), parse_args(list(argv)), None, resuming=False, world=1)


def test_cosine_needs_decay_at_or_past_warmup_and_the_other_schedules_do_not():
    assert cross_checked("lr_schedule=cosine", "warmup_iters=100", "lr_decay_iters=100").lr_decay_iters == 100
    assert cross_checked("warmup_iters=100", "lr_decay_iters=10").lr_schedule == "constant"
    with pytest.raises(TrainError, match=r"sft_epochs sets it"):  # SFT in epochs sets both: never ran as typed
        cross_checked("lr_schedule=cosine", "warmup_iters=100", "lr_decay_iters=1", "sft_epochs=2", "sft_data='x'")
    with pytest.raises(TrainError, match=r"^lr_decay_iters=99 is below warmup_iters=100: cosine"):
        cross_checked("lr_schedule=cosine", "warmup_iters=100", "lr_decay_iters=99")


def test_a_task_run_takes_a_block_size_of_exactly_its_shortest_length():
    assert cross_checked("task=linear", "block_size=5").block_size == 5  # the 3rd point's y, at position 5


def checkpoint(scorer="softmax", **model):
    model_args = {f: getattr(GPTConfig, f) for f in config_lib.MODEL_FIELDS} | TINY | {"scorer": scorer} | model
    return {"model_args": model_args, "model": {}, "iter_num": 0, "config": {"max_iters": 10}}


@pytest.mark.parametrize("field,value", [("head_dim", 16), ("n_kv_head", 1), ("norm_eps", 1e-5)])
def test_init_from_refuses_another_architecture(field, value):
    ckpt = checkpoint()
    cfg, was = TrainConfig(**{**ckpt["model_args"], field: value}), ckpt["model_args"][field]
    with pytest.raises(TrainError, match=rf"^{field}={value!r} differs from the checkpoint's {was!r}: it cannot change "
                                         r"\(a different architecture\)"):
        model_config(cfg, {field: value}, ckpt, resuming=False)


def test_a_switch_to_ssmax_sets_s0_for_the_checkpoints_block_size_not_the_new_one():
    ckpt = checkpoint()  # trained at 64 positions, fine-tuned at 128
    cfg = TrainConfig(**{**ckpt["model_args"], "scorer": "ssmax", "block_size": 128})
    model_args, switch = model_config(cfg, {"scorer": "ssmax", "block_size": 128}, ckpt, resuming=False)
    s0 = 64 / sum(math.log(n) for n in range(1, 65))  # 1 / mean log n over the 64 trained positions
    assert model_args["ssmax_s_init"] == pytest.approx(s0, rel=1e-12) and model_args["block_size"] == 128
    assert switch["scorer"] == ["softmax", "ssmax"]


# ----------------------------------------------------------------------------------------------------------------
# The CPU cost

def exact_flops_per_token(cfg):
    with torch.device("meta"):
        return GPT(GPTConfig(**{f: getattr(cfg, f) for f in config_lib.MODEL_FIELDS})).flops_per_token(cfg.block_size)


def test_the_measured_rate_is_the_two_timed_matmuls_flops_over_their_time(monkeypatch, capsys):
    clock = iter([0.0, 10.0, 12.0])  # the warm-up's start, the timed pass's start, its end: 2 s
    monkeypatch.setattr(cost, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    monkeypatch.setattr(torch, "mm", lambda a, b: a)  # the clock above times it, not the real matmul
    cfg = TrainConfig(**TINY, batch_size=8, gradient_accumulation_steps=1, max_iters=10 ** 8)
    rate = 2 * 2 * 1024 ** 3 / 2  # two 1024^3 matmuls, 2 FLOP a multiply-add, in 2 s
    hours = 10 ** 8 * 8 * 64 * exact_flops_per_token(cfg) / rate / 3600
    assert cost.cpu_hours(cfg) == pytest.approx(hours, rel=1e-12)
    assert "at 2.15 GFLOP/s (this CPU's measured fp32 matmul rate)" in capsys.readouterr().out


def test_an_sft_run_in_epochs_costs_its_epochs_of_held_in_examples_not_max_iters(tmp_path):
    data = tmp_path / "sft.jsonl"
    data.write_text('{"prompt": "a", "answer": "b"}\n' * 100)
    cfg = TrainConfig(**TINY, batch_size=3, gradient_accumulation_steps=1, max_iters=1, sft_data=str(data),
                      sft_epochs=10 ** 6, sft_val_frac=0.05)
    iters = 10 ** 6 * math.ceil(95 / 3)  # 5 of the 100 held out; 32 iterations an epoch
    hours = iters * 3 * 64 * exact_flops_per_token(cfg) / 1e10 / 3600
    assert cost.cpu_hours(cfg, rate=1e10) == pytest.approx(hours, rel=1e-12)


def test_a_run_estimated_at_exactly_the_limit_starts_and_one_just_over_stops(monkeypatch):
    cfg = TrainConfig(**TINY)
    monkeypatch.setattr(cost, "cpu_hours", lambda *a: cost.CPU_LIMIT_HOURS)
    assert cost.cpu_cost_check(cfg, "cpu") is None
    monkeypatch.setattr(cost, "cpu_hours", lambda *a: cost.CPU_LIMIT_HOURS * 1.01)
    with pytest.raises(TrainError, match="allow_slow=True"):
        cost.cpu_cost_check(cfg, "cpu")
    assert cost.cpu_cost_check(cfg, "mps") is None  # only a CPU is checked


def test_the_triton_interpreter_lets_backend_triton_pass_the_cpu_check(monkeypatch):
    cfg = TrainConfig(**TINY, backend="triton", max_iters=1)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the tests' CPU path through the fused kernels
    assert cost.cpu_cost_check(cfg, "cpu") is None
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(TrainError, match=r"^backend='triton': the fused Triton kernels need a CUDA GPU"):
        cost.cpu_cost_check(cfg, "cpu")


def test_backend_flex_on_a_cpu_is_refused_before_training_but_an_eval_only_run_passes():
    # FlexAttention has no CPU backward: the run once died after its first eval with torch's NotImplementedError
    with pytest.raises(TrainError, match=r"^backend='flex': FlexAttention has no backward on the CPU"):
        cost.cpu_cost_check(TrainConfig(**TINY, backend="flex", max_iters=1), "cpu")
    assert cost.cpu_cost_check(TrainConfig(**TINY, backend="flex", max_iters=0), "cpu") is None
    with pytest.raises(TrainError, match=r"compiled, no forward of its own"):  # inductor: "CPU only supports inference"
        cost.cpu_cost_check(TrainConfig(**TINY, backend="flex", max_iters=0, compile=True), "cpu")


def test_a_config_file_after_a_key_value_it_sets_is_refused_not_applied_over_it(tmp_path):
    # `train.py scorer=softmax configs/cpu_quick.py` trained ssmax: the file replaced the override without a word
    with pytest.raises(TrainError, match=r"^configs/cpu_quick.py comes after eval_iters=, scorer=, which it sets too"):
        parse_args(["scorer=softmax", "eval_iters=1", "configs/cpu_quick.py"])
    assert parse_args(["wandb_log=False", "configs/cpu_quick.py"])["scorer"] == "ssmax"  # one it does not set
    assert parse_args(["configs/cpu_quick.py", "scorer=softmax"])["scorer"] == "softmax"


@pytest.mark.parametrize("task,arg", [("", "task_pairs=8"), ("first", "task_pairs=8"), ("flipflop", "task_sigma=2.0"),
                                      ("every", "task_filler='noise'"), ("mqar", "task_filler='noise'")])
def test_a_task_option_no_task_reads_is_refused_never_ignored(task, arg):
    key, value = arg.split("=")
    cfg = TrainConfig(**TINY, task=task, **{key: eval(value)})
    with pytest.raises(TrainError, match=rf"^{key}={value}: " + ("task" if task else "a task option")):
        resolve(cfg, {}, None, False, 1)
    if task:
        tasks_ok = TrainConfig(**TINY, task="recall", task_filler="noise", task_pairs=3)
        assert resolve(tasks_ok, {}, None, False, 1).task_filler == "noise"  # read by recall


def test_help_shows_each_default_as_a_python_literal():
    text = " ".join(config_lib.usage("doc").split())  # textwrap may break a line between fields
    assert "out_dir='out'," in text and "wandb_run_name=''," in text and "max_iters=200000," in text


def test_a_bases_overwrite_covers_its_own_out_dir_never_one_a_config_built_on_it_names(tmp_path):
    (tmp_path / "demo.py").write_text('out_dir = "out-demo"\noverwrite = True\nmax_iters = 5\n')
    (tmp_path / "mine.py").write_text('base = "demo.py"\nout_dir = "out-mine"\n')  # a user's config on the demo's
    (tmp_path / "same.py").write_text('base = "demo.py"\nmax_iters = 7\n')
    (tmp_path / "asks.py").write_text('base = "demo.py"\nout_dir = "out-mine"\noverwrite = True\n')
    mine = parse_args([str(tmp_path / "mine.py")])
    assert mine == {"out_dir": "out-mine", "max_iters": 5}  # out-mine's run is refused, never replaced
    assert parse_args([str(tmp_path / "same.py")]) == {"out_dir": "out-demo", "overwrite": True, "max_iters": 7}
    assert parse_args([str(tmp_path / "asks.py")])["overwrite"] is True
    assert parse_args([str(tmp_path / "mine.py"), "overwrite=True"])["overwrite"] is True  # asked on the command line


@pytest.mark.parametrize("argv,msg", [
    (["configs/cpu_quick.py", "copy_span=8", "copy_kind='random'"], "copy_span=8, copy_kind='random': not read by "
     "this run (no copy_frac)"),
    (["sft_epochs=3", "sft_val_frac=0.5"], "sft_epochs=3, sft_val_frac=0.5: not read by this run (no sft_data)"),
    (["sft_data='x.jsonl'", "sft_epochs=2", "max_iters=10"], "max_iters=10: not read by this run (sft_epochs sets "
     "it, in epochs)"),  # it trained to 2 epochs' iterations, max_iters=10 recorded as typed and never run
    (["pos='nope'", "rope_theta=500.0"], "rope_theta=500.0: not read by this run (pos='nope' has no RoPE)"),
    (["task='some'", "tie_embeddings=True", "vocab_size=1"], "tie_embeddings=True: task 'some' reads real numbers"),
])
def test_an_option_the_run_would_not_read_is_refused_not_recorded_as_run(argv, msg):
    with pytest.raises(TrainError, match="^" + msg.replace("(", r"\(").replace(")", r"\)")):
        cross_checked(*argv)
    assert cross_checked("configs/cpu_char.py", "copy_frac=0").copy_span == 16  # a control without copies: asked
    stored = {"config": {**vars(TrainConfig(copy_frac=1.0)), "copy_frac": 1.0}}  # a copy run, resumed
    assert resolve(TrainConfig(copy_span=8), {"copy_span": 8}, stored, True, 1).copy_span == 8


@pytest.mark.parametrize("kw,msg", [(dict(reweight_p=1e10), r"reweight_p=10000000000.0 must be in \(0, 100\]"),
                                    (dict(reweight_p=math.inf), "reweight_p=inf must be in"),
                                    (dict(scorer="ssmax", ssmax_s_init=math.nan), "ssmax_s_init=nan: must be finite"),
                                    (dict(scorer="ssa", ssa_b_init=math.inf), "ssa_b_init=inf"),
                                    (dict(norm_eps=math.nan), "norm_eps=nan: must be finite")])
def test_a_config_built_in_code_refuses_what_the_command_line_refuses(kw, msg):
    # p = 1e10 gave Triton rows 3.1 off (r = y / y_max rounds to 1 + ulp; r^p = inf); nan/inf built models of nan
    with pytest.raises(ValueError, match=msg):
        GPTConfig(**kw)
    assert GPTConfig(scorer="lssa", reweight_p=100.0).p == 100.0
