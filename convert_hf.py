"""
Pretrained models in and out: a Hugging Face Llama-family checkpoint becomes a nanoscorer run (scorer swapped,
fine-tuned, evaluated with every script here), and a nanoscorer model goes back out as a Hugging Face folder.

    python convert_hf.py import path/to/SmolLM2-135M --out out-smollm          # -> out-smollm/ckpt.pt
    python convert_hf.py import HuggingFaceTB/SmolLM2-135M --out out-smollm    # a hub name: downloads if online
    python convert_hf.py export out-smollm/ckpt.pt --out hf-smollm             # -> config.json, model.safetensors

Import reads config.json and the safetensors weights of LlamaForCausalLM or a Llama-compatible family without
attention or MLP biases (llama, mistral without a sliding window); the names map one to one (q, k, v_proj
concatenated into c_attn; transformers' rotate_half RoPE is apply_rope's convention). The checkpoint holds the
model, its model_args (grouped KV heads, RMSNorm eps, tied embeddings) and the tokenizer (its tokenizer.json) as its
codec, so sample.py --ckpt alone decodes, the evaluations match data by content, and train.py init_from= swaps its
scorer and fine-tunes it on data prepared with it (prepare_data.py --tokenizer out-smollm/ckpt.pt). It has no
optimizer state: resume=True on it refuses. Export writes the inverse; a softmax RoPE model loads as a plain
LlamaForCausalLM. Anything unsupported is one `error:` line naming it. Needs requirements-hf.txt.
"""
import argparse, importlib, json, os, sys

import torch

from lib import vocab
from lib.checkpoint import CheckpointError, read_checkpoint, run_info, save_checkpoint
from lib.corpora import DataError
from model import GPT, GPTConfig

FAMILIES = ("llama", "mistral")  # Llama-compatible: same weights and attention, no biases
LAYER = {"attn.c_proj": "self_attn.o_proj", "mlp.w_gate": "mlp.gate_proj", "mlp.w_up": "mlp.up_proj",
         "mlp.c_proj": "mlp.down_proj", "ln_1": "input_layernorm", "ln_2": "post_attention_layernorm"}


class ConvertError(Exception):
    """Input this converter cannot take: main prints it as one line."""


def need(module):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConvertError(f"this needs {module.split('.')[0]}: pip install -r requirements-hf.txt") from None


# ----------------------------------------------------------------------------------------------------------------
# Import: a Hugging Face folder -> a nanoscorer checkpoint

def hf_folder(name):
    """A local folder, or a hub name downloaded through huggingface_hub when the network allows."""
    if os.path.isdir(name):
        return name
    if os.path.exists(name) or name.count("/") != 1:
        raise ConvertError(f"{name!r} is neither a Hugging Face folder (config.json + safetensors) nor a hub name")
    hub = need("huggingface_hub")
    try:
        return hub.snapshot_download(name, allow_patterns=["*.json", "*.safetensors"])
    except Exception as e:  # offline, unknown repo, gated model
        raise ConvertError(f"cannot download {name!r} ({type(e).__name__}: {str(e).splitlines()[0][:120]}); "
                           f"download it elsewhere and give its folder") from None


def model_args(cfg):
    """GPTConfig fields of a Hugging Face config.json, or ConvertError naming what is unsupported."""
    family, rope = cfg.get("model_type"), cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    bad = [f"model_type {family!r} (supported: {', '.join(FAMILIES)})"] * (family not in FAMILIES)
    bad += [f"{k}=true" for k in ("attention_bias", "mlp_bias") if cfg.get(k)]
    bad += [f"hidden_act {cfg.get('hidden_act')!r} (SwiGLU needs silu)"] * (cfg.get("hidden_act", "silu") != "silu")
    bad += [f"sliding_window {cfg.get('sliding_window')}"] * bool(cfg.get("sliding_window"))
    bad += [f"rope_type {rope.get('rope_type')!r} (only the default)"] * (rope.get("rope_type", "default") != "default")
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    if heads and hidden and cfg.get("head_dim", hidden // heads) != hidden // heads:
        bad.append(f"head_dim {cfg['head_dim']} != hidden_size / num_attention_heads")
    if bad:
        raise ConvertError(f"unsupported architecture: {'; '.join(bad)}")
    return dict(vocab_size=cfg["vocab_size"], n_layer=cfg["num_hidden_layers"], n_head=heads,
                n_kv_head=cfg.get("num_key_value_heads") or heads, n_embd=hidden, ffn_hidden=cfg["intermediate_size"],
                block_size=cfg.get("max_position_embeddings", 2048), norm_eps=cfg.get("rms_norm_eps", 1e-6),
                rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
                tie_embeddings=bool(cfg.get("tie_word_embeddings", False)), scorer="softmax", pos="rope")


def read_weights(folder):
    """Every tensor of the folder's safetensors (one file or shards), as float32."""
    st = need("safetensors.torch")
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not files:
        raise ConvertError(f"{folder} holds no .safetensors weights (a pytorch_model.bin is not read: a pickle)")
    return {k: v.float() for f in files for k, v in st.load_file(os.path.join(folder, f)).items()}


def to_state(w, args):
    """Hugging Face's names -> this model's state_dict."""
    try:
        state = {"transformer.wte.weight": w["model.embed_tokens.weight"],
                 "transformer.ln_f.weight": w["model.norm.weight"],
                 "lm_head.weight": w["model.embed_tokens.weight" if args["tie_embeddings"] else "lm_head.weight"]}
        for i in range(args["n_layer"]):
            hf = f"model.layers.{i}."
            state[f"transformer.h.{i}.attn.c_attn.weight"] = torch.cat([w[hf + f"self_attn.{x}_proj.weight"]
                                                                        for x in "qkv"])
            state.update({f"transformer.h.{i}.{ours}.weight": w[f"{hf}{theirs}.weight"]
                          for ours, theirs in LAYER.items()})
    except KeyError as e:
        raise ConvertError(f"the weights lack {e.args[0]!r}: not a Llama-family checkpoint") from None
    return state


def import_hf(name, out):
    folder = hf_folder(name)
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise ConvertError(f"{folder} has no config.json")
    cfg = json.load(open(os.path.join(folder, "config.json")))
    args = model_args(cfg)
    model = GPT(GPTConfig(**args))
    missing, unexpected = model.load_state_dict(to_state(read_weights(folder), args), strict=False)
    if [k for k in missing if not k.startswith("lm_head")] or unexpected:  # lm_head: the tied wte
        raise ConvertError(f"weights that do not fit: missing {missing[:3]}, unexpected {unexpected[:3]}")
    enc = vocab.hf_codec(folder) if os.path.isfile(os.path.join(folder, "tokenizer.json")) else None
    if enc is not None and enc.n_vocab > args["vocab_size"]:
        raise ConvertError(f"its tokenizer has {enc.n_vocab:,} ids, more than the model's {args['vocab_size']:,}")
    if os.path.exists(os.path.join(out, "ckpt.pt")):
        raise ConvertError(f"{out} already holds a ckpt.pt: give another --out")
    os.makedirs(out, exist_ok=True)
    save_checkpoint({"model": model.state_dict(), "model_args": args, "config": {}, "iter_num": 0,
                     "run_info": run_info(), "codec": vocab.record(enc) if enc else None,
                     "hf": {"source": name, "config": cfg}}, os.path.join(out, "ckpt.pt"))
    print(f"{out}/ckpt.pt: {model.get_num_params() / 1e6:.1f}M parameters, {args['n_head']} heads, "
          f"{args['n_kv_head']} KV heads, N = {args['block_size']}, tokenizer: "
          + (f"{enc.n_vocab:,} ids" if enc else "none (no tokenizer.json: sample.py cannot decode)"))


# ----------------------------------------------------------------------------------------------------------------
# Export: a nanoscorer checkpoint -> a Hugging Face folder

def export_hf(path, out):
    ckpt = read_checkpoint(path)
    a = ckpt["model_args"]
    why = [f"scorer {a['scorer']!r} (LlamaAttention is softmax)"] * (a["scorer"] != "softmax") + \
        ["pos 'nope'"] * (a["pos"] != "rope") + [f"reweight_p {a['reweight_p']}"] * (a["reweight_p"] is not None)
    if why:
        raise ConvertError(f"{path} cannot be a LlamaForCausalLM: {', '.join(why)}")
    st = need("safetensors.torch")
    w, tie = ckpt["model"], a["tie_embeddings"]
    C, kv = a["n_embd"], a["n_embd"] // a["n_head"] * (a["n_kv_head"] or a["n_head"])
    out_w = {"model.embed_tokens.weight": w["transformer.wte.weight"],
             "model.norm.weight": w["transformer.ln_f.weight"]}
    if not tie:
        out_w["lm_head.weight"] = w["lm_head.weight"]
    for i in range(a["n_layer"]):
        hf, ours = f"model.layers.{i}.", f"transformer.h.{i}."
        q, k, v = w[ours + "attn.c_attn.weight"].split([C, kv, kv])
        out_w.update({f"{hf}self_attn.{x}_proj.weight": t for x, t in zip("qkv", (q, k, v))})
        out_w.update({f"{hf}{theirs}.weight": w[f"{ours}{o}.weight"] for o, theirs in LAYER.items()})
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=a["vocab_size"],
               hidden_size=C, intermediate_size=a["ffn_hidden"], num_hidden_layers=a["n_layer"],
               num_attention_heads=a["n_head"], num_key_value_heads=a["n_kv_head"] or a["n_head"],
               max_position_embeddings=a["block_size"], rms_norm_eps=a["norm_eps"], rope_theta=a["rope_theta"],
               tie_word_embeddings=tie, hidden_act="silu", attention_bias=False, mlp_bias=False,
               torch_dtype="float32", bos_token_id=None, eos_token_id=(ckpt.get("codec") or {}).get("eot"))
    os.makedirs(out, exist_ok=True)
    st.save_file({k: t.contiguous() for k, t in out_w.items()}, os.path.join(out, "model.safetensors"),
                 metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    if (ckpt.get("codec") or {}).get("kind") == "hf":  # the imported model's own tokenizer goes back out
        with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(ckpt["codec"]["json"])
    print(f"{out}: config.json, model.safetensors"
          + (", tokenizer.json" if (ckpt.get("codec") or {}).get("kind") == "hf" else ""))


def main(argv=None):
    p = argparse.ArgumentParser(description="Hugging Face Llama-family checkpoints in and out.")
    p.error = lambda message: sys.exit(f"error: {message}")  # one line, no usage dump
    p.add_argument("direction", choices=["import", "export"])
    p.add_argument("source", help="import: a Hugging Face folder or hub name; export: a nanoscorer checkpoint")
    p.add_argument("--out", required=True, help="import: the run folder for ckpt.pt; export: the Hugging Face folder")
    a = p.parse_args(argv)
    try:
        (import_hf if a.direction == "import" else export_hf)(a.source, a.out)
    except (ConvertError, CheckpointError, DataError, OSError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
