"""
A nanoscorer checkpoint on EleutherAI's lm-evaluation-harness (lm-eval 0.4): the field's standard benchmarks, through
its HFLM over the model that convert_hf.py exports (into a temporary folder; a scorer other than softmax runs in
transformers through hf_scorers.py, exactly as model.py scores it).

    python eval_harness.py out-ssmax/ckpt.pt --tasks lambada_openai hellaswag arc_easy --out_dir out-harness-ssmax
    python eval_harness.py out-smollm/ckpt.pt --tasks mytask --include_path my_tasks/ --limit 100   # a local task

lm-eval's tasks download their data on first use (Hugging Face datasets). Offline, a task of local files runs: a YAML
in --include_path with `dataset_path: json` and `dataset_kwargs: {data_files: {test: /path/docs.jsonl}}`
(tests/test_hf_scorers.py writes one). The model reads up to --max_length tokens (default: its block_size N) with its
trained RoPE θ; on CUDA in bf16 weights, on CPU in fp32. Writes results.md (lm-eval's table) and results.json (its
results, n-shot, versions and task configs, with the checkpoint, its model_args, its run_info and this run's) to
--out_dir, only whole, never over an earlier evaluation's. Needs requirements-hf.txt (lm-eval, accelerate).
"""
import argparse, json, os, sys, tempfile

import torch

from lib import folders, hf, hf_export, vocab
from lib.checkpoint import CheckpointError, pick_device, read_checkpoint, run_info
from lib.corpora import DataError

OUTPUTS = ("results.md", "results.json")  # results.json last: the evaluation finished


def load(path, folder, device, dtype):
    """The checkpoint exported into folder, loaded back as transformers' model and tokenizer."""
    hf_export.export_hf(path, folder)
    import hf_scorers  # registers the scorers' attention with transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer  # Llama's or Qwen2's, as config.json says
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation=hf_scorers.NAME, dtype=dtype)
    return model.to(device).eval(), AutoTokenizer.from_pretrained(folder)


def evaluate(args, out):
    """lm-eval's simple_evaluate on the checkpoint; writes OUTPUTS into out, returns lm-eval's results dict."""
    lm_eval = hf.need("lm_eval")
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import handle_non_serializable, make_table
    tasks = TaskManager(include_path=args.include_path)
    unknown = [t for t in args.tasks if not tasks.match_tasks([t])]
    if unknown:
        raise ValueError(f"lm-eval has no task {', '.join(map(repr, unknown))}"
                         + ("" if args.include_path else " (a local task's YAML: --include_path)"))
    ckpt = vocab.language_model(args.ckpt, read_checkpoint(args.ckpt, mmap=True))  # a task run: said as such
    if ckpt.get("codec") is None:
        raise ValueError(f"{args.ckpt} stores no tokenizer (an import of a folder without one, or an older "
                         f"checkpoint): lm-eval needs one")
    device = pick_device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # as the other evaluations' autocast
    precision = str(dtype).removeprefix("torch.")
    with tempfile.TemporaryDirectory() as folder:
        model, tok = load(args.ckpt, os.path.join(folder, "hf"), device, dtype)
        lm = HFLM(pretrained=model, tokenizer=tok, batch_size=args.batch_size, max_length=args.max_length)
        res = lm_eval.simple_evaluate(model=lm, tasks=args.tasks, num_fewshot=args.num_fewshot, limit=args.limit,
                                      task_manager=tasks, log_samples=False, bootstrap_iters=args.bootstrap_iters,
                                      random_seed=args.seed, numpy_random_seed=args.seed,
                                      torch_random_seed=args.seed, fewshot_random_seed=args.seed)
    table = make_table(res) + ("\n" + make_table(res, "groups") if res.get("groups") else "")
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(f"# lm-eval {lm_eval.__version__} on {os.path.abspath(args.ckpt)}\n\n{table}")
    record = dict(checkpoint=os.path.abspath(args.ckpt), iter_num=ckpt.get("iter_num"), model_args=ckpt["model_args"],
                  train_run_info=ckpt.get("run_info"), run_info=run_info(seed=args.seed), lm_eval=lm_eval.__version__,
                  settings=dict(tasks=args.tasks, num_fewshot=args.num_fewshot, limit=args.limit, dtype=precision,
                                max_length=lm.max_length, batch_size=args.batch_size, include_path=args.include_path),
                  **{k: res.get(k) for k in ("results", "groups", "n-shot", "n-samples", "versions",
                                             "higher_is_better", "configs")})
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(record, f, indent=1, default=handle_non_serializable)
    print(table)
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description="A nanoscorer checkpoint on lm-evaluation-harness's tasks.")
    p.error = lambda message: sys.exit(f"error: {message}")  # one line, no usage dump
    p.add_argument("ckpt", help="a nanoscorer checkpoint (train.py's, or convert_hf.py import's)")
    p.add_argument("--tasks", nargs="+", required=True, help="lm-eval task or group names, e.g. lambada_openai")
    p.add_argument("--include_path", help="a folder of local task YAMLs (offline: dataset_path json + data_files)")
    p.add_argument("--limit", type=float, help="documents per task (< 1: a fraction); a quick look, not a result")
    p.add_argument("--num_fewshot", type=int, help="examples in each prompt (default: the task's)")
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--max_length", type=int, help="tokens the model reads (default: its block_size)")
    p.add_argument("--bootstrap_iters", type=int, default=1000, help="resamples of each metric's stderr (0: none)")
    p.add_argument("--seed", type=int, default=1234, help="lm-eval's seeds (few-shot sampling)")
    p.add_argument("--out_dir", default="out-harness")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    args = p.parse_args(argv)
    bad = [f"--{k} {getattr(args, k)}" for k in ("batch_size", "max_length", "limit")
           if getattr(args, k) is not None and not getattr(args, k) > 0]
    bad += [f"--{k} {getattr(args, k)}" for k in ("num_fewshot", "bootstrap_iters")
            if getattr(args, k) is not None and getattr(args, k) < 0]
    bad += [f"--limit {args.limit}"] * bool(args.limit and args.limit > 1 and not args.limit.is_integer())  # lm-eval
    if bad:  # ran int(1.5) = 1 document, recorded as 1.5
        p.error(f"{', '.join(bad)}: sizes and --limit must be > 0 (a count past 1 whole), counts >= 0")
    if args.include_path and not os.path.isdir(args.include_path):
        p.error(f"--include_path {args.include_path!r} is not a folder")
    try:
        with folders.results_dir(args.out_dir, OUTPUTS) as out:
            evaluate(args, out)
        print(f"wrote {args.out_dir}/results.md, results.json")
    except (hf.ConvertError, CheckpointError, DataError, folders.FolderError, ValueError, OSError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
