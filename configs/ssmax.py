# (b) SSMax (Nakanishi 2025, eq. 2): logits of row i times s*log(n_i), s learnable per layer and head (144 params).
# ~44 min on one H100 (measured: 381,315 tokens/s compiled, 0.968x softmax). Full recipe: configs/paper/ssmax.py.
base = "softmax.py"  # configs/softmax.py's recipe, data and arithmetic; this file sets what differs
scorer = "ssmax"
out_dir = "out-ssmax"
