# SSA with n learnable too (Naim et al. 2025: "trainable n"), starting from 1.5.
# ~51 min on one H100 (as configs/ssa.py, measured). The paper's full recipe: configs/paper/ssa_learn_n.py.
base = "softmax.py"  # configs/softmax.py's recipe, data and arithmetic; this file sets what differs
scorer = "ssa"
ssa_n = 1.5
ssa_learn_n = True
out_dir = "out-ssa-learn-n"
