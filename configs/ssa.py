# Scaled Signed Averaging (Naim et al. 2025, eq. 5): weights (1 + b|z|)^(sgn(z) n) normalised; b learnable per
# layer and head, n = 1.5 fixed (the paper's best GPT-2 setting).
# ~75 min on one H100 (~1.2x softmax: the SSA kernels are ~2x softmax's). The paper's full recipe: configs/paper/ssa.py.
base = "softmax.py"  # configs/softmax.py's recipe, data and arithmetic; this file sets what differs
scorer = "ssa"
ssa_b_init = 1.0
ssa_n = 1.5
out_dir = "out-ssa"
compile = False  # Triton attention: compiling through it is untested on a GPU (train.py says so when asked)
