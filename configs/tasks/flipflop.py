# Flip-flop language modelling (Liu et al. 2023): write/read/ignore instructions with bits, the bit after a read is
# the last written one. Trained on FFL(0.8) (P(ignore) = 0.8), tested on sparse FFL(0.98) and dense FFL(0.1).
# RoPE (the most recent write is found by position). N = 32 tokens (16 instructions), tested up to 16 N = 512.
# 2 layers x 4 heads x 64 wide (~0.1M parameters); 1,024 tokens/iter x 800 iters.
task = "flipflop"
pos = "rope"
out_dir = "out-flipflop"
n_head = 4
n_embd = 64
ffn_hidden = 128
block_size = 32
max_iters = 800
lr_decay_iters = 800
eval_interval = 400
n_layer = 2
batch_size = 32
gradient_accumulation_steps = 1
learning_rate = 3e-3
weight_decay = 0.1
warmup_iters = 50
lr_schedule = "cosine"
min_lr = 3e-4
eval_iters = 4
log_interval = 100
device = "cpu"
