# LSSA with re-weighting (Gao & Spratling 2025, eq. 5): ReLU(A N - O)^p, l1-normalised again, p = 15 (the paper's).
# Quick single-GPU run, configs/softmax.py's recipe and data (its comment has the arithmetic):
#   16 batch x 1,024 tokens x 16 accum = 262,144 tokens/iter x 3,800 iters = 996,147,200 tokens
# ~90 min on one H100 (~1.5x softmax: the two-pass forward and its backward are the slowest kernels; estimated, the
# backward is untimed). The paper's full recipe: configs/paper/lssar.py.
scorer = "lssar"
reweight_p = 15.0
out_dir = "out-lssar"
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
compile = False  # Triton attention: compiling through it is untested on a GPU (train.py says so when asked)
