# (c) SSMax with s removed: s = 1 fixed, logits times log(n_i) only.
# ~44 min on one H100 (as configs/ssmax.py, measured). The paper's full recipe: configs/paper/ssmax_nos.py.
base = "softmax.py"  # configs/softmax.py's recipe, data and arithmetic; this file sets what differs
scorer = "ssmax"
ssmax_s_init = 1.0
ssmax_learn_s = False
out_dir = "out-ssmax-nos"
