# (c) SSMax with s removed: s = 1 fixed, logits times log(n_i) only.
scorer = "ssmax"
ssmax_s_init = 1.0
ssmax_learn_s = False
out_dir = "out-ssmax-nos"
