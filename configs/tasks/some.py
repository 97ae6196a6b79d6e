# The SSA paper's quantifier task "some" (Naim et al. 2025, sec. 3-4) on reals x ~ N(0, 1) through a linear embedding:
# at each position, is some number so far positive? Balanced: half the sequences hold exactly one counterexample
# (every) or witness (some) at a uniform position. NoPE (the answer depends on no position). The paper trains lengths
# 1-40 and tests 10-200 and sigma 1-10; here every prefix 1..N = 32 is trained, tests reach 16 N = 512, sigma 1/3/10.
# 2 layers x 2 heads x 32 wide; 1,024 values/iter x 600 iters.
task = "some"
pos = "nope"
out_dir = "out-some"
n_head = 2
n_embd = 32
ffn_hidden = 64
block_size = 32
max_iters = 600
lr_decay_iters = 600
eval_interval = 300
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
