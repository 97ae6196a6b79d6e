# Scaled Signed Averaging (Naim et al. 2025, eq. 5): weights (1 + b|z|)^(sgn(z) n) normalised; b learnable per
# layer and head, n = 1.5 fixed (the paper's best GPT-2 setting).
# ~51 min on one H100 (measured 2026-11-27: 324,183 tokens/s compiled, 0.82x softmax).
# The paper's full recipe: configs/paper/ssa.py.
base = "softmax.py"  # configs/softmax.py's recipe, data and arithmetic; this file sets what differs
scorer = "ssa"
ssa_b_init = 1.0
ssa_n = 1.5
out_dir = "out-ssa"
