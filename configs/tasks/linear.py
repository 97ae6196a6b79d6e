# In-context linear functions (Garg et al. 2022; the SSA paper, Naim et al. 2025): x1, y1, ..., x40, y40 with
# y = a x + b, a, b ~ N(0, 1), x ~ N(0, 1); each y is predicted at its x from the 3rd point on (eq. 2's MSE). Tested
# with a, b ~ N(0, sigma), sigma = 1, 2, 4, and with more points. Inputs: (x, y, is an x) through a linear embedding.
# RoPE (x_k is paired with y_k by position). N = 80 tokens = 40 points.
# 2 layers x 4 heads x 64 wide; 32 x 80 = 2,560 values/iter x 600 iters.
task = "linear"
pos = "rope"
out_dir = "out-linear"
n_head = 4
n_embd = 64
ffn_hidden = 128
block_size = 80
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
