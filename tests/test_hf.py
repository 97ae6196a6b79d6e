"""Pretrained models in and out (issue #46): tiny random Llama models that transformers builds from a config (no
download) imported with convert_hf.py (GQA, RMSNorm eps 1e-5, tied and untied embeddings, shards, head_dim null:
logits and greedy generation as transformers'), exported back with the source's BOS, an imported model's tokenizer as
a codec (text round trip, sample.py --ckpt alone, data prepared with it, uint32 ids past 65,535), a scorer swap that
trains and resumes exactly, each bad input as one error line. Scorer models run by transformers through hf_scorers.py
(per-head parameters, left padding, dynamic and static caches) as nanoscorer runs them, the exports it refuses,
GPT-2's tokenizer files, and eval_harness.py on a local lm-eval task. Skipped without requirements-hf.txt."""
import json
import os
import shutil

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import AttentionInterface, AutoTokenizer, LlamaConfig, LlamaForCausalLM, StaticCache  # noqa: E402

import convert_hf  # noqa: E402
import hf_scorers  # noqa: E402
import sample  # noqa: E402
import train  # noqa: E402
from conftest import one_line_error  # noqa: E402
from lib import dataset, hf as lib_hf, vocab  # noqa: E402
from lib.checkpoint import build_model, load_checkpoint, save_checkpoint  # noqa: E402
from model import GPTConfig, param_name  # noqa: E402

TEXT = "To be, or not to be: that is the question. Whether 'tis nobler in the mind to suffer\n" * 60
V = 320  # the model's vocabulary: the tokenizer's 300 ids, padded


def tokenizer_json(path, vocab_size=300):
    """A byte-level BPE trained on TEXT, <|endoftext|> its id 0 and <s> 1, saved as tokenizer.json."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(path))
    return str(path)


def llama(folder, tie, shard="5GB", **kw):
    """A random tiny Llama (4 query heads, 2 KV heads, eps 1e-5) saved by transformers, its tokenizer's BOS <s> (1)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(**{**dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                                tie_word_embeddings=tie, max_position_embeddings=64, eos_token_id=0), **kw})
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(folder, max_shard_size=shard)
    tokenizer_json(os.path.join(folder, "tokenizer.json"))
    json.dump({"bos_token": {"__type": "AddedToken", "content": "<s>"}}, open(f"{folder}/tokenizer_config.json", "w"))
    return model


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """{tie: (the transformers model, the imported checkpoint's path)}."""
    root, out = tmp_path_factory.mktemp("hf"), {}
    for tie in (False, True):
        src = root / f"hf-{tie}"
        hf = llama(str(src), tie, "100KB" if tie else "5GB")  # tied: in shards
        if tie:  # head_dim null (transformers: hidden / heads), and a copy in another format beside the shards
            json.dump({**json.load(open(src / "config.json")), "head_dim": None}, open(src / "config.json", "w"))
            save_file({"layers.0.attention.wq.weight": torch.zeros(64, 64)}, str(src / "consolidated.safetensors"))
        convert_hf.main(["import", str(src), "--out", str(root / f"run-{tie}")])
        out[tie] = hf, str(root / f"run-{tie}" / "ckpt.pt")
    return out


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_an_imported_llama_gives_transformers_logits_and_greedy_tokens(imported, tie):
    hf, path = imported[tie]
    model, ckpt = load_checkpoint(path)
    assert ckpt["model_args"]["n_kv_head"] == 2 and ckpt["model_args"]["norm_eps"] == 1e-5
    assert ckpt["model_args"]["tie_embeddings"] == tie and (model.lm_head.weight is model.transformer.wte.weight) == tie
    x = torch.randint(0, V, (2, 40))
    with torch.no_grad():
        assert (model.eval()(x, x)[0] - hf(x).logits).abs().max() < 1e-5
    want = hf.generate(x[:1, :5], max_new_tokens=12, do_sample=False)
    assert torch.equal(model.generate(x[:1, :5], 12, temperature=0), want)  # with the KV cache
    if tie:  # the shards the index names are read, not the copy beside them
        assert "layers.0.attention.wq.weight" not in lib_hf.read_weights(ckpt["hf"]["source"])


def test_an_exported_model_loads_as_a_plain_llama_with_the_sources_bos_left_padded_batch_included(imported, tmp_path):
    hf, path = imported[False]
    model, _ = load_checkpoint(path)
    convert_hf.main(["export", path, "--out", str(tmp_path / "out")])
    assert sorted(os.listdir(tmp_path / "out")) == ["config.json", "model.safetensors", "tokenizer.json",
                                                    "tokenizer_config.json"]
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert tok.eos_token_id == 0 and tok.decode(tok("Whether 'tis")["input_ids"]) == "Whether 'tis"
    back = LlamaForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    assert tok.bos_token_id == 1 and back.config.bos_token_id == hf.config.bos_token_id  # the source's, kept
    x = torch.randint(0, V, (2, 12))
    mask = torch.ones_like(x)
    mask[1, :4] = 0  # the second row left-padded by 4
    with torch.no_grad():
        got = back(x, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        assert (got[0] - model.eval()(x[:1], x[:1])[0][0]).abs().max() < 1e-5
        assert (got[1, 4:] - model(x[1:, 4:], x[1:, 4:])[0][0]).abs().max() < 1e-5


def test_the_imported_tokenizer_is_the_checkpoints_codec(imported, capsys):
    _, path = imported[False]
    codec = torch.load(path, weights_only=True)["codec"]
    assert codec["kind"] == "hf" and codec["eot"] == 0 and codec["n_vocab"] == 300
    enc = vocab.from_record(codec)
    assert enc.decode(enc.encode_ordinary("Whether 'tis nobler")) == "Whether 'tis nobler"
    sample.main(["--ckpt", path, "--start", "To be", "--max_new_tokens", "5", "--num_samples", "1"])
    assert capsys.readouterr().out.startswith("To be")  # --ckpt alone: no dataset, no GPT-2


def test_data_prepared_with_the_models_tokenizer_trains_a_scorer_swap_that_resumes_exactly(imported, tmp_path):
    _, path = imported[False]
    (tmp_path / "play.txt").write_text(TEXT)
    dataset.prepare(str(tmp_path / "play.txt"), out_dir=str(tmp_path / "data"), tokenizer=path)
    meta = json.load(open(tmp_path / "data" / "play" / "meta.json"))
    assert meta["tokenizer"] == "hf" and meta["dtype"] == "uint16" and meta["eot_token"] == 0
    common = ["device=cpu", f"data_dir={tmp_path / 'data'}", "dataset=play", f"init_from={path}", "scorer=ssmax",
              "block_size=32", "batch_size=2", "gradient_accumulation_steps=1", "eval_iters=1", "log_interval=1",
              "warmup_iters=1", "eval_interval=2"]
    train.main([*common, "max_iters=4", f"out_dir={tmp_path / 'whole'}"])  # variant (e)'s swap, fine-tuned
    train.main([*common, "max_iters=2", f"out_dir={tmp_path / 'cut'}"])
    train.main([*common, "max_iters=4", f"out_dir={tmp_path / 'cut'}", "resume=True"])
    losses = lambda d: [r["loss"] for r in map(json.loads, open(tmp_path / d / "log.jsonl")) if "loss" in r]
    assert losses("cut") == losses("whole") and len(losses("whole")) == 4
    ckpt = torch.load(tmp_path / "whole" / "ckpt.pt", weights_only=True)
    assert ckpt["model_args"]["scorer"] == "ssmax" and ckpt["model_args"]["n_kv_head"] == 2
    assert ckpt["codec"]["sha256"] == torch.load(path, weights_only=True)["codec"]["sha256"]
    shutil.copytree(os.path.dirname(path), tmp_path / "imported")  # an import holds no optimizer state
    msg = one_line_error(train.main, [*common[:3], f"out_dir={tmp_path / 'imported'}", "resume=True"])
    assert "holds no optimizer or rng or data_state state" in msg


def test_ids_past_65535_are_written_as_uint32_and_read_back(tmp_path):
    big = {f"w{i}": i for i in range(70_000)}  # a word-level vocabulary of 70,000 ids
    tok = Tokenizer(models.WordLevel(big, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 69_999}))
    (tmp_path / "t.txt").write_text(" ".join(f"w{i}" for i in range(65_530, 65_560)) + "\n")
    dataset.prepare(str(tmp_path / "t.txt"), out_dir=str(tmp_path / "data"), tokenizer=str(tmp_path), val_frac=0.5)
    d = str(tmp_path / "data" / "t")
    assert dataset.dtype_of(d) == np.uint32 and dataset.check_prepared(d) is None
    ids = np.concatenate([dataset.load_split(d, s) for s in dataset.SPLITS]).tolist()
    assert ids == list(range(65_530, 65_545)) + [69_999] + list(range(65_545, 65_560)) + [69_999]


def test_bad_inputs_are_one_error_line(imported, tmp_path):
    refused = lambda d: one_line_error(convert_hf.main, ["import", str(tmp_path / d), "--out", str(tmp_path / "o")])
    llama(str(tmp_path / "biased"), False, attention_bias=True)
    assert "unsupported architecture: attention_bias=true" in refused("biased")
    cfg = json.load(open(tmp_path / "biased" / "config.json"))
    json.dump({**cfg, "model_type": "gpt2"}, open(tmp_path / "biased" / "config.json", "w"))
    assert "model_type 'gpt2' (supported: llama, mistral)" in refused("biased")
    linear = "unsupported architecture: rope_type 'linear' (only the default)"
    for extra, words in (({"rope_parameters": None, "rope_scaling": {"type": "linear", "factor": 4.0}}, linear),
                         ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, linear),  # beside rope_parameters
                         ({"nanoscorer": {"scorer": "ssmax"}}, "a nanoscorer export of scorer 'ssmax'")):  # not softmax
        json.dump({**cfg, "attention_bias": False, **extra}, open(tmp_path / "biased" / "config.json", "w"))
        assert words in refused("biased")
    os.remove(tmp_path / "biased" / "config.json")
    assert "has no config.json" in refused("biased")
    llama(str(tmp_path / "small"), False, vocab_size=200)  # a tokenizer of 300 ids over 200 embeddings
    assert "its tokenizer has 300 ids, more than the model's 200" in refused("small")
    assert "neither a Hugging Face folder" in one_line_error(convert_hf.main, ["import", "no/such/x", "--out", "o"])
    _, path = imported[False]
    (tmp_path / "p.txt").write_text(TEXT)
    dataset.prepare(str(tmp_path / "p.txt"), name="gpt2data", out_dir=str(tmp_path))  # in GPT-2's ids: refused
    msg = one_line_error(train.main, ["device=cpu", f"data_dir={tmp_path}", "dataset=gpt2data", f"init_from={path}",
                                      "max_iters=1", f"out_dir={tmp_path / 'r'}", "block_size=32"])
    assert "another vocabulary" in msg or "does not match" in msg, msg


# ----------------------------------------------------------------------------------------------------------------
# Export of scorer models (hf_scorers.py), GPT-2's tokenizer, lm-eval

def nanoscorer_ckpt(path, codec=None, task="", **args):
    """A tiny random GPT (4 query heads, 2 KV heads) of a task, saved; scorer parameters differ per layer and head."""
    torch.manual_seed(0)
    model = build_model(GPTConfig(**{**dict(vocab_size=V, n_layer=2, n_head=4, n_kv_head=2, n_embd=64, ffn_hidden=96,
                                            block_size=64), **args}), task).eval()
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(5)  # peaked rows: the scorers differ
            for prm in block.attn.params:  # raw values: s, b, ssa's b and n in 0.3..1.1
                getattr(block.attn, param_name(model.config.scorer, prm)).copy_(torch.rand(4) * 0.8 + 0.3)
    save_checkpoint({"model": model.state_dict(), "model_args": vars(model.config), "config": {"task": task},
                     "iter_num": 0, "codec": codec}, str(path))
    return model, str(path)


EXPORTED = [(name, {}) for name in hf_scorers.RUNS if name != "softmax"] + [("ssmax", dict(ssmax_bias=True))]


@pytest.mark.parametrize("scorer,extra", EXPORTED, ids=[n + "_bias" * bool(x) for n, x in EXPORTED])
def test_a_scorer_model_runs_in_transformers_as_in_nanoscorer_left_padded_batch_included(tmp_path, scorer, extra,
                                                                                         monkeypatch):
    model, path = nanoscorer_ckpt(tmp_path / "ckpt.pt", scorer=scorer, **extra)
    convert_hf.main(["export", path, "--out", str(tmp_path / "hf")])
    cfg = json.load(open(tmp_path / "hf" / "config.json"))
    want = [block.attn.scorer_params() for block in model.transformer.h]
    assert cfg["attn_implementation"] == hf_scorers.NAME and cfg["nanoscorer"]["scorer"] == scorer
    assert cfg["nanoscorer"]["params"] == {k: [x[k].tolist() for x in want] for k in want[0]}  # per layer and head
    back = LlamaForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()  # config.json names the attention
    x = torch.randint(1, V, (2, 20))
    mask = torch.ones_like(x)
    mask[1, :5] = 0  # the second row left-padded by 5
    with torch.no_grad():
        ours = [model(x[:1], x[:1])[0][0], model(x[1:, 5:], x[1:, 5:])[0][0]]
        for pos in ((mask.cumsum(-1) - 1).clamp(min=0), None):  # n_i from the mask: with or without position_ids
            got = back(x, attention_mask=mask, position_ids=pos).logits
            assert max((got[0] - ours[0]).abs().max(), (got[1, 5:] - ours[1]).abs().max()) < 1e-5
        softmax = LlamaForCausalLM.from_pretrained(str(tmp_path / "hf"), attn_implementation="sdpa").eval()
        assert (softmax(x[:1]).logits[0] - ours[0]).abs().max() > 1e-2  # the scorer ran, not softmax
        got = back.generate(x, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
        assert torch.equal(got[0], model.generate(x[:1], 6, temperature=0)[0])  # each row as it alone
        assert torch.equal(got[1, 5:], model.generate(x[1:, 5:], 6, temperature=0)[0])
        for cache in ("dynamic", "static"):  # a prefill into an empty static cache comes with no mask
            got = back.generate(x[:1, 12:], max_new_tokens=6, do_sample=False, cache_implementation=cache)
            assert torch.equal(got, model.generate(x[:1, 12:], 6, temperature=0))  # with the KV cache
        static = StaticCache(config=back.config, max_cache_len=32)
        assert (back(x[:1], past_key_values=static).logits[0] - ours[0]).abs().max() < 1e-5
    if scorer == "ssmax" and not extra:  # without hf_scorers' registration: refused, never softmax in its place
        monkeypatch.delitem(AttentionInterface._global_mapping, hf_scorers.NAME)
        with pytest.raises(ValueError, match="not supported"):
            LlamaForCausalLM.from_pretrained(str(tmp_path / "hf"))


def test_models_transformers_cannot_run_refuse_export_in_one_line(tmp_path):
    char = vocab.record(vocab.CharCodec(list("ab") + ["<|endoftext|>"]))
    cases = [(dict(scorer="fox", pos="nope"), None, "pos 'nope' (LlamaAttention always rotates q and k); "
                                                    "scorer 'fox' (its forget gate"),
             (dict(scorer="stickbreaking"), None, "scorer 'stickbreaking' (no row template"),
             (dict(scorer="lssar"), None, "re-weighting (p=15.0"),
             (dict(scorer="ssmax", reweight_p=4.0), None, "re-weighting (p=4.0"),
             (dict(vocab_size=3), char, "a character vocabulary (transformers has no tokenizer for it)"),
             (dict(vocab_size=1, task="linear"), None, "task 'linear' (real-valued inputs: its wte is a Linear of 3")]
    for i, (args, codec, why) in enumerate(cases):
        _, path = nanoscorer_ckpt(tmp_path / f"{i}.pt", codec, **args)
        msg = one_line_error(convert_hf.main, ["export", path, "--out", str(tmp_path / f"hf{i}")])
        assert msg.startswith(f"error: {path} cannot be exported: {why}"), msg
        assert not os.path.exists(tmp_path / f"hf{i}")
    _, path = nanoscorer_ckpt(tmp_path / "ok.pt")
    convert_hf.main(["export", path, "--out", str(tmp_path / "hf")])
    assert "already holds model.safetensors, config.json" in one_line_error(
        convert_hf.main, ["export", path, "--out", str(tmp_path / "hf")])


@pytest.fixture(scope="module")
def gpt2_ssmax(tmp_path_factory):
    """A GPT-2-vocabulary ssmax checkpoint (its codec GPT-2's) and the folder it exports to."""
    root = tmp_path_factory.mktemp("gpt2")
    model, path = nanoscorer_ckpt(root / "ckpt.pt", vocab.record(None), vocab_size=50304, n_embd=32, scorer="ssmax",
                                  ssmax_bias=True)
    convert_hf.main(["export", path, "--out", str(root / "hf")])
    return model, path, str(root / "hf")


def test_a_gpt2_vocabulary_model_exports_gpt2s_tokenizer(gpt2_ssmax):
    _, _, folder = gpt2_ssmax
    assert {"vocab.json", "merges.txt", "tokenizer_config.json"} <= set(os.listdir(folder))
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok("Hello world")["input_ids"] == [15496, 995] and tok.eos_token_id == vocab.EOT
    text = TEXT[:400] + " naïve café, 2024  ok\n\n"
    assert tok(text)["input_ids"] == vocab.get_tokenizer().encode_ordinary(text)
    assert json.load(open(os.path.join(folder, "config.json")))["eos_token_id"] == vocab.EOT


def test_eval_harness_runs_a_local_lm_eval_task_offline(gpt2_ssmax, tmp_path):
    pytest.importorskip("lm_eval")
    pytest.importorskip("accelerate")
    import eval_harness
    model, path, _ = gpt2_ssmax
    docs = [("To be, or not to", " be"), ("Whether 'tis nobler in the mind to", " suffer"), ("That is", " the")]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"context": c, "target": t}) + "\n" for c, t in docs))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "cloze.yaml").write_text(
        f"task: tiny_cloze\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tmp_path / 'docs.jsonl'}\n"
        "test_split: test\noutput_type: loglikelihood\ndoc_to_text: '{{context}}'\ndoc_to_target: '{{target}}'\n"
        "metric_list:\n  - metric: perplexity\n    aggregation: perplexity\n    higher_is_better: false\n")
    argv = [path, "--tasks", "tiny_cloze", "--include_path", str(tmp_path / "tasks"), "--device", "cpu",
            "--out_dir", str(tmp_path / "out"), "--bootstrap_iters", "0"]
    eval_harness.main(argv)
    assert sorted(os.listdir(tmp_path / "out")) == ["results.json", "results.md"]
    got = json.load(open(tmp_path / "out" / "results.json"))
    enc, ll = vocab.get_tokenizer(), []
    with torch.no_grad():  # the same log-likelihoods from nanoscorer's own model
        for c, t in docs:
            ids = torch.tensor([enc.encode_ordinary(c + t)])
            n = len(enc.encode_ordinary(c))
            logp = model(ids[:, :-1], ids[:, 1:])[0].log_softmax(-1)[0, n - 1:]
            ll.append(logp.gather(-1, ids[0, n:, None]).sum().item())
    assert got["results"]["tiny_cloze"]["perplexity,none"] == pytest.approx(np.exp(-np.mean(ll)), rel=1e-5)
    assert got["model_args"]["scorer"] == "ssmax" and got["settings"]["tasks"] == ["tiny_cloze"]
    assert "earlier run" in one_line_error(eval_harness.main, argv)
    assert "lm-eval has no task 'nosuch'" in one_line_error(eval_harness.main, [path, "--tasks", "nosuch",
                                                                               "--out_dir", str(tmp_path / "o2")])
