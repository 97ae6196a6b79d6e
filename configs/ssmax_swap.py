# Softmax -> SSMax switch (Nakanishi 2025, variants e and f): the weights of a softmax checkpoint are kept and every
# attention layer becomes SSMax with s0 = 1 / mean(log n) over the training length (0.168 for 1,024), set by train.py
# when the scorer changes (override ssmax_s_init to choose another).
#   (f) during pretraining: softmax for 175,000 iters (configs/softmax.py max_iters=175000), then 25,000 SSMax iters
#       with a fresh 1,000-iter warmup:   python train.py configs/ssmax_swap.py init_from=out-softmax/ckpt.pt
#   (e) after pretraining, no further training (max_iters=0 only converts, evaluates and saves):
#       python train.py configs/ssmax_swap.py init_from=out-softmax/ckpt.pt max_iters=0 out_dir=out-ssmax-e
scorer = "ssmax"
init_from = "out-softmax/ckpt.pt"
max_iters = 25_000
warmup_iters = 1_000
out_dir = "out-ssmax-swap"
