# (d) SSMax with a bias (Nakanishi 2025, eq. 4): logits times s*log(n_i) + b, s and b learnable (288 params).
# ~44 min on one H100 (as configs/ssmax.py, measured). The paper's full recipe: configs/paper/ssmax_bias.py.
base = "softmax.py"  # configs/softmax.py's recipe, data and arithmetic; this file sets what differs
scorer = "ssmax"
ssmax_bias = True
out_dir = "out-ssmax-bias"
