# SSA with n learnable too (Naim et al. 2025: "trainable n"), starting from 1.5.
# The SSMax paper's full recipe on 8 GPUs, configs/paper/softmax.py's (its comment has the data and the time):
#   16 batch x 1,024 tokens x 128 accum = 2,097,152 tokens/iter x 200,000 iters = 419,430,400,000 tokens
# Every other field is TrainConfig's default, which is the recipe (written out in configs/paper/softmax.py).
scorer = "ssa"
ssa_n = 1.5
ssa_learn_n = True
out_dir = "out-paper-ssa-learn-n"
dataset = "slimpajama"
