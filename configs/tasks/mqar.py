# MQAR, Zoology's multi-query associative recall (Arora et al. 2023): task_pairs = 4 pairs "k v" of 16 keys and 16
# values first, then the 4 keys queried again among random filler; the answer is the value. The queries sit anywhere
# in training (every n <= N is trained) and in the last 4 positions at test (n ~ L). RoPE: recall by position needs
# it (the value is the token after the key). N = 64, tested up to 16 N = 1,024.
# 2 layers x 4 heads x 64 wide (~0.1M parameters); 32 x 64 = 2,048 tokens/iter x 800 iters.
task = "mqar"
pos = "rope"
out_dir = "out-mqar"
n_head = 4
n_embd = 64
ffn_hidden = 128
block_size = 64
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
