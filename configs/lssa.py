# Length-Scaled Softplus Attention (Gao & Spratling 2025, eq. 4): softplus(log(d) log(N) cos(q, k)), l1-normalised.
# ~75 min on one H100 (~1.2x softmax: the LSSA kernels are ~2x softmax's). Full recipe: configs/paper/lssa.py.
base = "softmax.py"  # configs/softmax.py's recipe, data and arithmetic; this file sets what differs
scorer = "lssa"
out_dir = "out-lssa"
compile = False  # Triton attention: compiling through it is untested on a GPU (train.py says so when asked)
