# (c) SSMax with s removed: s = 1 fixed, logits times log(n_i) only.
# The SSMax paper's full recipe on 8 GPUs, configs/paper/softmax.py's (its comment has the data and the time):
#   16 batch x 1,024 tokens x 128 accum = 2,097,152 tokens/iter x 200,000 iters = 419,430,400,000 tokens
# Every other field is TrainConfig's default, which is the recipe (written out in configs/paper/softmax.py).
scorer = "ssmax"
ssmax_s_init = 1.0
ssmax_learn_s = False
out_dir = "out-paper-ssmax-nos"
dataset = "slimpajama"
