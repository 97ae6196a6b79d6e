"""Scorer models out to transformers and back (issue #46): an export with a scorer other than softmax runs in
transformers through hf_scorers.py (per-head parameters, left padding, dynamic and static caches) as nanoscorer runs
it, and imports back with its scorer, options and parameters (an older export without options too); the exports and
imports refused in one line, GPT-2's tokenizer files, and eval_harness.py on a local lm-eval task. Skipped without
requirements-hf.txt."""
import dataclasses
import json
import os

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer, StaticCache  # noqa: E402

import convert_hf  # noqa: E402
import hf_scorers  # noqa: E402
from conftest import one_line_error  # noqa: E402
from lib import vocab  # noqa: E402
from lib.checkpoint import build_model, load_checkpoint, save_checkpoint  # noqa: E402
from model import GPTConfig, param_name  # noqa: E402
from test_hf import TEXT, V  # noqa: E402


def nanoscorer_ckpt(path, codec=None, task="", **args):
    """A tiny random GPT (4 query heads, 2 KV heads) of a task, saved; scorer parameters differ per layer and head."""
    torch.manual_seed(0)
    model = build_model(GPTConfig(**{**dict(vocab_size=V, n_layer=2, n_head=4, n_kv_head=2, n_embd=64, ffn_hidden=96,
                                            block_size=64), **args}), task).eval()
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(5)  # peaked rows: the scorers differ
            if block.attn.c_attn.bias is not None:  # qkv_bias: biases that matter (they start at 0)
                block.attn.c_attn.bias.normal_()
            if hasattr(block.attn, "q_norm"):  # qk_norm: norm weights that matter (they start at 1)
                block.attn.q_norm.weight.uniform_(0.5, 1.5), block.attn.k_norm.weight.uniform_(0.5, 1.5)
            for prm in block.attn.params:  # raw values: s, b, ssa's b and n in 0.3..1.1
                getattr(block.attn, param_name(model.config.scorer, prm)).copy_(torch.rand(4) * 0.8 + 0.3)
    save_checkpoint({"model": model.state_dict(), "model_args": vars(model.config), "config": {"task": task},
                     "iter_num": 0, "codec": codec}, str(path))
    return model, str(path)


EXPORTED = [(name, {}) for name in hf_scorers.RUNS if name != "softmax"] + [  # Qwen2's biases, Qwen3's norms
    ("ssmax", dict(ssmax_bias=True)), ("ssa", dict(qkv_bias=True)), ("lssa", dict(qk_norm=True, head_dim=32))]


@pytest.mark.parametrize("scorer,extra", EXPORTED, ids=[n + "".join(f"_{k}" for k in x) for n, x in EXPORTED])
def test_a_scorer_model_runs_in_transformers_as_in_nanoscorer_left_padded_batch_included(tmp_path, scorer, extra,
                                                                                         monkeypatch):
    model, path = nanoscorer_ckpt(tmp_path / "ckpt.pt", scorer=scorer, **extra)
    convert_hf.main(["export", path, "--out", str(tmp_path / "hf")])
    cfg = json.load(open(tmp_path / "hf" / "config.json"))
    want = [block.attn.scorer_params() for block in model.transformer.h]
    assert cfg["attn_implementation"] == hf_scorers.NAME and cfg["nanoscorer"]["scorer"] == scorer
    assert cfg["nanoscorer"]["params"] == {k: [x[k].tolist() for x in want] for k in want[0]}  # per layer and head
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()  # config.json names the attention
    x = torch.randint(1, V, (2, 20))
    mask = torch.ones_like(x)
    mask[1, :5] = 0  # the second row left-padded by 5
    with torch.no_grad():
        ours = [model(x[:1], x[:1])[0][0], model(x[1:, 5:], x[1:, 5:])[0][0]]
        for pos in ((mask.cumsum(-1) - 1).clamp(min=0), None):  # n_i from the mask: with or without position_ids
            got = back(x, attention_mask=mask, position_ids=pos).logits
            assert max((got[0] - ours[0]).abs().max(), (got[1, 5:] - ours[1]).abs().max()) < 1e-5
        softmax = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), attn_implementation="eager").eval()
        assert (softmax(x[:1]).logits[0] - ours[0]).abs().max() > 1e-2  # the scorer ran, not softmax
        got = back.generate(x, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
        assert torch.equal(got[0], model.generate(x[:1], 6, temperature=0)[0])  # each row as it alone
        assert torch.equal(got[1, 5:], model.generate(x[1:, 5:], 6, temperature=0)[0])
        for cache in ("dynamic", "static"):  # a prefill into an empty static cache comes with no mask
            got = back.generate(x[:1, 12:], max_new_tokens=6, do_sample=False, cache_implementation=cache)
            assert torch.equal(got, model.generate(x[:1, 12:], 6, temperature=0))  # with the KV cache
        static = StaticCache(config=back.config, max_cache_len=32)
        assert (back(x[:1], past_key_values=static).logits[0] - ours[0]).abs().max() < 1e-5
        if scorer != "ssmax":  # output_attentions gave (): every layer's weights now (SDPA's ssmax: none, as sdpa's)
            got = torch.stack(back(x[:1], output_attentions=True).attentions)
            assert (got - model.attention_rows(x[:1], rows=range(20))).abs().max() < 1e-5
    if scorer == "ssmax" and not extra:  # saved again by transformers: no attn_implementation, loads as sdpa
        back.save_pretrained(str(tmp_path / "again"))  # (after a fine-tune: Trainer's checkpoints, push_to_hub)
        again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "again")).eval()
        with torch.no_grad():  # it ran softmax, 0.28 off, without a word
            assert (again(x[:1]).logits[0] - ours[0]).abs().max() < 1e-5
    if scorer == "ssmax" and not extra:  # without hf_scorers' registration: refused, never softmax in its place
        monkeypatch.delitem(AttentionInterface._global_mapping, hf_scorers.NAME)
        with pytest.raises(ValueError, match="not supported"):
            AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))


def test_models_transformers_cannot_run_refuse_export_in_one_line(tmp_path):
    char = vocab.record(vocab.CharCodec(list("ab") + ["<|endoftext|>"]))
    cases = [(dict(scorer="fox", pos="nope"), None, "pos 'nope' (LlamaAttention always rotates q and k); "
                                                    "scorer 'fox' (its forget gate"),
             (dict(scorer="stickbreaking"), None, "scorer 'stickbreaking' (no row template"),
             (dict(scorer="lssar"), None, "re-weighting (p=15.0"),
             (dict(scorer="ssmax", reweight_p=4.0), None, "re-weighting (p=4.0"),
             (dict(vocab_size=3), char, "a character vocabulary (transformers has no tokenizer for it)"),
             (dict(vocab_size=1, task="linear"), None, "task 'linear' (real-valued inputs: its wte is a Linear of 3"),
             (dict(task="recall"), None, "task 'recall' (a task model reads its task's ids, not a tokenizer's text)"),
             (dict(qkv_bias=True, qk_norm=True), None, "q, k, v biases with q, k norms (Qwen2 has the one, Qwen3")]
    for i, (args, codec, why) in enumerate(cases):
        _, path = nanoscorer_ckpt(tmp_path / f"{i}.pt", codec, **args)
        msg = one_line_error(convert_hf.main, ["export", path, "--out", str(tmp_path / f"hf{i}")])
        assert msg.startswith(f"error: {path} cannot be exported: {why}"), msg
        assert not os.path.exists(tmp_path / f"hf{i}")
    # a model field the export does not write (one added to GPTConfig, or a checkpoint of another version) set away
    # from its default: refused, never dropped (transformers would run another model); at its default: exported
    from lib import hf as lib_hf
    assert set(lib_hf.EXPORTED) == {f.name for f in dataclasses.fields(GPTConfig)}  # each field decided
    _, path = nanoscorer_ckpt(tmp_path / "new.pt")
    ckpt = torch.load(path, weights_only=True)
    torch.save({**ckpt, "model_args": {**ckpt["model_args"], "qk_clip": 30.0}}, path)
    msg = one_line_error(convert_hf.main, ["export", path, "--out", str(tmp_path / "hfnew")])
    assert "cannot be exported: qk_clip=30.0 (not in config.json" in msg
    _, path = nanoscorer_ckpt(tmp_path / "ok.pt")
    convert_hf.main(["export", path, "--out", str(tmp_path / "hf")])
    assert "already holds model.safetensors, config.json" in one_line_error(
        convert_hf.main, ["export", path, "--out", str(tmp_path / "hf")])


BACK = EXPORTED + [("ssmax", dict(ssmax_learn_s=False)), ("ssa", dict(ssa_learn_n=True, ssa_n=2.0))]


@pytest.mark.parametrize("scorer,extra", BACK, ids=[n + "".join(f"_{k}" for k in x) for n, x in BACK])
def test_an_exported_scorer_model_imports_back_with_its_scorer_options_and_parameters(tmp_path, scorer, extra):
    model, path = nanoscorer_ckpt(tmp_path / "ckpt.pt", scorer=scorer, **extra)
    convert_hf.main(["export", path, "--out", str(tmp_path / "hf")])
    convert_hf.main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "run")])
    back, ckpt = load_checkpoint(str(tmp_path / "run" / "ckpt.pt"))
    fields = [f for prm in back.transformer.h[0].attn.params for f in prm.fields()]
    assert ckpt["model_args"]["scorer"] == scorer and all(ckpt["model_args"][f] == getattr(model.config, f)
                                                          for f in fields)
    learnt = lambda m: sorted(k for k, _ in m.named_parameters() if k.split(".")[-1].startswith(scorer))
    assert learnt(back) == learnt(model)  # a fixed parameter stays a buffer, a learnt one learns on
    for ours, theirs in zip(model.transformer.h, back.transformer.h):
        got, want = theirs.attn.scorer_params(), ours.attn.scorer_params()
        assert got.keys() == want.keys() and all(torch.allclose(got[k], want[k], rtol=1e-6) for k in want)
    x = torch.randint(1, V, (1, 20))
    with torch.no_grad():
        assert (back(x, x)[0] - model(x, x)[0]).abs().max() < 1e-5
    convert_hf.main(["export", str(tmp_path / "run" / "ckpt.pt"), "--out", str(tmp_path / "hf2")])
    first, again = (json.load(open(tmp_path / d / "config.json"))["nanoscorer"] for d in ("hf", "hf2"))
    assert again["options"] == first["options"] and np.allclose(list(again["params"].values()),
                                                                list(first["params"].values()), rtol=1e-6)


def test_an_export_from_before_options_were_written_and_bad_scorer_blocks(tmp_path):
    model, path = nanoscorer_ckpt(tmp_path / "ckpt.pt", scorer="ssmax", ssmax_bias=True)
    convert_hf.main(["export", path, "--out", str(tmp_path / "hf")])
    cfg = json.load(open(tmp_path / "hf" / "config.json"))
    block = {k: v for k, v in cfg["nanoscorer"].items() if k != "options"}  # an older export: b given means the bias
    json.dump({**cfg, "nanoscorer": block}, open(tmp_path / "hf" / "config.json", "w"))
    convert_hf.main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "old")])
    back, ckpt = load_checkpoint(str(tmp_path / "old" / "ckpt.pt"))
    assert ckpt["model_args"]["ssmax_bias"] and torch.equal(back.transformer.h[1].attn.scorer_params()["b"],
                                                            model.transformer.h[1].attn.scorer_params()["b"])
    s, b = block["params"]["s"], block["params"]["b"]
    cases = [({"scorer": "nosuch"}, "scorer 'nosuch' (unknown to this code)"),
             ({"scorer": "lssar", "params": {}}, "re-weighting (p=15.0"),
             ({"scorer": "fox", "params": {}}, "scorer 'fox' (its forget gate"),
             ({**block, "options": {"ssmax_lean_s": False}}, "option 'ssmax_lean_s' (scorer 'ssmax' has ssmax_b_init"),
             ({**block, "options": {"ssmax_bias": False}}, "params are ['b', 's']; scorer 'ssmax' with these options "
                                                           "has ['s']"),
             ({**block, "params": {"s": s[:1], "b": b}}, "nanoscorer s must be 2 layers x 4 heads of finite values"),
             ({"scorer": "ssa", "params": {"b": s, "n": [[1.0] * 4] * 2}}, "n must be 2 layers x 4 heads of finite "
                                                                          "values > 1, got [[1.0"),
             ({"scorer": "ssa", "params": {}, "options": {"ssa_n": 0.5}}, "ssa needs ssa_n > 1, got 0.5"),
             ("ssmax", "config.json's nanoscorer is 'ssmax', not {scorer, params, options}")]
    for i, (spec, words) in enumerate(cases):
        json.dump({**cfg, "nanoscorer": spec}, open(tmp_path / "hf" / "config.json", "w"))
        msg = one_line_error(convert_hf.main, ["import", str(tmp_path / "hf"), "--out", str(tmp_path / f"r{i}")])
        assert words in msg, msg
        assert not os.path.exists(tmp_path / f"r{i}" / "ckpt.pt")


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
    # and imports back with it: it once came back with no tokenizer ("sample.py cannot decode")
    convert_hf.main(["import", folder, "--out", os.path.join(os.path.dirname(folder), "back")])
    back = torch.load(os.path.join(os.path.dirname(folder), "back", "ckpt.pt"), weights_only=True)
    assert back["codec"] == vocab.record(None)


def test_eval_harness_loads_a_qwen2_export_with_its_biases(tmp_path):
    import eval_harness
    model, path = nanoscorer_ckpt(tmp_path / "ckpt.pt", vocab.record(None), vocab_size=50304, n_embd=32,
                                  scorer="ssmax", qkv_bias=True)
    back, _ = eval_harness.load(path, str(tmp_path / "hf"), "cpu", torch.float32)  # LlamaForCausalLM dropped them
    x = torch.randint(1, 50257, (1, 20))
    with torch.no_grad():
        assert (back(x).logits - model(x, x)[0]).abs().max() < 1e-5


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
