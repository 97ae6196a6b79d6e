"""eval_tasks.py's numbers against their definitions: score's final answer, its loss and eq. 2's squared error per
prompt (a stand-in model whose logits are known), diagnose's entropy of each row normalised to sum 1 whatever its
mass (a stand-in whose attention rows are known), and what evaluate makes of them: each test condition scored with
its own overrides and its own stream, the MSE's interval, one diagnosis per length, --logit_scale with its floor and
its name, and the sizes checked before anything runs. Tiny sizes, CPU only."""
import ast
import csv
import dataclasses
import glob
import json
import math
import os
from dataclasses import asdict, replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import eval_tasks
import tasks
from conftest import one_line_error
from lib import tracking
from lib.checkpoint import REPO, build_model, run_info, save_checkpoint
from lib.config import TrainConfig, run_config
from lib.synthetic_suite import RESCALED, SETTINGS
from model import GPTConfig
from scorers import SCORERS, Param
from test_tasks import cfg

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: tiny models, one thread


class Known(torch.nn.Module):
    """A stand-in model: logits a fixed function of each sequence's own inputs, whatever the batch."""

    def __init__(self, fn):
        super().__init__()
        self.lm_head, self.fn = torch.nn.Linear(1, 1), fn

    def forward(self, x, y):
        return self.fn(x), None


def test_score_is_each_prompts_final_answer_right_or_wrong_and_its_loss_in_nats():
    c, L, V = cfg("first"), 12, 3  # the answer: the token after the first; logits: from it and from the position
    model = Known(lambda x: 3 * torch.cos((x[..., :1, None] + 0.7 * x[..., None]).double() * torch.arange(V)
                                          + torch.arange(x.size(1))[:, None]))
    got = eval_tasks.score(model, c, L, 5, stream=7, batch=2)  # 5 prompts in batches of 2: the last one alone
    want = []
    for i in range(5):
        x, y = tasks.get_batch(c, 7, torch.tensor([i]), L, test=True)
        last = int(torch.nonzero(y[0] != -1).max())  # the final answer's position
        logits = model.fn(x)[0, last]
        want.append((float(logits.argmax() == y[0, last]), float(-F.log_softmax(logits, -1)[y[0, last]])))
    assert got.shape == (5, 2) and 0 < got[:, 0].sum() < 5  # right and wrong answers both occur
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_score_of_linear_is_eq_2s_squared_error_averaged_over_the_scored_points():
    c, L = cfg("linear"), 11
    got = eval_tasks.score(Known(lambda x: x[..., :1] * 0 + 0.5), c, L, 3, stream=2, batch=2)
    for i, e in enumerate(got):
        y = tasks.get_batch(c, 2, torch.tensor([i]), L, test=True)[1][0]
        scored = y[~torch.isnan(y)]  # read at x_3, x_4, ...: positions 4, 6, 8, 10
        assert len(scored) == 4 and e == pytest.approx(float(((0.5 - scored) ** 2).mean()), rel=1e-6)


class Rows(torch.nn.Module):
    """A stand-in model: its final attention rows (B, nh, L) fixed, one layer, no learned s."""

    def __init__(self, rows):
        super().__init__()
        self.lm_head, self.rows = torch.nn.Linear(1, 1), rows
        self.transformer = torch.nn.Module()
        self.transformer.h = [SimpleNamespace(attn=SimpleNamespace(scorer_params=dict))]

    def attention_rows(self, idx, rows=(-1,)):
        assert rows == (-1,) and idx.shape == (self.rows.size(0), self.rows.size(-1))
        return self.rows[None, :, :, None, :]  # (n_layer, B, nh, rows, L)


def test_diagnose_normalises_a_row_of_any_mass_and_gives_an_empty_row_no_entropy():
    # a row of mass 4e-36 (sigmoid, stick-breaking far from every key) had been divided by 1e-30, not by its mass
    h = lambda *p: -sum(x * math.log(x) for x in p)  # entropy in nats, by hand
    P = torch.tensor([[[1e-36, 2e-36, 1e-36, 0], [0, 0, 0, 0]],  # (B, nh, L): a row of tiny mass, an empty one
                      [[0.5, 0.5, 0, 0], [0.4, 0.6, 1.0, 0]]])  # a softmax row, one of mass 2
    got = eval_tasks.diagnose(Rows(P), cfg("first"), 4, 2, stream=0)  # the target: position 1
    assert [(r["layer"], r["head"]) for r in got] == [(0, 0), (0, 1)]
    want = [dict(entropy=(h(0.25, 0.5, 0.25) + h(0.5, 0.5)) / 2, target_mass=(2e-36 + 0.5) / 2, row_mass=0.5),
            dict(entropy=h(0.2, 0.3, 0.5), target_mass=0.3, row_mass=1.0)]  # the empty row: no entropy to average
    for r, w in zip(got, want):
        assert {k: r[k] for k in w} == pytest.approx(w, rel=1e-6) and r["uniform"] == 0.25 and math.isnan(r["s"])


def _run(path, **kw):
    """An untrained task run's checkpoint, as train.py writes one: its model and its whole config."""
    torch.manual_seed(0)
    cfg = TrainConfig(device="cpu", n_layer=1, n_head=2, n_embd=16, ffn_hidden=32, **kw)
    cfg.vocab_size = tasks.TASKS[cfg.task].vocab(cfg)  # set by the task, as train.py does
    model = build_model(GPTConfig(**{k: getattr(cfg, k) for k in GPTConfig.__dataclass_fields__}), cfg.task)
    path.parent.mkdir()
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": asdict(cfg),
                     "iter_num": 0, "run_info": run_info(0)}, str(path))
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A flipflop run (RoPE, N = 8) and a linear one (NoPE, N = 10)."""
    root = tmp_path_factory.mktemp("runs")
    return dict(flip=_run(root / "flip" / "ckpt.pt", task="flipflop", block_size=8),
                lin=_run(root / "lin" / "ckpt.pt", task="linear", block_size=10, pos="nope"))


def rows(folder, name):
    return list(csv.DictReader(open(folder / name)))


def test_each_condition_is_scored_with_its_overrides_on_its_own_stream_and_the_mse_has_a_t_interval(
        runs, tmp_path, monkeypatch):
    calls, r_lin = [], [0.5, 1.0, 3.0]

    def fake(model, c, L, n, stream, batch=eval_tasks.BATCH):
        calls.append((c.task, L, c.task_p_ignore, c.task_sigma, stream))
        return np.array(r_lin) if c.task == "linear" else np.array([[1.0, 0.5], [0.0, 1.5], [1.0, 0.25]])
    monkeypatch.setattr(eval_tasks, "score", fake)
    eval_tasks.main([runs["flip"], runs["lin"], "--lengths", "8", "11", "--n", "3", "--diagnose", "2",
                     "--out_dir", str(tmp_path / "ev")])
    for task, key, values in (("flipflop", 2, [0.8, 0.98, 0.1]), ("linear", 3, [1.0, 2.0, 4.0])):
        for L in (8, 11):
            mine = [call for call in calls if call[:2] == (task, L)]
            assert [call[key] for call in mine] == values  # each condition as its name says
            streams = [call[-1] for call in mine]  # each its own, none of training's or validation's
            assert len(set(streams)) == 3 and not {tasks.TRAIN, tasks.VAL} & set(streams)
    acc = rows(tmp_path / "ev", "accuracy.csv")
    for r in acc:
        if r["task"] == "linear":  # the mean squared error, 1.96 standard errors (n - 1 in the variance) each side
            half = 1.96 * np.std(r_lin, ddof=1) / math.sqrt(3)
            assert float(r["mse"]) == pytest.approx(np.mean(r_lin)) and r["accuracy"] == r["loss"] == ""
            assert (float(r["ci_low"]), float(r["ci_high"])) == pytest.approx((np.mean(r_lin) - half,
                                                                                np.mean(r_lin) + half))
        else:
            assert float(r["accuracy"]) == pytest.approx(2 / 3) and float(r["loss"]) == pytest.approx(0.75)
    att = rows(tmp_path / "ev", "attention.csv")  # diagnosed once per length (not per condition), every head
    for task in ("flipflop", "linear"):
        keys = [(r["length"], r["layer"], r["head"]) for r in att if r["task"] == task]
        assert sorted(keys) == [(L, "0", h) for L in ("11", "8") for h in ("0", "1")]


def test_logit_scale_rescales_with_its_floor_and_names_the_setting(runs, tmp_path):
    def losses(*extra):
        out = tmp_path / "-".join(["ev", *extra]).replace("--", "")
        eval_tasks.main([runs["flip"], "--lengths", "16", "--n", "3", "--out_dir", str(out), *extra])
        prompts = rows(out, "per_prompt.csv")
        return {p["setting"] for p in prompts}, [p["answer_loss"] for p in prompts]
    names, plain = losses()
    assert names == {"softmax"}
    names, llama_8192 = losses("--logit_scale", "llama4")  # Llama 4's floor: factor 1 below 8,192 tokens
    assert names == {"softmax-llama4"} and llama_8192 == plain
    names, llama_4 = losses("--logit_scale", "llama4", "--llama4_floor", "4")  # rows n_i >= 4 scaled up
    assert names == {"softmax-llama4"} and llama_4 != plain
    settings = json.load(open(tmp_path / "ev-logit_scale-llama4-llama4_floor-4" / "settings.json"))
    assert settings["args"]["llama4_floor"] == 4 and "git_sha" in settings["run_info"]  # the rows' name has no F


def test_too_few_prompts_and_a_diagnosis_beyond_memory_are_one_error_line(runs, tmp_path, monkeypatch):
    argv = [runs["flip"], "--lengths", "8", "--out_dir", str(tmp_path / "ev")]
    assert "need --n >= 2" in one_line_error(eval_tasks.main, [*argv, "--n", "1"])  # one prompt: no interval
    per = eval_tasks.bytes_per_token(eval_tasks.load(runs["flip"])[0].config)
    monkeypatch.setattr(tracking, "memory_available", lambda: 8 * 10 * per)  # 10 sequences of 8 tokens fit
    eval_tasks.main([*argv, "--n", "4", "--diagnose", "10"])
    msg = one_line_error(eval_tasks.main, [*argv[:-1], str(tmp_path / "ev2"), "--n", "4", "--diagnose", "11"])
    assert "--lengths 8: 11 sequences of 8 tokens need about" in msg and not (tmp_path / "ev2").exists()


def test_eval_tasks_refuses_a_wandb_project_given_without_wandb(tmp_path):
    # settings.json recorded the project as if the results had been logged to it
    argv = [str(tmp_path / "missing.pt"), "--lengths", "8", "--out_dir", str(tmp_path / "ev")]
    msg = one_line_error(eval_tasks.main, [*argv, "--wandb_project", "p"])
    assert "--wandb_project p is not read: nothing is logged to it without --wandb" in msg
    for read in (["--wandb_project", "nanoscorer"], ["--wandb", "--wandb_project", "p"]):  # a default, or logged
        assert "not read" not in one_line_error(eval_tasks.main, [*argv, *read])


def test_a_diagnosis_without_rope_plain_is_one_error_line_and_a_nope_run_is_diagnosed_whatever_rope(runs, tmp_path):
    # attention.csv has no rope column and is written at the trained θ only: --rope theta had written none, silently
    msg = one_line_error(eval_tasks.main, [runs["flip"], "--lengths", "8", "--n", "2", "--diagnose", "2", "--rope",
                                           "theta", "--out_dir", str(tmp_path / "ev")])
    assert "--diagnose 2" in msg and "add plain" in msg and not (tmp_path / "ev").exists()
    eval_tasks.main([runs["lin"], "--lengths", "10", "--n", "2", "--diagnose", "2", "--rope", "theta",
                     "--out_dir", str(tmp_path / "nope")])  # NoPE: no RoPE to extend, its attention is the trained one
    assert {r["length"] for r in rows(tmp_path / "nope", "attention.csv")} == {"10"}


def test_a_rope_given_twice_is_evaluated_once(runs, tmp_path):  # as a length given twice: no row written twice
    eval_tasks.main([runs["flip"], "--lengths", "8", "8", "--n", "2", "--rope", "plain", "theta", "plain",
                     "--out_dir", str(tmp_path / "ev")])
    keys = [(r["length"], r["condition"], r["rope"]) for r in rows(tmp_path / "ev", "accuracy.csv")]
    assert len(keys) == len(set(keys)) == 6 and [k[2] for k in keys[::3]] == ["plain", "theta"]
    args = json.loads((tmp_path / "ev" / "settings.json").read_text())["args"]
    assert (args["rope"], args["lengths"]) == (["plain", "theta"], [8])  # what ran, each once


@pytest.mark.parametrize("n_in,loss", [(0, "ce"), (1, "bce"), (1, "mse")])
def test_a_test_sequence_with_no_scored_position_is_an_error_naming_the_task_and_length(n_in, loss, monkeypatch):
    # it had been graded at position 0: a traceback for tokens (target -1), a wrong answer or a NaN MSE for reals
    def late(L, rng, c, test):  # answers only from position 4 on, and no min_length registered
        y = np.where(np.arange(L) >= 4, 1, -1 if n_in == 0 else np.nan)
        return (np.ones((L, n_in), np.float32) if n_in else np.ones(L, np.int64)), y
    monkeypatch.setitem(tasks.TASKS, "late", tasks.Task(late, lambda c: 1 if n_in else 3, loss, n_in))
    model = Known(lambda x: torch.zeros(*x.shape[:2], 1 if n_in else 3))
    assert len(eval_tasks.score(model, cfg("late"), 5, 2, stream=2)) == 2
    with pytest.raises(ValueError, match="task 'late' at length 3: test sequence 0 has no scored position"):
        eval_tasks.score(model, cfg("late"), 3, 2, stream=2)


def test_a_diagnosis_of_a_task_with_no_known_target_says_its_target_mass_is_nan(runs, tmp_path, capsys):
    # target_positions had answered -1 (no witness) for every sequence of a task it did not know, silently
    eval_tasks.main([runs["flip"], "--lengths", "8", "--n", "2", "--diagnose", "2", "--out_dir", str(tmp_path / "ev")])
    assert "task 'flipflop' has no target position" in capsys.readouterr().out
    assert all(math.isnan(float(r["target_mass"])) for r in rows(tmp_path / "ev", "attention.csv"))
    with pytest.raises(ValueError, match="task 'flipflop': no target position known"):
        tasks.target_positions(cfg("flipflop"), torch.zeros(2, 8, dtype=torch.long))


def labels_of(overrides):
    """setting() of a run trained with these config values, TrainConfig's defaults elsewhere."""
    return eval_tasks.setting({**asdict(TrainConfig()), **overrides})


# the labels the committed results and configs/ carry (results/synthetic*/accuracy.csv): grouped by them
SUITE_LABELS = {"ssmax-fixed-s": "ssmax-fixed-s", "softmax-logN": "ssmax-s0-b3.47", "ssmax-s0.5": "ssmax-s0.5",
                "ssmax-s2": "ssmax-s2", "softmax-wd0": "softmax-wd0", "ssmax-wd0": "ssmax-wd0",
                "softmax-p3": "softmax-p3", **{s: "softmax" for s in RESCALED}}
CONFIG_LABELS = {"lssar.py": "lssar-p15", "paper/lssar.py": "lssar-p15", "ssa_learn_n.py": "ssa-learn-n",
                 "paper/ssa_learn_n.py": "ssa-learn-n", "ssmax_bias.py": "ssmax-bias", "paper/ssmax_bias.py":
                 "ssmax-bias", "ssmax_nos.py": "ssmax-fixed-s", "paper/ssmax_nos.py": "ssmax-fixed-s",
                 "cpu_quick.py": "ssmax", "sft.py": "softmax-wd0", "cpu_char.py": "softmax"}


def test_setting_keeps_the_label_of_every_suite_setting_and_config():
    for name, over in SETTINGS.items():  # a setting named by its scorer alone keeps that name
        values = {k: v if k == "scorer" else ast.literal_eval(v) for k, v in (
            o.format(log_N=math.log(32)).split("=", 1) for o in over)}  # N = 32: b = log N = 3.47
        assert labels_of(values) == SUITE_LABELS.get(name, values["scorer"]), name
    for path in glob.glob(os.path.join(REPO, "configs", "**", "*.py"), recursive=True):
        values = {k: v for k, v in run_config(path).items() if k in asdict(TrainConfig())}
        want = CONFIG_LABELS.get(os.path.relpath(path, os.path.join(REPO, "configs")), values.get("scorer", "softmax"))
        assert labels_of(values) == want, path


def test_setting_names_a_scorers_registry_option_away_from_its_default(monkeypatch):
    # ssa_n=3 and a new scorer's a=1 and a=3 had each been one label: two settings pooled under one name
    assert [labels_of(dict(scorer="ssa", **kw)) for kw in ({}, dict(ssa_n=3.0), dict(ssa_b_init=0.5, ssa_learn_n=True),
                                                           dict(ssa_n=1.5, reweight_p=3.0))] == [
        "ssa", "ssa-n3", "ssa-learn-n-b_init0.5", "ssa-p3"]  # ssa_n at its default 1.5: no mark
    prm = Param("a", 1.0, init="powersoftmax_a_init", learn="powersoftmax_learn_a")
    monkeypatch.setitem(SCORERS, "powersoftmax", replace(SCORERS["softmax"], params=(prm,)))
    for f, default in (("powersoftmax_a_init", 1.0), ("powersoftmax_learn_a", True)):  # its GPTConfig fields
        monkeypatch.setitem(GPTConfig.__dataclass_fields__, f, dataclasses.field(default=default))
    got = [labels_of(dict(scorer="powersoftmax", **kw)) for kw in (
        {}, dict(powersoftmax_a_init=1.0), dict(powersoftmax_a_init=3.0), dict(powersoftmax_learn_a=False),
        dict(powersoftmax_a_init=3.0, weight_decay=0.0))]
    assert got == ["powersoftmax", "powersoftmax", "powersoftmax-a_init3", "powersoftmax-no_learn_a",
                   "powersoftmax-a_init3-wd0"]


def test_setting_names_ssmax_start_values_that_learn_and_options_that_are_not_numbers(monkeypatch):
    # ssmax learning s from 2, or b from 3, had been labelled as the defaults' runs: "ssmax", "ssmax-bias"
    assert [labels_of(dict(scorer="ssmax", **kw)) for kw in (
        {}, dict(ssmax_s_init=2.0), dict(ssmax_bias=True), dict(ssmax_bias=True, ssmax_b_init=3.0),
        dict(ssmax_learn_s=False, ssmax_s_init=2.0), dict(ssmax_bias=True, ssmax_learn_b=False, ssmax_b_init=3.0))] == [
        "ssmax", "ssmax-s_init2", "ssmax-bias", "ssmax-bias-b_init3", "ssmax-s2", "ssmax-b3"]
    assert labels_of(dict(scorer="ssa", ssa_n=2.0000001)) == "ssa-n2.0000001"  # :g's 6 digits would read ssa-n2
    prm = Param("a", 1.0, init="powersoftmax_mode")  # a str option: its repr, not a format error
    monkeypatch.setitem(SCORERS, "powersoftmax", replace(SCORERS["softmax"], params=(prm,)))
    monkeypatch.setitem(GPTConfig.__dataclass_fields__, "powersoftmax_mode", dataclasses.field(default="slow"))
    assert labels_of(dict(scorer="powersoftmax", powersoftmax_mode="fast")) == "powersoftmax-mode'fast'"
