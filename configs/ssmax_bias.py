# (d) SSMax with a bias (Nakanishi 2025, eq. 4): logits times s*log(n_i) + b, s and b learnable (288 params).
scorer = "ssmax"
ssmax_bias = True
out_dir = "out-ssmax-bias"
