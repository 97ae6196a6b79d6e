# (b) SSMax (Nakanishi 2025, eq. 2): logits of row i times s*log(n_i), s learnable per layer and head (144 params).
# ~44 min on one H100 (measured: 379,308 tokens/s compiled, 0.971x softmax). The paper's full recipe: configs/paper/ssmax.py.
base = "softmax.py"  # configs/softmax.py's recipe, data and arithmetic; this file sets what differs
scorer = "ssmax"
out_dir = "out-ssmax"
