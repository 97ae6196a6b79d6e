# LSSA with re-weighting (Gao & Spratling 2025, eq. 5): ReLU(A N - O)^p, l1-normalised again, p = 15 (the paper's).
# ~62 min on one H100 (measured 2026-11-27: 266,829 tokens/s compiled, 0.68x softmax: the two-pass forward and its
# backward are the slowest kernels). The paper's full recipe: configs/paper/lssar.py.
base = "softmax.py"  # configs/softmax.py's recipe, data and arithmetic; this file sets what differs
scorer = "lssar"
reweight_p = 15.0
out_dir = "out-lssar"
