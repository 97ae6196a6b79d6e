"""lib/tracking.py's numbers against hand-computed ones: the progress line (MFU in percent, ETA as h:mm:ss), a
step's tokens/s, ETA and elapsed time from its own step time (a stand-in clock), MFU off the GPU, the memory a process
may still take, each layer's scorer statistics, what a stand-in wandb run receives, and what --compare and loss.png
read from log.jsonl. CPU only."""
import json
import os
import types

import pytest
import torch

from conftest import random_ids_data
import train
from lib import figures, tracking
from test_train import read_log, tiny_args

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: tiny models, one thread


def cfg_of(out_dir, **kw):
    return types.SimpleNamespace(**{"wandb_log": False, "out_dir": str(out_dir), "log_interval": 5, **kw})


def test_progress_line_reads_mfu_as_a_percent_and_eta_as_hours_minutes_seconds(tmp_path, capsys):
    record = {"iter": 10, "loss": 2.5, "lr": 3e-4, "tokens_per_s": 123456.7, "mfu": 0.3421, "eta_s": 3725.4}
    tracking.progress(record, cfg_of(tmp_path), {}, None)
    tracking.progress({**record, "iter": 11}, cfg_of(tmp_path), {}, None)  # not a log_interval step: no line
    assert capsys.readouterr().out == "iter 10: loss 2.5000, lr 3.00e-04, 123,457 tok/s, mfu 34.2%, eta 1:02:05\n"
    assert read_log(tmp_path) == [record, {**record, "iter": 11}]  # every step's record, the line or not


def test_a_steps_tokens_per_s_eta_and_elapsed_come_from_its_own_step_time(tmp_path_factory, tmp_path, monkeypatch):
    # a stand-in clock that only the training steps move: 8, 2, 4 and 1 s (half in each of 2 micro-steps)
    clock, seconds = [0.0], iter([8, 8, 2, 2, 4, 4, 1, 1])
    monkeypatch.setattr(train, "time", types.SimpleNamespace(time=lambda: clock[0]))
    batch_loss = train.batch_loss

    def timed(*args):
        if torch.is_grad_enabled():  # a training micro-step, not an eval batch
            clock[0] += next(seconds) / 2
        return batch_loss(*args)
    monkeypatch.setattr(train, "batch_loss", timed)
    data_dir = random_ids_data(tmp_path_factory, 512)
    train.main(tiny_args(data_dir, tmp_path, "max_iters=4", "eval_interval=100", "gradient_accumulation_steps=2"))
    steps = [r for r in read_log(tmp_path) if "loss" in r]
    tokens = 2 * 2 * 16  # accumulation x batch x block: 64 tokens per iteration
    assert [r["tokens_per_s"] for r in steps] == [tokens / 8, tokens / 2, tokens / 4, tokens / 1]
    # the average leaves out the first step (a compile), then moves 1/10 toward each step: 2, 2.2, 2.08
    assert [r["eta_s"] for r in steps] == pytest.approx([3 * 8, 2 * 2, 1 * (0.9 * 2 + 0.1 * 4), 0])
    assert [r["elapsed"] for r in steps] == [8, 10, 14, 15]
    assert [r["elapsed"] for r in read_log(tmp_path) if "val_loss" in r] == [0, 15]


def test_mfu_is_none_for_a_run_on_the_cpu_of_a_machine_with_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    model = types.SimpleNamespace(flops_per_token=lambda T: 6e6)
    assert tracking.mfu(model, 1e6, 32, device="cpu") is None
    assert tracking.mfu(model, 1e6, 32, device="cuda:0") == pytest.approx(6e12 / 989e12)


def test_every_peak_flops_entry_is_the_one_a_device_with_that_name_finds(monkeypatch):
    """The first key a device's name contains wins: a key after one it contains ("GH200" after "H200") is never read."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    model = types.SimpleNamespace(flops_per_token=lambda T: 1.0)
    for key, peak in tracking.PEAK_BF16_FLOPS.items():
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: f"NVIDIA {key} 80GB")
        assert next(k for k in tracking.PEAK_BF16_FLOPS if k in f"NVIDIA {key} 80GB") == key
        assert tracking.mfu(model, 1.0, 32) == 1 / peak


def test_memory_available_is_the_least_of_meminfo_and_each_cgroups_room_in_bytes(monkeypatch):
    files = {"/proc/meminfo": "MemTotal:       16000000 kB\nMemAvailable:    8000000 kB\n",
             "/sys/fs/cgroup/memory.max": "6000000000\n", "/sys/fs/cgroup/memory.current": "1000000000\n"}

    def fake_open(path, *args, **kwargs):
        if path not in files:
            raise FileNotFoundError(path)
        import io
        return io.StringIO(files[path])
    monkeypatch.setattr(tracking, "open", fake_open, raising=False)
    assert tracking.memory_available() == 5_000_000_000  # the cgroup's 6 GB limit less its 1 GB in use
    files["/sys/fs/cgroup/memory.max"] = "max\n"  # no limit: MemAvailable's kB in bytes
    assert tracking.memory_available() == 8_000_000 * 1024
    files.clear()  # neither: not Linux
    assert tracking.memory_available() is None


class Attn(torch.nn.Module):
    """A stand-in attention layer: its scorer parameters set by hand."""
    def __init__(self, s, b):
        super().__init__()
        self.s, self.b = torch.tensor(s), b

    def scorer_params(self):
        return {"s": self.s, "b": self.b}


def test_scorer_stats_are_each_layers_mean_min_and_max_over_heads_in_module_order():
    model = torch.nn.Sequential(Attn([1.0, 2.0, 6.0], None), torch.nn.ReLU(), Attn([-1.0, 3.0], torch.tensor([0.5])))
    assert tracking.scorer_stats(model) == {
        "scorer/layer0/s_mean": 3.0, "scorer/layer0/s_min": 1.0, "scorer/layer0/s_max": 6.0,  # b None: no b
        "scorer/layer1/s_mean": 1.0, "scorer/layer1/s_min": -1.0, "scorer/layer1/s_max": 3.0,
        "scorer/layer1/b_mean": 0.5, "scorer/layer1/b_min": 0.5, "scorer/layer1/b_max": 0.5}
    assert tracking.scorer_stats(torch.nn.Linear(2, 2)) == {}


def test_wandb_gets_a_steps_numbers_with_scorer_stats_and_an_evals_losses_at_their_iter(tmp_path, monkeypatch):
    runs = []

    class StandInRun:  # what tracking uses of a wandb run
        def __init__(self, **kwargs):
            self.kwargs, self.logged, self.exit_code = kwargs, [], None
            runs.append(self)

        def log(self, row, step):
            self.logged.append((step, row))

        def finish(self, exit_code):
            self.exit_code = exit_code
    monkeypatch.setattr(tracking, "start", StandInRun)
    monkeypatch.setattr(tracking, "_run", None)
    cfg = train.TrainConfig(out_dir=str(tmp_path / "out-a"), wandb_log=True, wandb_project="p")
    model = torch.nn.Sequential(Attn([1.0, 3.0], None))
    tracking.wandb_log({"iter": 3, "loss": 2.0, "lr": 1e-3, "tokens_per_s": 100.0, "mfu": None, "eta_s": 5.0},
                       cfg, {"seed": 7}, model)
    tracking.wandb_log({"iter": 4, "train_loss": 2.1, "val_loss": 2.2, "elapsed": 9.0}, cfg, {"seed": 7}, model)
    stats = {"scorer/layer0/s_mean": 2.0, "scorer/layer0/s_min": 1.0, "scorer/layer0/s_max": 3.0}
    (run,) = runs
    assert run.logged == [(3, {"loss": 2.0, "lr": 1e-3, "tokens_per_s": 100.0, "eta_s": 5.0, **stats}),  # mfu None
                          (4, {"train_loss": 2.1, "val_loss": 2.2, "elapsed": 9.0})]  # an eval: no scorer stats
    assert run.kwargs["name"] == "out-a" and run.kwargs["dir"] == cfg.out_dir and run.kwargs["project"] == "p"
    assert run.kwargs["config"]["run_info"] == {"seed": 7} and run.kwargs["config"]["out_dir"] == cfg.out_dir
    tracking.finish(failed=True)
    assert run.exit_code == 1
    tracking.wandb_log({"iter": 0, "val_loss": 1.0}, cfg, {}, model)  # the next training: a new run
    assert len(runs) == 2 and runs[1].logged == [(0, {"val_loss": 1.0})]
    tracking.finish()
    assert runs[1].exit_code == 0 and tracking._run is None


def write_log(out_dir, *records):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "log.jsonl"), "w") as f:
        f.writelines(r if isinstance(r, str) else json.dumps(r) + "\n" for r in records)


def switched_run(out_dir):
    """A run switched from softmax to ssmax at iter 1, its step 1 logged again after the switch."""
    write_log(out_dir, {"config": {"scorer": "softmax"}, "start_iter": 0}, {"iter": 0, "loss": 5.0},
              {"iter": 1, "loss": 4.0}, {"iter": 0, "train_loss": 4.4, "val_loss": 4.5},
              {"config": {"scorer": "ssmax"}, "start_iter": 1, "switch": {"scorer": ["softmax", "ssmax"]}},
              {"iter": 1, "loss": 3.0}, {"iter": 2, "train_loss": 3.4, "val_loss": 3.5})


def test_read_run_labels_a_run_by_its_last_scorer_and_a_later_line_of_an_iter_wins(tmp_path):
    switched_run(tmp_path / "run")
    assert tracking.read_run(str(tmp_path / "run")) == ("run (ssmax)", {0: 5.0, 1: 3.0}, {0: 4.5, 2: 3.5})


def drawn(monkeypatch):
    """The figures savefig is asked to write, kept instead of drawn (an empty file in their place)."""
    from matplotlib.figure import Figure
    made = []
    monkeypatch.setattr(Figure, "savefig", lambda self, fname, **kw: made.append(self) or open(fname, "w").close())
    return made


def test_loss_png_draws_the_latest_line_of_each_iter_and_marks_the_switch(tmp_path, monkeypatch):
    made = drawn(monkeypatch)
    switched_run(tmp_path)
    tracking.plot_losses(str(tmp_path), "t")
    (ax,) = made[0].axes
    curves = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines}
    assert curves["train (per step)"] == ([0, 1], [5.0, 3.0])
    assert curves["train (eval)"] == ([0, 2], [4.4, 3.4]) and curves["val (eval)"] == ([0, 2], [4.5, 3.5])
    assert list(curves["scorer -> ssmax"][0]) == [1, 1]  # a vertical line at the switch's start_iter


def test_a_loss_png_cut_mid_draw_leaves_the_last_whole_one(tmp_path, monkeypatch):
    # a kill while it was drawn left a 0-byte loss.png that a finished run never redrew
    from matplotlib.figure import Figure
    switched_run(tmp_path)
    tracking.plot_losses(str(tmp_path), "t")
    whole = (tmp_path / "loss.png").read_bytes()
    def cut(self, fname, **kw):
        open(fname, "wb").close()
        raise KeyboardInterrupt
    monkeypatch.setattr(Figure, "savefig", cut)
    with pytest.raises(KeyboardInterrupt):
        tracking.plot_losses(str(tmp_path), "t")
    assert whole[:8] == b"\x89PNG\r\n\x1a\n" and (tmp_path / "loss.png").read_bytes() == whole
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]


def test_compare_averages_a_runs_steps_over_a_fiftieth_of_them(tmp_path, monkeypatch):
    made = drawn(monkeypatch)
    write_log(tmp_path / "long", *({"iter": i, "loss": float(i)} for i in range(120)), {"iter": 119, "val_loss": 7.0})
    figures.compare_runs([str(tmp_path / "long")], out=str(tmp_path / "c.PNG"))  # its case aside, a PNG
    train_line, val_line = made[0].axes[0].lines
    assert train_line.get_label() == "long: train (mean of 3)"  # ceil(120 / 50) steps a window
    assert list(train_line.get_xdata()) == list(range(2, 120))  # drawn at each window's last step
    assert list(train_line.get_ydata()) == pytest.approx(range(1, 119))  # the mean of k - 2, k - 1, k
    assert list(val_line.get_xdata()) == [119] and list(val_line.get_ydata()) == [7.0]


def test_compare_keeps_an_earlier_compare_png_unless_out_names_it(tmp_path, monkeypatch):
    made = drawn(monkeypatch)
    write_log(tmp_path / "run", {"iter": 0, "loss": 5.0}, {"iter": 0, "val_loss": 5.5})
    monkeypatch.chdir(tmp_path)
    assert train.main(["--compare", "run"]) == "compare.png" and len(made) == 1  # none there yet: the default
    (tmp_path / "compare.png").write_bytes(b"an earlier figure")
    with pytest.raises(SystemExit) as e:
        train.main(["--compare", "run"])
    assert str(e.value.code).startswith("error: ./compare.png holds an earlier comparison: name this one with --out")
    assert (tmp_path / "compare.png").read_bytes() == b"an earlier figure" and len(made) == 1
    train.main(["--compare", "run", "--out", "compare.png"])  # named: replaced, through a temporary
    assert (tmp_path / "compare.png").read_bytes() == b"" and len(made) == 2
    assert sorted(os.listdir(tmp_path)) == ["compare.png", "run"]


def test_a_json_line_that_is_no_object_is_left_out_and_named_only_when_warned(tmp_path, capsys):
    write_log(tmp_path, {"iter": 0, "loss": 5.0}, "5\n", "[1, 2]\n", "\n", {"iter": 1, "loss": 4.0})
    path = str(tmp_path / "log.jsonl")
    assert tracking.read_log(path) == [{"iter": 0, "loss": 5.0}, {"iter": 1, "loss": 4.0}]
    assert capsys.readouterr().err == ""
    assert tracking.read_log(path, warn=True) == [{"iter": 0, "loss": 5.0}, {"iter": 1, "loss": 4.0}]
    assert "line(s) 2, 3 are not JSON records" in capsys.readouterr().err


def test_an_oserror_is_its_path_and_reason_in_one_line():
    assert tracking.error_text(OSError(28, "No space left on device", "/runs/a/ckpt.pt")) == \
        "/runs/a/ckpt.pt: No space left on device"
    assert tracking.error_text(OSError(13, "Permission denied")) == "Permission denied"
    assert tracking.error_text(OSError("cannot write ckpt.pt: disk full")) == "cannot write ckpt.pt: disk full"
    assert tracking.error_text(tracking.TrackingError("no log.jsonl")) == "no log.jsonl"


def test_an_allocation_failure_is_one_line_naming_what_to_lower_and_any_other_error_is_raised_again():
    cuda = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB")
    assert tracking.memory_error(cuda, "--length") == "out of memory (tried to allocate 2.00 GiB): lower --length"
    numpy = MemoryError("Unable to allocate 3.07 GiB for an array with shape (16, 1024, 50304) and data type float32")
    assert tracking.memory_error(numpy, "--batch_size") == "out of memory (tried to allocate 3.07 GiB): lower " \
        "--batch_size"
    assert tracking.memory_error(MemoryError(), "--batch_size") == "out of memory: lower --batch_size"
    with pytest.raises(RuntimeError, match="shapes"):  # not every RuntimeError: a bug keeps its traceback
        tracking.memory_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied"), "--length")


def test_an_eval_saves_best_pt_only_when_best_and_logs_its_record_without_the_flag(tmp_path, capsys, monkeypatch):
    made = drawn(monkeypatch)
    cfg = cfg_of(tmp_path, scorer="ssmax", task="", sft_data="", dataset="rand", max_iters=2)
    model = types.SimpleNamespace(get_num_params=lambda: 2_500_000)
    saved = []
    for it, val, best in ((0, 4.5, True), (2, 4.7, False)):
        state = {"eval": {"iter": it, "train_loss": 4.0 + it, "val_loss": val, "elapsed": 1.0, "is_best": best}}
        got = tracking.record_eval(state, cfg, {"git_sha": "0123456789abc"}, model, lambda: saved.append(it), {})
        assert got == {"train": 4.0 + it, "val": val}
    assert saved == [0]  # a worse eval leaves best.pt as it was
    assert capsys.readouterr().out == "iter 0: train loss 4.0000, val loss 4.5000 (best)\n" \
                                      "iter 2: train loss 6.0000, val loss 4.7000\n"
    assert read_log(tmp_path) == [{"iter": 0, "train_loss": 4.0, "val_loss": 4.5, "elapsed": 1.0},
                                  {"iter": 2, "train_loss": 6.0, "val_loss": 4.7, "elapsed": 1.0}]
    assert len(made) == 1  # a run of seconds: loss.png once, at its last eval
    assert made[-1].axes[0].get_title() == "ssmax, rand, 2.5M params, git 0123456"
    assert tracking.eval_logged(str(tmp_path), 2) and not tracking.eval_logged(str(tmp_path), 1)


def test_a_step_record_of_an_iter_is_not_its_eval(tmp_path):
    write_log(tmp_path, {"iter": 0, "train_loss": 4.4, "val_loss": 4.5}, {"iter": 0, "loss": 5.0},
              {"iter": 1, "loss": 4.0})
    assert tracking.eval_logged(str(tmp_path), 0) and not tracking.eval_logged(str(tmp_path), 1)
    record = {"iter": 0, "train_loss": 4.4, "val_loss": 4.5, "is_best": True}  # a checkpoint's eval: that very line
    assert tracking.eval_logged(str(tmp_path), 0, record)
    assert not tracking.eval_logged(str(tmp_path), 0, {**record, "val_loss": 4.6})  # another scorer's eval of iter 0


def test_announce_counts_iterations_per_epoch_in_sequences_and_warns_of_data_without_meta_json(tmp_path, capsys):
    cfg = train.TrainConfig(block_size=16)
    model, run = types.SimpleNamespace(get_num_params=lambda: 2_500_000), types.SimpleNamespace(world=1, device="cpu")
    examples = list(range(10))
    data = types.SimpleNamespace(sft=(examples, examples[:2]), unigram=5.12341, dir=str(tmp_path))
    tracking.announce(cfg, model, run, 64, data)  # 64 tokens = 4 sequences of 16 an iteration: 10 / 4
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == ("2.50M parameters, 1 process(es), 64 tokens per iteration, device cpu; unigram "
                                    "entropy of train 5.1234 nats; 2.5 iterations per epoch; SFT examples: 10 to train"
                                    ", 2 held out for val; losses in nats summed over each example's answer, not per "
                                    "token")  # an SFT val loss of 52.55 read as per-token nats was 10.8 a token
    assert err == f"warning: {tmp_path} has no meta.json: its ids are taken as GPT-2's (a character dataset needs " \
                  f"the meta.json that prepare_data.py writes)\n"
    (tmp_path / "meta.json").write_text("{}")
    tracking.announce(cfg, model, run, 64, types.SimpleNamespace(sft=(examples, examples), unigram=None, dir=tmp_path))
    out, err = capsys.readouterr()
    assert out.splitlines()[-1].endswith("device cpu; 2.5 iterations per epoch; SFT examples: 10 to train, val: the "
                                         "same (sft_val_frac=0); losses in nats summed over each example's answer, "
                                         "not per token") and err == ""
