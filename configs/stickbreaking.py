# Stick-breaking attention (Tan et al. 2024, arXiv 2410.17980), no positional encoding as the paper. On a GPU
# backend=auto runs its Triton kernels (kernels_stick.py), still several times slower than the row-template ones:
# ~141 min on one H100 (measured: 117,893 tokens/s compiled, 0.30x softmax).
base = "softmax.py"  # configs/softmax.py's recipe, data and arithmetic; this file sets what differs
scorer = "stickbreaking"
pos = "nope"
out_dir = "out-stickbreaking"
