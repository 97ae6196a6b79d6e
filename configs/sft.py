# Retrieval fine-tuning before the needle test (Nakanishi 2025, Sec. 4.3): SQuAD 2.0 pairs, loss summed over the
# answer tokens, AdamW (0.9, 0.999), no weight decay, lr 2e-5 cosine with one epoch of warmup, 10 epochs,
# 128 sequences of 1,024 tokens per iteration (16 x 8 accum).
#   python needle.py sft_data                      # -> out-needle/sft_squad.jsonl (or --synthetic N, offline)
#   python train.py configs/sft.py init_from=out-ssmax/ckpt.pt out_dir=out-ssmax-sft
# init_from takes the checkpoint's scorer: name a scorer here only to switch it.
init_from = "out-ssmax/ckpt.pt"
sft_data = "out-needle/sft_squad.jsonl"
sft_epochs = 10  # max_iters = lr_decay_iters = 10 epochs, warmup_iters = 1 epoch
batch_size = 16
gradient_accumulation_steps = 8
learning_rate = 2e-5
min_lr = 0.0
lr_schedule = "cosine"
beta2 = 0.999
weight_decay = 0.0
eval_interval = 500
eval_iters = 20
out_dir = "out-sft"
