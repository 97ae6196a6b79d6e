# Softmax -> SSMax switch (Nakanishi 2025, variants e and f): the weights of a softmax checkpoint are kept and every
# attention layer becomes SSMax with s0 = 1 / mean(log n) over the training length (0.168 for 1,024), set by train.py
# when the scorer changes (override ssmax_s_init to choose another). Quick single-GPU scale of configs/softmax.py:
#   (f) during pretraining: softmax for the first 87.5 % (3,325 of 3,800 iters, as the paper's 175,000 of 200,000),
#       then SSMax for the rest with a fresh warmup (the constant lr makes the two legs one softmax run):
#         python train.py configs/softmax.py max_iters=3325 && cp out-softmax/ckpt.pt out-softmax/ckpt_3325.pt
#         python train.py configs/softmax.py resume=True        # softmax on to 3,800 (a resume is exact)
#         python train.py configs/ssmax_swap.py                 # SSMax from ckpt_3325.pt, ~6 min on one H100:
#   16 batch x 1,024 tokens x 16 accum = 262,144 tokens/iter x 475 iters = 124,518,400 tokens
#       This file's leg restarts the data stream and AdamW. Exactly the softmax run's last leg with another scorer (its
#       batches, AdamW's state; no new warmup) is a resume that switches the scorer (train.py's docstring):
#         mkdir -p out-ssmax-f && cp out-softmax/ckpt_3325.pt out-ssmax-f/ckpt.pt
#         python train.py init_from=resume out_dir=out-ssmax-f scorer=ssmax max_iters=3800 overwrite=True
#   (e) after pretraining, no further training (max_iters=0 only converts, evaluates and saves):
#         python train.py configs/ssmax_swap.py init_from=out-softmax/ckpt.pt max_iters=0 out_dir=out-ssmax-e
# The paper's scale: configs/paper/ssmax_swap.py.
base = "softmax.py"  # configs/softmax.py's recipe, data and arithmetic; this file sets what differs
scorer = "ssmax"
init_from = "out-softmax/ckpt_3325.pt"
max_iters = 475
warmup_iters = 50  # fresh, ~10 % of this leg (the paper: 1,000 of its 25,000)
eval_interval = 100
out_dir = "out-ssmax-swap"
