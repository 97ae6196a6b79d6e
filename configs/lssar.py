# LSSA with re-weighting (Gao & Spratling 2025, eq. 5): ReLU(A N - O)^p, l1-normalised again, p = 15 (the paper's).
# ~90 min on one H100 (~1.5x softmax: the two-pass forward and its backward are the slowest kernels; estimated, the
# backward is untimed). The paper's full recipe: configs/paper/lssar.py.
base = "softmax.py"  # configs/softmax.py's recipe, data and arithmetic; this file sets what differs
scorer = "lssar"
reweight_p = 15.0
out_dir = "out-lssar"
compile = False  # Triton attention: compiling through it is untested on a GPU (train.py says so when asked)
