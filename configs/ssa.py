# Scaled Signed Averaging (Naim et al. 2025, eq. 5): weights (1 + b|z|)^(sgn(z) n) normalised; b learnable per
# layer and head, n = 1.5 fixed (the paper's best GPT-2 setting). Recipe: configs/softmax.py's.
scorer = "ssa"
ssa_b_init = 1.0
ssa_n = 1.5
out_dir = "out-ssa"
