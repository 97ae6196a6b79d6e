# Retrieval fine-tuning before the needle test (Nakanishi 2025, Sec. 4.3), the paper's settings: SQuAD 2.0 pairs, loss
# summed over the answer tokens, AdamW (0.9, 0.999), no weight decay, lr 2e-5 cosine with one epoch of warmup,
# 10 epochs, 128 sequences of 1,024 tokens per iteration (every sequence padded to the checkpoint's block_size):
#   16 batch x 1,024 tokens x 8 accum = 131,072 tokens/iter
# SQuAD 2.0's ~86,800 answerable questions, 5 % held out for the val loss (sft_val_frac; 0: train on all, val then
# the training examples), are 645 iters an epoch x 10 = 6,450 iters = 845M tokens: for the 162M model on one H100 at
# configs/softmax.py's measured rates, ~36 min compiled (393,900 tokens/s: add compile=True) or ~94 min eager
# (149,744: the default); sft_epochs=2 gives a first look in ~7 / ~19 min.
#   python needle.py sft_data                      # -> out-needle/sft_squad.jsonl (or --synthetic N, offline)
#   python train.py configs/sft.py                 # the quick run's out-ssmax/ckpt.pt -> out-ssmax-sft
#   python train.py configs/sft.py init_from=out-softmax/ckpt.pt out_dir=out-softmax-sft
# init_from takes the checkpoint's scorer and model: name a scorer here only to switch it.
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
out_dir = "out-ssmax-sft"
