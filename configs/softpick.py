# Softpick (Zuhri et al. 2025, arXiv 2504.20966): ReLU(e^z - 1) / (sum |e^z - 1| + eps): no sink, rows below 1.
# ~50 min on one H100 (measured 2026-11-27: 329,403 tokens/s compiled, 0.84x softmax).
base = "softmax.py"  # configs/softmax.py's recipe, data and arithmetic; this file sets what differs
scorer = "softpick"
out_dir = "out-softpick"
