# Scaled Signed Averaging (Naim et al. 2025, eq. 5): weights (1 + b|z|)^(sgn(z) n) normalised; b learnable per
# layer and head, n = 1.5 fixed (the paper's best GPT-2 setting).
# The SSMax paper's full recipe on 8 GPUs, configs/paper/softmax.py's (its comment has the data and the time):
#   16 batch x 1,024 tokens x 128 accum = 2,097,152 tokens/iter x 200,000 iters = 419,430,400,000 tokens
# Every other field is TrainConfig's default, which is the recipe (written out in configs/paper/softmax.py).
scorer = "ssa"
ssa_b_init = 1.0
ssa_n = 1.5
out_dir = "out-paper-ssa"
dataset = "slimpajama"
