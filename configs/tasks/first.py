# FIRST (Chiang & Cholak 2022): the answer at every position is the first bit after <bos>. Their model: d_model 16,
# FFN 64, 2 layers, Adam lr 3e-4. Ours is a little wider so that every scorer reaches the gate at N in the budget.
# 2 layers x 2 heads x 32 wide (~21k parameters); N = 32, tested up to 16 N = 512.
# 32 sequences x 32 tokens = 1,024 tokens/iter x 1,500 iters (LSSAR needs them to reach the gate; all get them).
task = "first"
pos = "nope"  # content and the causal mask only: no RoPE-extrapolation confound
out_dir = "out-first"
n_layer = 2
n_head = 2
n_embd = 32
ffn_hidden = 64
block_size = 32
batch_size = 32
gradient_accumulation_steps = 1
learning_rate = 3e-3
weight_decay = 0.1
warmup_iters = 50
lr_schedule = "cosine"
max_iters = 1500
lr_decay_iters = 1500
min_lr = 3e-4
eval_interval = 750
eval_iters = 4
log_interval = 100
device = "cpu"
