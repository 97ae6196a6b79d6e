# Forgetting Transformer (Lin et al. 2025, arXiv 2503.02130): softmax plus a learned per-head forget-gate decay, no
# RoPE as the paper. SDPA with the decay as a float mask (memory-efficient kernel): no Triton kernel yet.
base = "softmax.py"  # configs/softmax.py's recipe, data and arithmetic; this file sets what differs
scorer = "fox"
pos = "nope"
out_dir = "out-fox"
compile = False  # the float mask under torch.compile is untested
