# The README's main job: a tiny SSMax model on the embedded Shakespeare in about three minutes on 2 CPU cores.
# 4 layers x 4 heads x 128 wide (~13.7M parameters, 12.9M of them the untied embedding and head of GPT-2's vocabulary);
# 8 batch x 128 tokens = 1,024 tokens/iter x 200 iters = 204,800 tokens (~0.14 epoch of the 1.4M training tokens).
# Measured on a 2-core AMD EPYC: ~1,300 tokens/s, so about 160 s of training plus evals and start-up.
scorer = "ssmax"
out_dir = "out-quick"
n_layer = 4
n_head = 4
n_embd = 128
ffn_hidden = 352
block_size = 128
batch_size = 8
gradient_accumulation_steps = 1
learning_rate = 2e-3  # a tiny model tolerates (and needs, in 200 steps) a larger lr than the paper's 6e-4
warmup_iters = 20
lr_schedule = "cosine"
lr_decay_iters = 200
min_lr = 2e-4
max_iters = 200
eval_interval = 100
eval_iters = 10
log_interval = 20
overwrite = True  # the quickstart may be run again: a new run replaces out-quick
