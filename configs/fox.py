# Forgetting Transformer (Lin et al. 2025, arXiv 2503.02130): softmax plus a learned per-head forget-gate decay, no
# RoPE as the paper. SDPA with the decay as a float mask (memory-efficient kernel); backend=triton runs the fused
# kernel (checked under the interpreter only, so auto keeps SDPA until a GPU run checks bf16 and speed).
base = "softmax.py"  # configs/softmax.py's recipe, data and arithmetic; this file sets what differs
scorer = "fox"
pos = "nope"
out_dir = "out-fox"
compile = False  # the float mask under torch.compile is untested (its eager run: 90,031 tokens/s on an H100, ~184 min)
