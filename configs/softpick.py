# Softpick (Zuhri et al. 2025, arXiv 2504.20966): ReLU(e^z - 1) / (sum |e^z - 1| + eps): no sink, rows below 1.
# ~84 min on one H100 (measured: 196,947 tokens/s compiled, 0.50x softmax).
base = "softmax.py"  # configs/softmax.py's recipe, data and arithmetic; this file sets what differs
scorer = "softpick"
out_dir = "out-softpick"
