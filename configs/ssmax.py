# (b) SSMax (Nakanishi 2025, eq. 2): logits of row i times s*log(n_i), s learnable per layer and head (144 params).
# Quick single-GPU run, configs/softmax.py's recipe and data (its comment has the arithmetic):
#   16 batch x 1,024 tokens x 16 accum = 262,144 tokens/iter x 3,800 iters = 996,147,200 tokens
# ~1 h on one H100. The paper's full recipe: configs/paper/ssmax.py.
scorer = "ssmax"
out_dir = "out-ssmax"
dataset = "fineweb_edu"
n_layer = 12
n_head = 12
n_embd = 768
ffn_hidden = 2048
block_size = 1024
batch_size = 16
gradient_accumulation_steps = 16
max_iters = 3800
learning_rate = 6e-4
lr_schedule = "constant"
warmup_iters = 200
eval_interval = 200
eval_iters = 40
log_interval = 10
compile = True  # SDPA attention: tested on the CPU (tests/test_compile.py); train.py prints the compile time
