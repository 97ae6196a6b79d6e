"""Pretrained models in and out (issue #46): tiny random Llama models that transformers builds from a config (no
download) imported with convert_hf.py (GQA, RMSNorm eps 1e-5, tied and untied embeddings, shards, head_dim null,
Llama 3's and linear RoPE scaling: logits and greedy generation as transformers'), exported back with the source's
BOS, an imported model's tokenizer as a codec (text round trip, sample.py --ckpt alone, data prepared with it, uint32
ids past 65,535), a scorer swap that trains and resumes exactly, each bad input as one error line. Scorer models:
tests/test_hf_scorers.py. Skipped without requirements-hf.txt."""
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
from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM,  # noqa: E402
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

import convert_hf  # noqa: E402
import rope  # noqa: E402
import sample  # noqa: E402
import train  # noqa: E402
from conftest import one_line_error  # noqa: E402
from lib import dataset, folders, hf as lib_hf, meta as lib_meta, vocab  # noqa: E402
from lib.checkpoint import load_checkpoint, read_checkpoint  # noqa: E402
from lib.config import TrainConfig, TrainError, model_config  # noqa: E402

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
        if tie:  # head_dim null (transformers: hidden / heads), a copy in another format and a stale single file
            json.dump({**json.load(open(src / "config.json")), "head_dim": None}, open(src / "config.json", "w"))
            save_file({"layers.0.attention.wq.weight": torch.zeros(64, 64)}, str(src / "consolidated.safetensors"))
            save_file({"model.norm.weight": torch.zeros(64)}, str(src / "model.safetensors"))  # beside the shards
        convert_hf.main(["import", str(src), "--out", str(root / f"run-{tie}")])
        out[tie] = hf, str(root / f"run-{tie}" / "ckpt.pt")
    return out


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_an_imported_llama_gives_transformers_logits_and_greedy_tokens(imported, tie):
    hf, path = imported[tie]
    model, ckpt = load_checkpoint(path)
    assert ckpt["model_args"]["n_kv_head"] == 2 and ckpt["model_args"]["norm_eps"] == 1e-5
    assert ckpt["model_args"]["block_size"] == 64  # the source's max_position_embeddings
    assert ckpt["model_args"]["tie_embeddings"] == tie and (model.lm_head.weight is model.transformer.wte.weight) == tie
    x = torch.randint(0, V, (2, 40))
    with torch.no_grad():
        assert (model.eval()(x, x)[0] - hf(x).logits).abs().max() < 1e-5
    want = hf.generate(x[:1, :5], max_new_tokens=12, do_sample=False)
    assert torch.equal(model.generate(x[:1, :5], 12, temperature=0), want)  # with the KV cache
    if tie:  # the shards the index names are read, not the copies beside them
        w = lib_hf.read_weights(ckpt["hf"]["source"])
        assert "layers.0.attention.wq.weight" not in w and torch.equal(w["model.norm.weight"], hf.model.norm.weight)


def imports_and_exports_back(hf, tmp_path):
    """tmp_path/src (hf, saved) imported: transformers' logits and greedy tokens; exported back: hf's class, its
    logits. The import's model and checkpoint."""
    convert_hf.main(["import", str(tmp_path / "src"), "--out", str(tmp_path / "run")])
    model, ckpt = load_checkpoint(str(tmp_path / "run" / "ckpt.pt"))
    x = torch.randint(0, V, (2, 40))
    with torch.no_grad():
        assert (model.eval()(x, x)[0] - hf(x).logits).abs().max() < 1e-5
        assert torch.equal(model.generate(x[:1, :5], 12, temperature=0),
                           hf.generate(x[:1, :5], max_new_tokens=12, do_sample=False))
        convert_hf.main(["export", str(tmp_path / "run" / "ckpt.pt"), "--out", str(tmp_path / "hf")])
        back = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
        assert type(back) is type(hf) and (back(x).logits - hf(x).logits).abs().max() < 1e-5
    return model, ckpt


def test_a_qwen2_with_its_q_k_v_biases_imports_and_exports_with_transformers_logits(tmp_path):
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    hf = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # biases that matter (transformers starts them at 0)
        for name, t in hf.named_parameters():
            if name.endswith("bias"):
                t.add_(torch.randn_like(t) * 0.5)
    hf.save_pretrained(str(tmp_path / "src"))
    src = json.load(open(tmp_path / "src" / "config.json"))  # as Qwen2.5's: a window named, and turned off
    json.dump({**src, "sliding_window": 32768, "use_sliding_window": False},
              open(tmp_path / "src" / "config.json", "w"))
    model, ckpt = imports_and_exports_back(hf, tmp_path)
    assert ckpt["model_args"]["qkv_bias"] and model.transformer.h[0].attn.c_attn.bias.abs().min() > 0
    ckpt = read_checkpoint(str(tmp_path / "run" / "ckpt.pt"))  # a fine-tune without the biases would drop them
    cfg = TrainConfig(**{**ckpt["model_args"], "qkv_bias": False})
    with pytest.raises(TrainError, match="qkv_bias=False differs from the checkpoint's True: it cannot change"):
        model_config(cfg, {"qkv_bias": False}, ckpt, resuming=False)
    json.dump({**src, "sliding_window": 16, "use_sliding_window": True}, open(tmp_path / "src" / "config.json", "w"))
    assert "sliding_window 16" in one_line_error(convert_hf.main, ["import", str(tmp_path / "src"), "--out",
                                                                   str(tmp_path / "r2")])


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_a_qwen3_and_a_llama_with_their_own_head_dim_import_and_export_with_transformers_logits(tmp_path, family):
    torch.manual_seed(0)  # head_dim 32 at width 64, 4 heads: q is 128 wide, as Qwen3's 128 at any width
    kw = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, max_position_embeddings=64, tie_word_embeddings=True)
    hf = (Qwen3ForCausalLM(Qwen3Config(**kw)) if family == "qwen3" else LlamaForCausalLM(LlamaConfig(**kw))).eval()
    with torch.no_grad():  # q, k norms that matter (transformers starts them at 1)
        for name, t in hf.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                t.uniform_(0.5, 1.5)
    hf.save_pretrained(str(tmp_path / "src"))
    _, ckpt = imports_and_exports_back(hf, tmp_path)
    assert ckpt["model_args"]["head_dim"] == 32 and ckpt["model_args"]["qk_norm"] == (family == "qwen3")
    ckpt = read_checkpoint(str(tmp_path / "run" / "ckpt.pt"))  # a fine-tune cannot drop the norms or resize heads
    for field, value in (("qk_norm", family != "qwen3"), ("head_dim", None)):
        with pytest.raises(TrainError, match=f"{field}={value} differs from the checkpoint's"):
            model_config(TrainConfig(**{**ckpt["model_args"], field: value}), {field: value}, ckpt, resuming=False)


# Llama 3's frequency scaling, its three bands met at head_dim 16, θ 500, 64 original positions: 2 kept, 1 blended
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


@pytest.mark.parametrize("scaling", [LLAMA3, {"rope_type": "linear", "factor": 4.0}], ids=["llama3", "linear"])
def test_a_llama_with_rope_scaling_imports_and_exports_with_transformers_frequencies_and_logits(tmp_path, scaling):
    hf = llama(str(tmp_path / "src"), False, rope_parameters={**scaling, "rope_theta": 500.0})
    convert_hf.main(["import", str(tmp_path / "src"), "--out", str(tmp_path / "run")])
    model, ckpt = load_checkpoint(str(tmp_path / "run" / "ckpt.pt"))
    assert ckpt["model_args"]["rope_scaling"] == scaling and ckpt["model_args"]["rope_theta"] == 500.0
    torch.testing.assert_close(model.rope_inv_freq.float(), hf.model.rotary_emb.inv_freq, rtol=1e-6, atol=0)
    assert not torch.allclose(model.rope_inv_freq, rope.rope_inv_freq(16, 500.0))  # the scaling took effect
    x = torch.randint(0, V, (2, 60))
    with torch.no_grad():
        assert (model.eval()(x, x)[0] - hf(x).logits).abs().max() < 1e-5
        convert_hf.main(["export", str(tmp_path / "run" / "ckpt.pt"), "--out", str(tmp_path / "hf")])
        back = LlamaForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
        assert (back(x).logits - hf(x).logits).abs().max() < 1e-5
    assert json.load(open(tmp_path / "hf" / "config.json"))["rope_scaling"] == scaling  # transformers 4 reads only it
    (tmp_path / "play.txt").write_text(TEXT)  # a fine-tune keeps the scaling
    dataset.prepare(str(tmp_path / "play.txt"), out_dir=str(tmp_path / "data"), tokenizer=str(tmp_path / "run/ckpt.pt"))
    train.main(["device=cpu", f"data_dir={tmp_path / 'data'}", "dataset=play", f"init_from={tmp_path / 'run/ckpt.pt'}",
                "block_size=32", "batch_size=2", "gradient_accumulation_steps=1", "eval_iters=1", "max_iters=1",
                f"out_dir={tmp_path / 'tuned'}"])
    assert torch.load(tmp_path / "tuned" / "ckpt.pt", weights_only=True)["model_args"]["rope_scaling"] == scaling


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
    assert back.config.max_position_embeddings == tok.model_max_length == 64  # the training length N
    x = torch.randint(0, V, (2, 12))
    mask = torch.ones_like(x)
    mask[1, :4] = 0  # the second row left-padded by 4
    with torch.no_grad():
        got = back(x, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        assert (got[0] - model.eval()(x[:1], x[:1])[0][0]).abs().max() < 1e-5
        assert (got[1, 4:] - model(x[1:, 4:], x[1:, 4:])[0][0]).abs().max() < 1e-5


@pytest.mark.parametrize("where", ["tokenizer_config.json", "chat_template.jinja"])  # transformers 4's, 5's
def test_an_export_keeps_the_sources_end_of_text_ids_and_chat_template(tmp_path, where):
    # Llama 3 Instruct's eos list (<|eot_id|> among them) and chat template were dropped: generation ran on past a turn
    llama(str(tmp_path / "src"), False, eos_token_id=[0, 1])
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    json.dump({"bos_token": "<s>", **({"chat_template": template} if where == "tokenizer_config.json" else {})},
              open(tmp_path / "src" / "tokenizer_config.json", "w"))
    if where == "chat_template.jinja":
        (tmp_path / "src" / where).write_text(template)
    convert_hf.main(["import", str(tmp_path / "src"), "--out", str(tmp_path / "run")])
    convert_hf.main(["export", str(tmp_path / "run" / "ckpt.pt"), "--out", str(tmp_path / "out")])
    assert json.load(open(tmp_path / "out" / "config.json"))["eos_token_id"] == [0, 1]
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "user: hi\n"


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
    assert lib_meta.id_dtype(lib_meta.read_meta(d)) == np.uint32 and dataset.check_prepared(d) is None
    ids = np.concatenate([dataset.load_split(d, s) for s in dataset.SPLITS]).tolist()
    assert ids == list(range(65_530, 65_545)) + [69_999] + list(range(65_545, 65_560)) + [69_999]


def test_bad_inputs_are_one_error_line(imported, tmp_path):
    refused = lambda d: one_line_error(convert_hf.main, ["import", str(tmp_path / d), "--out", str(tmp_path / "o")])
    llama(str(tmp_path / "biased"), False, attention_bias=True)
    assert "unsupported architecture: attention_bias=true" in refused("biased")
    cfg = json.load(open(tmp_path / "biased" / "config.json"))
    json.dump({**cfg, "model_type": "gpt2"}, open(tmp_path / "biased" / "config.json", "w"))
    assert "model_type 'gpt2' (supported: llama, mistral, qwen2, qwen3)" in refused("biased")
    dynamic = "unsupported architecture: rope_type 'dynamic' (supported: default, linear, llama3)"
    for extra, words in (({"rope_parameters": None, "rope_scaling": {"type": "dynamic", "factor": 4.0}}, dynamic),
                         ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, "beside rope_parameters"),
                         ({"rope_parameters": {**LLAMA3, "high_freq_factor": 0.5}}, "high_freq_factor > low_freq")):
        json.dump({**cfg, "attention_bias": False, **extra}, open(tmp_path / "biased" / "config.json", "w"))
        assert words in refused("biased")
    os.remove(tmp_path / "biased" / "config.json")
    assert "has no config.json" in refused("biased")
    llama(str(tmp_path / "odd"), False)  # config.json against the weights, a head layout GPTConfig refuses
    cfg = json.load(open(tmp_path / "odd" / "config.json"))
    json.dump({**cfg, "intermediate_size": 100}, open(tmp_path / "odd" / "config.json", "w"))
    assert "the weights and config.json disagree: transformer.h.0.mlp." in refused("odd")  # was load_state_dict's
    json.dump({**cfg, "tie_word_embeddings": True}, open(tmp_path / "odd" / "config.json", "w"))  # its own lm_head
    assert "ties the embeddings (tie_word_embeddings) but the weights hold another lm_head.weight" in refused("odd")
    json.dump({**cfg, "head_dim": 15}, open(tmp_path / "odd" / "config.json", "w"))
    assert refused("odd").startswith("error: config.json: head_dim=15 must be even")  # not "its nanoscorer block"
    llama(str(tmp_path / "small"), False, vocab_size=200)  # a tokenizer of 300 ids over 200 embeddings
    assert "its tokenizer has 300 ids, more than the model's 200" in refused("small")
    llama(str(tmp_path / "fits"), False, vocab_size=300)  # a tokenizer of exactly the model's ids imports, once
    convert_hf.main(["import", str(tmp_path / "fits"), "--out", str(tmp_path / "o")])
    assert "already holds a ckpt.pt" in refused("fits")
    with folders.held(str(tmp_path / "busy")):  # another import writing there: refused, not both written
        assert "is in use" in one_line_error(convert_hf.main, ["import", str(tmp_path / "fits"), "--out",
                                                               str(tmp_path / "busy")])
    for name in ("no/such/x", "/no_such", "./no_such"):  # a missing path, not a hub name to download
        assert "neither a Hugging Face folder" in one_line_error(convert_hf.main, ["import", name, "--out", "o"])
    _, path = imported[False]
    (tmp_path / "p.txt").write_text(TEXT)
    dataset.prepare(str(tmp_path / "p.txt"), name="gpt2data", out_dir=str(tmp_path))  # in GPT-2's ids: refused
    msg = one_line_error(train.main, ["device=cpu", f"data_dir={tmp_path}", "dataset=gpt2data", f"init_from={path}",
                                      "max_iters=1", f"out_dir={tmp_path / 'r'}", "block_size=32"])
    assert "another vocabulary" in msg or "does not match" in msg, msg
