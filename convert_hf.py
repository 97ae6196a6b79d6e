"""
Pretrained models in and out: a Hugging Face Llama-family checkpoint becomes a nanoscorer run (scorer swapped,
fine-tuned, evaluated with every script here), and a nanoscorer model goes back out as a Hugging Face folder.

    python convert_hf.py import path/to/SmolLM2-135M --out out-smollm          # -> out-smollm/ckpt.pt
    python convert_hf.py import HuggingFaceTB/SmolLM2-135M --out out-smollm    # a hub name: downloads if online
    python convert_hf.py export out-smollm/ckpt.pt --out hf-smollm             # -> config.json, model.safetensors
    python convert_hf.py export out-ssmax/ckpt.pt --out hf-ssmax               # a scorer: import hf_scorers to load

Import reads config.json and the safetensors weights of LlamaForCausalLM or a Llama-compatible family without
output-projection or MLP biases (llama, mistral without a sliding window; qwen2, whose q, k, v biases become
qkv_bias; qwen3, whose q, k norms become qk_norm; a head_dim of its own), its RoPE plain or scaled as Llama 3's or
linearly (rope_scaling, rope.py); the names map one to one (q, k, v_proj concatenated into c_attn; transformers'
rotate_half RoPE is apply_rope's convention). The checkpoint holds the model, its model_args (grouped KV heads,
RMSNorm eps, tied embeddings) and the tokenizer (its tokenizer.json) as its codec, so sample.py --ckpt alone decodes,
the evaluations match data by content, and train.py init_from= swaps its scorer and fine-tunes it on data prepared
with it (prepare_data.py --tokenizer out-smollm/ckpt.pt). It has no optimizer state: resume=True on it refuses.
Export writes the inverse, with the tokenizer files AutoTokenizer loads (the imported tokenizer.json, or GPT-2's
vocab.json and merges.txt from the offline BPE files): a softmax RoPE model loads as a plain LlamaForCausalLM
(Qwen2ForCausalLM, Qwen3ForCausalLM with their biases, norms); a row-template scorer (ssmax, ssa, lssa, sigmoid,
softpick) as a LlamaForCausalLM whose config.json holds the scorer and its per-head parameters per layer, run by
hf_scorers.py's attention function (import it first), and such an export imports back as that scorer, its options and
per-head parameters (a fine-tune continues it). NoPE, fox's forget gate, stick-breaking, re-weighting and character
vocabularies are refused. Only model.safetensors or the shards its index names are read; an export keeps an import's
BOS and refuses a task run's model (it reads its task's ids, not a tokenizer's text: it would import back as a
language model). Anything unsupported is one `error:` line naming it. Needs requirements-hf.txt.
"""
import argparse, sys

from lib import folders
from lib.checkpoint import CheckpointError
from lib.corpora import DataError
from lib.hf import ConvertError, import_hf
from lib.hf_export import export_hf


def main(argv=None):
    p = argparse.ArgumentParser(description="Hugging Face Llama-family checkpoints in and out.")
    p.error = lambda message: sys.exit(f"error: {message}")  # one line, no usage dump
    p.add_argument("direction", choices=["import", "export"])
    p.add_argument("source", help="import: a Hugging Face folder or hub name; export: a nanoscorer checkpoint")
    p.add_argument("--out", required=True, help="import: the run folder for ckpt.pt; export: the Hugging Face folder")
    a = p.parse_args(argv)
    try:
        if a.direction == "import":
            import_hf(a.source, a.out)
        else:
            print(f"{a.out}: {', '.join(export_hf(a.source, a.out))}")
    except (ConvertError, CheckpointError, DataError, folders.FolderError, OSError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
