# (c) SSMax with s removed: s = 1 fixed, logits times log(n_i) only.
# The SSMax paper's full recipe on 8 GPUs, configs/paper/softmax.py's (its comment has the data and the time):
#   16 batch x 1,024 tokens x 128 accum = 2,097,152 tokens/iter x 200,000 iters = 419,430,400,000 tokens
scorer = "ssmax"
ssmax_s_init = 1.0
ssmax_learn_s = False
out_dir = "out-paper-ssmax-nos"
dataset = "slimpajama"
n_layer = 12
n_head = 12
n_embd = 768
ffn_hidden = 2048
block_size = 1024
batch_size = 16
gradient_accumulation_steps = 128  # global: 16 per GPU on 8
max_iters = 200_000
learning_rate = 6e-4
lr_schedule = "constant"
warmup_iters = 1000
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
eval_interval = 1000
eval_iters = 50
log_interval = 10
