# Length-Scaled Softplus Attention (Gao & Spratling 2025, eq. 4): softplus(log(d) log(N) cos(q, k)), l1-normalised.
# ~54 min on one H100 (measured 2026-11-27: 308,334 tokens/s compiled, 0.78x softmax).
# Full recipe: configs/paper/lssa.py.
base = "softmax.py"  # configs/softmax.py's recipe, data and arithmetic; this file sets what differs
scorer = "lssa"
out_dir = "out-lssa"
