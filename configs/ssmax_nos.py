# (c) SSMax with s removed: s = 1 fixed, logits times log(n_i) only.
# Quick single-GPU run, configs/softmax.py's recipe and data (its comment has the arithmetic):
#   16 batch x 1,024 tokens x 16 accum = 262,144 tokens/iter x 3,800 iters = 996,147,200 tokens
# ~1 h on one H100. The paper's full recipe: configs/paper/ssmax_nos.py.
scorer = "ssmax"
ssmax_s_init = 1.0
ssmax_learn_s = False
out_dir = "out-ssmax-nos"
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
