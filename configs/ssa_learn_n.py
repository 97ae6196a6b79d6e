# SSA with n learnable too (Naim et al. 2025: "trainable n"), starting from 1.5.
scorer = "ssa"
ssa_n = 1.5
ssa_learn_n = True
out_dir = "out-ssa-learn-n"
