"""
Hugging Face Llama-family checkpoints in (convert_hf.py import): a folder's config.json + safetensors -> a nanoscorer
checkpoint with its tokenizer as codec (import_hf); the names' mapping and what transformers can run (refusals), which
the way out shares (lib/hf_export.py: a checkpoint -> a folder that transformers loads).
"""
import hashlib, importlib, json, os, pathlib, sys

import torch

import tasks
from lib import folders, vocab
from lib.checkpoint import run_info, save_checkpoint
from lib.corpora import DataError
from model import GPT, GPTConfig, param_name
from rope import SCALINGS, check_scaling
from scorers import SCORERS

# Llama-compatible: same weights and attention; qwen2: q, k, v biases; qwen3: q, k norms, its own head_dim
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
LAYER = {"attn.c_proj": "self_attn.o_proj", "mlp.w_gate": "mlp.gate_proj", "mlp.w_up": "mlp.up_proj",
         "mlp.c_proj": "mlp.down_proj", "ln_1": "input_layernorm", "ln_2": "post_attention_layernorm"}
QK_NORM = {"attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm"}  # Qwen3's, per head dimension
# the model fields an export writes (config.json, the scorer's block and weights) or refuses (refusals), or that only
# training or this code's kernels read; another one away from its default (a field added to GPTConfig) is refused
EXPORTED = {"block_size", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd", "ffn_hidden", "dropout",
            "rope_theta", "rope_scaling", "norm_eps", "tie_embeddings", "qkv_bias", "head_dim", "qk_norm", "pos",
            "scorer", "reweight_p", "fgate_bias_init", "backend",
            *(f for e in SCORERS.values() for p in e.params for f in p.fields())}


class ConvertError(Exception):
    """Input this converter cannot take: main prints it as one line."""


def cause(e):
    """A library's exception as one short line: its type and its message's first sentence (which may be empty), cut
    at a word past 200 characters (a cut at 120 ended huggingface_hub's offline message in "traffic has ")."""
    first = (str(e).strip().splitlines() or [""])[0].split(". ")[0]
    if len(first) > 200:  # at the last word that fits
        first = first[:first.rfind(" ", 0, 200) if " " in first[:200] else 200] + " ..."
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


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
        raise ConvertError(f"cannot download {name!r} ({cause(e)}); "
                           f"download it elsewhere and give its folder") from None


def model_args(cfg):
    """GPTConfig fields of a Hugging Face config.json, or ConvertError naming what is unsupported."""
    family, ropes = cfg.get("model_type"), [cfg.get(k) or {} for k in ("rope_scaling", "rope_parameters")]
    shape = [f"{k}={v!r} (a positive integer)" for k in ("vocab_size", "num_hidden_layers", "num_attention_heads",
             "hidden_size", "intermediate_size", "num_key_value_heads", "max_position_embeddings")
             if k in cfg and not (type(v := cfg[k]) is int and v > 0)]
    named = dict(zip(("rope_scaling", "rope_parameters"), ropes))
    shape += [f"{k} {r!r} (a dict)" for k, r in named.items() if type(r) is not dict]
    numbers = {**{k: cfg[k] for k in ("rms_norm_eps", "rope_theta") if k in cfg}, **{
        f"{k}'s rope_theta": r["rope_theta"] for k, r in named.items() if type(r) is dict and "rope_theta" in r}}
    shape += [f"{k}={v!r} (a positive number)" for k, v in numbers.items() if not (type(v) in (int, float) and v > 0)]
    if shape:  # else a traceback, or a checkpoint no forward can run (rms_norm_eps null)
        raise ConvertError(f"config.json: {'; '.join(shape)}")
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


def read_json(path):
    """A JSON object file of a Hugging Face folder, or ConvertError naming it (a download cut short, another format)."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ConvertError(f"{path} is not readable JSON ({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict):
        raise ConvertError(f"{path} holds a JSON {type(obj).__name__}, not the object Hugging Face writes")
    return obj


def read_weights(folder):
    """Every tensor of the folder's model weights (one file or shards), as float32."""
    st = need("safetensors.torch")
    index = os.path.join(folder, "model.safetensors.index.json")
    # the shards the index names, else model*.safetensors: never another copy beside them (Mistral's consolidated)
    if os.path.isfile(index):
        shards = read_json(index).get("weight_map")
        if not isinstance(shards, dict):
            raise ConvertError(f"{index} has no weight_map (tensor name -> shard file)")
        files = sorted(set(shards.values()))
    else:
        files = sorted(f for f in os.listdir(folder) if f.startswith("model") and f.endswith(".safetensors"))
    if not files:
        raise ConvertError(f"{folder} holds no model*.safetensors weights (a pytorch_model.bin is not read: a pickle)")
    w = {}
    for f in files:
        try:
            w.update({k: v.float() for k, v in st.load_file(os.path.join(folder, f)).items()})
        except Exception as e:  # safetensors' own errors: a download cut short, another format, a shard missing
            raise ConvertError(f"{os.path.join(folder, f)} is not a readable safetensors file ({cause(e)})") from None
    return w


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


def tokenizer_of(folder):
    """The folder's tokenizer: its tokenizer.json, or GPT-2's vocab.json and merges.txt as an export writes them
    (matched by sha256); None without either."""
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        files = [os.path.join(folder, f) for f in ("vocab.json", "merges.txt")]
        sums = [hashlib.sha256(pathlib.Path(f).read_bytes()).hexdigest() for f in files if os.path.isfile(f)]
        return vocab.get_tokenizer() if sums == [vocab.ENCODER_JSON_SHA256, vocab.VOCAB_BPE_SHA256] else None
    try:
        return vocab.hf_codec(folder)
    except DataError:
        raise
    except Exception as e:  # the tokenizers library's own parse error
        raise ConvertError(f"{folder}/tokenizer.json is not a tokenizer the tokenizers library reads "
                           f"({cause(e)})") from None


def import_hf(name, out):
    folder = hf_folder(name)
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise ConvertError(f"{folder} has no config.json")
    cfg = read_json(os.path.join(folder, "config.json"))
    try:
        args = model_args(cfg)
    except KeyError as e:
        raise ConvertError(f"{folder}/config.json lacks {e.args[0]!r}: not a Llama-family config") from None
    options, params = scorer_of(cfg, args)
    args.update(options)
    try:
        model = GPT(GPTConfig(**args))
    except ValueError as e:  # an option out of its bound (check_options), a head layout GPTConfig refuses
        where = "config.json's nanoscorer block" if "nanoscorer" in cfg else "config.json"
        raise ConvertError(f"{where}: {e}") from None
    w = read_weights(folder)
    if args["tie_embeddings"] and "lm_head.weight" in w and not torch.equal(w["lm_head.weight"], w.get(
            "model.embed_tokens.weight", w["lm_head.weight"])):  # no embeddings: to_state says so
        raise ConvertError("config.json ties the embeddings (tie_word_embeddings) but the weights hold another "
                           "lm_head.weight: which one the model reads is ambiguous (transformers 5 unties them)")
    state, want = {**to_state(w, args), **scorer_state(model, params)}, model.state_dict()
    bad = next((k for k, x in state.items() if k in want and x.shape != want[k].shape), None)
    if bad:  # else load_state_dict's traceback
        raise ConvertError(f"the weights and config.json disagree: {bad} is {tuple(state[bad].shape)} in the weights, "
                           f"{tuple(want[bad].shape)} by config.json")
    extra = sorted(k for k in w if k.startswith("model.layers.") and int(k.split(".")[2]) >= args["n_layer"])
    if extra:  # transformers drops them too, with a warning
        print(f"warning: config.json's num_hidden_layers={args['n_layer']}: {len(extra)} weights of later layers "
              f"(from {extra[0]}) are not read", file=sys.stderr)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if [k for k in missing if not k.startswith("lm_head")] or unexpected:  # lm_head: the tied wte
        raise ConvertError(f"weights that do not fit: missing {missing[:3]}, unexpected {unexpected[:3]}")
    enc = tokenizer_of(folder)
    tok_cfg = os.path.join(folder, "tokenizer_config.json")
    tok = read_json(tok_cfg) if enc and os.path.isfile(tok_cfg) else {}
    bos, jinja = tok.get("bos_token"), os.path.join(folder, "chat_template.jinja")  # transformers 5 saves it there
    template = tok.get("chat_template") or (pathlib.Path(jinja).read_text() if enc and os.path.isfile(jinja) else None)
    bos = bos.get("content") if isinstance(bos, dict) else bos  # an AddedToken's dict, or its text
    if enc is not None and enc.n_vocab > args["vocab_size"]:
        raise ConvertError(f"its tokenizer has {enc.n_vocab:,} ids, more than the model's {args['vocab_size']:,}")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConvertError(f"--out {out!r} is a file, expected a folder for ckpt.pt")
    with folders.held(out, "an import"):  # two imports into one --out: the second is refused, never both written
        if os.path.exists(os.path.join(out, "ckpt.pt")):
            raise ConvertError(f"{out} already holds a ckpt.pt: give another --out")
        os.makedirs(out, exist_ok=True)
        save_checkpoint({"model": model.state_dict(), "model_args": args, "config": {}, "iter_num": 0,
                         "run_info": run_info(), "codec": vocab.record(enc) if enc else None,
                         "hf": {"source": name, "config": cfg, "bos_token": bos,
                                "chat_template": template}}, os.path.join(out, "ckpt.pt"))
    print(f"{out}/ckpt.pt: {model.get_num_params() / 1e6:.1f}M parameters, scorer {args['scorer']}, "
          f"{args['n_head']} heads, {args['n_kv_head']} KV heads, N = {args['block_size']}, tokenizer: "
          + (f"{enc.n_vocab:,} ids" if enc else "none (no tokenizer.json: sample.py cannot decode)"))


# ----------------------------------------------------------------------------------------------------------------
# What transformers can run: the import checks an export's scorer block by it, lib/hf_export.py a checkpoint

def refusals(a, codec, task=""):
    """Why a checkpoint cannot be a LlamaForCausalLM that transformers runs (a scorer: hf_scorers.py); [] if it can."""
    why = [f"{k}={v!r} (not in config.json: transformers would run the model without it)" for k, v in a.items()
           if k not in EXPORTED and v != getattr(GPTConfig, k, None)]
    entry = SCORERS.get(a["scorer"])
    if entry is None:
        return [*why, f"scorer {a['scorer']!r} (unknown to this code)"]
    why += ["pos 'nope' (LlamaAttention always rotates q and k)"] * (a.get("pos", "rope") != "rope")
    why += ["scorer 'fox' (its forget gate, a Linear per layer, has no place in LlamaAttention)"] * entry.forget
    why += [f"scorer {a['scorer']!r} (no row template: hf_scorers.py does not run it)"] * (entry.logit is None)
    p = entry.p if a.get("reweight_p") is None else a["reweight_p"]
    why += [f"re-weighting (p={p}: hf_scorers.py does not run it)"] * (p is not None)
    why += ["a character vocabulary (transformers has no tokenizer for it)"] * (codec.get("kind") == "char")
    why += ["q, k, v biases with q, k norms (Qwen2 has the one, Qwen3 the other)"] * bool(a.get("qkv_bias") and
                                                                                        a.get("qk_norm"))
    n_in = getattr(tasks.TASKS.get(task), "n_in", 0)  # any task: its export would import back as a language model
    why += [f"task {task!r} (" + (f"real-valued inputs: its wte is a Linear of {n_in} features, no tokens)" if n_in
                                  else "a task model reads its task's ids, not a tokenizer's text)")] * bool(task)
    return why
