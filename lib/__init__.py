"""
What the scripts share; nothing here is run directly.

    config.py             TrainConfig, config files and key=value overrides, their checks
    cost.py               a run's cost on a CPU, checked before it starts (train.py)
    checkpoint.py         run_info (provenance), atomic save, safe read (weights_only), the model a checkpoint builds,
                          what a run's out_dir may hold before it writes
    provenance.py         the data a run trained on: its splits' sha256 in data_state, a resume on data prepared again
                          refused, what an evaluation records of the data it reads (data_provenance)
    dataset.py            a corpus -> data/<name>/{train,val}.bin, a dataset fetched on first use, its readers
    meta.py               a prepared dataset's meta.json read and checked, its splits' sizes against it
    vocab.py              GPT-2's BPE offline, the character vocabulary, an imported model's tokenizer; which one a
                          dataset or checkpoint reads, by content
    longrange.py          long-range structure in text: train.py's repeated spans (copy_frac), the copy gate's sequences
    corpora.py            the sources dataset.py reads: embedded corpora, Hugging Face datasets, local files
    retrieval.py          needle and passkey prompts, answer grading, the needle score, the fine-tuning sets
    sft.py                SFT data in training (train.py's sft_data): held-out val examples, answer-only batches, epochs
    tracking.py           log.jsonl, loss.png, progress lines, MFU, wandb
    progress.py           an evaluation's progress: tqdm's bar on a terminal, else a line every 30 s with its ETA
    folders.py            who writes where: one writer per folder (a lock), results folders, write_json, synced renames
    rescale.py            training-free rescalings of a softmax model's logits (qwen, yarn, llama4) for the evals
    compare.py            the statistics: paired bootstrap and seed-level t intervals, sign-flip p, Holm, horizons, CSVs
    figures.py            the evaluations' figures: one colour a model, legends beside, seeds shown; train.py --compare
    runs.py               a reproduction's steps: reuse what was done as asked, keep what the report needs of the runs
    plans.py              pre-registration git can check: --commit-results needs results/<name>/plan.md committed first
    lm_suite.py           the language-model suite of reproduce.py: scales, variants, each seed's steps
    hf.py                 Hugging Face Llama-family checkpoints in (convert_hf.py import), what transformers can run
    hf_export.py          a checkpoint out as a Hugging Face folder (convert_hf.py export, eval_harness.py)
    report.py             a language-model reproduction read back: summary.json, gates, tables.md
    synthetic_suite.py    what the synthetic suite runs: its settings, entries (task, lengths, seeds), the GPU scale
    synthetic.py          the synthetic suite's runs in worker processes, reuse and refusal of finished steps
    synthetic_report.py   the suite's statistics with the seed as the unit, verdicts, summary.json, tables.md
    synthetic_figures.py  the suite's figures
    rereport.py           a results folder's summary.json and tables.md again from its data (reproduce.py --rereport)
"""
