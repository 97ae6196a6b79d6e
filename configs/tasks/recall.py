# Content-only key-value recall: task_pairs = 4 tokens "key:value" (16 keys x 16 values) at random positions among
# random filler, each queried by its key later; a longer sequence only adds filler, so n grows and nothing else does.
# NoPE by default (no RoPE-extrapolation confound); the suite also runs pos="rope" (plain theta, theta x L/N, NTK).
# 2 layers x 4 heads x 64 wide (~0.1M parameters); N = 32, tested up to 16 N = 512.
# 32 x 32 = 1,024 tokens/iter x 800 iters. (LSSAR misses the gate at N: 0.88 after 800 iters, 0.86 after 1,600,
# 0.95 after 3,000 in single-seed trials; more steps for all would not fit the suite's hour.)
task = "recall"
pos = "nope"
out_dir = "out-recall"
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
