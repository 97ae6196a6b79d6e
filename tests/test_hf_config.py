"""A Hugging Face config.json as convert_hf.py import reads it (lib/hf.model_args): the fields it carries into the
GPT's (training length, eps, θ, heads, tied embeddings, head_dim), its RoPE as transformers reads it from
rope_parameters, an older rope_scaling or both, what it refuses (sliding windows, MLP biases, another activation),
and an export's check of GPT-2's BPE files. Configs only: no weights (transformers only for its RoPE frequencies)."""
import pytest
import torch

import rope
from lib import hf as lib_hf, hf_export, vocab

# a tiny Llama's config.json: 4 query heads of 16, 2 KV heads, 64 positions
BASE = dict(model_type="llama", vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
            tie_word_embeddings=True, hidden_act="silu")


def test_the_configs_length_eps_theta_heads_and_tied_embeddings_become_the_gpts():
    args = lib_hf.model_args({**BASE, "rope_theta": 500.0, "head_dim": 16})
    assert {k: args[k] for k in ("block_size", "norm_eps", "rope_theta", "n_head", "n_kv_head", "tie_embeddings",
                                 "head_dim", "rope_scaling")} == dict(block_size=64, norm_eps=1e-5, rope_theta=500.0,
                                                                      n_head=4, n_kv_head=2, tie_embeddings=True,
                                                                      head_dim=None, rope_scaling=None)
    assert lib_hf.model_args({**BASE, "head_dim": 32})["head_dim"] == 32  # a head size of its own (Qwen3's)


LINEAR = {"rope_type": "linear", "factor": 4.0, "rope_theta": 500.0}
ROPES = {"rope_parameters": {"rope_parameters": LINEAR},  # transformers 5's
         "rope_scaling": {"rope_scaling": {"type": "linear", "factor": 4.0}, "rope_theta": 500.0},  # an older config's
         # both given: transformers reads rope_scaling (its factor, θ from it or the top level: here the default)
         "both, factors differ": {"rope_parameters": LINEAR, "rope_scaling": {"type": "linear", "factor": 2.0}},
         "both, theta in one": {"rope_parameters": LINEAR, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}}


@pytest.mark.parametrize("keys", ROPES)
def test_rope_frequencies_are_transformers_whether_rope_parameters_rope_scaling_or_both_are_given(keys):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    cfg = {**BASE, **ROPES[keys]}
    args = lib_hf.model_args(cfg)
    want = LlamaRotaryEmbedding(transformers.LlamaConfig(**{k: v for k, v in cfg.items() if k != "model_type"}))
    torch.testing.assert_close(rope.rope_inv_freq(16, args["rope_theta"], args["rope_scaling"]).float(),
                               want.inv_freq, rtol=1e-6, atol=0)


REFUSED = [({"model_type": "mistral", "sliding_window": 4096}, "sliding_window 4096"),  # Mistral 7B v0.1: no switch
           ({"layer_types": ["full_attention", "sliding_attention"]}, "sliding_window None"),
           ({"mlp_bias": True}, "mlp_bias=true"),
           ({"hidden_act": "gelu"}, "hidden_act 'gelu' (SwiGLU needs silu)")]


@pytest.mark.parametrize("extra,words", REFUSED, ids=["mistral_window", "layer_types", "mlp_bias", "gelu"])
def test_sliding_windows_mlp_biases_and_other_activations_are_refused(extra, words):
    with pytest.raises(lib_hf.ConvertError, match="unsupported architecture: ") as e:
        lib_hf.model_args({**BASE, **extra})
    assert words in str(e.value)
    assert lib_hf.model_args({**BASE, "model_type": "mistral", "sliding_window": None})["n_kv_head"] == 2  # no window


def test_an_export_refuses_gpt2_bpe_files_whose_hash_differs(monkeypatch):
    assert len(hf_export.gpt2_files()) == 2  # the installed copies: GPT-2's own
    monkeypatch.setattr(vocab, "VOCAB_BPE_SHA256", "0" * 64)
    with pytest.raises(lib_hf.ConvertError, match="vocab.bpe is not GPT-2's"):
        hf_export.gpt2_files()


def test_a_librarys_error_is_named_by_its_type_and_its_messages_first_line_even_an_empty_one():
    assert lib_hf.cause(ValueError("\n  bad header\nsecond line")) == "ValueError: bad header"
    assert lib_hf.cause(Exception()) == "Exception"  # str(e) == "": there is no first line to index
    assert lib_hf.cause(OSError("x" * 300)) == "OSError: " + "x" * 200 + " ..."
    offline = ("Cannot find an appropriate cached snapshot folder for the specified revision on the local disk and "
               "outgoing traffic has been disabled. To enable repo look-ups and downloads online, set ...")
    assert lib_hf.cause(OSError(offline)) == "OSError: " + offline.split(". ")[0]  # a sentence, not cut mid-way
    assert lib_hf.cause(OSError("word " * 60)).endswith("word word ...")
    assert len(lib_hf.cause(OSError("w " * 200))) < 215


MALFORMED = [({"num_attention_heads": None}, "num_attention_heads=None (a positive integer)"),  # hidden // None
             ({"hidden_size": "64"}, "hidden_size='64' (a positive integer)"),
             ({"max_position_embeddings": None}, "max_position_embeddings=None (a positive integer)"),  # torch.arange
             ({"rms_norm_eps": None}, "rms_norm_eps=None (a positive number)"),  # imported; every forward failed
             ({"rope_parameters": [1]}, "rope_parameters [1] (a dict)"),  # .get of a list
             ({"rope_parameters": {"rope_type": "default", "rope_theta": -1.0}}, "rope_theta=-1.0 (a positive number)")]


@pytest.mark.parametrize("extra,words", MALFORMED, ids=[next(iter(x)) + str(i) for i, (x, _) in enumerate(MALFORMED)])
def test_a_malformed_value_is_one_line_naming_it_not_a_traceback_or_a_checkpoint_no_forward_runs(extra, words):
    with pytest.raises(lib_hf.ConvertError, match="^config.json: ") as e:
        lib_hf.model_args({**BASE, **extra})
    assert words in str(e.value)
