# Softmax -> SSMax switch (Nakanishi 2025, variants e and f) at the paper's scale: the weights of a softmax checkpoint
# are kept and every attention layer becomes SSMax with s0 = 1 / mean(log n) over the training length (0.168 for
# 1,024), set by train.py when the scorer changes (override ssmax_s_init to choose another).
#   (f) during pretraining: softmax for 175,000 iters (87.5 %), then 25,000 SSMax iters with a fresh 1,000-iter
#       warmup, from a copy of the softmax run at 175,000 (its ckpt.pt goes on to 200,000: not the start of (f)):
#         torchrun --standalone --nproc_per_node=8 train.py configs/paper/softmax.py max_iters=175000
#         cp out-paper-softmax/ckpt.pt out-paper-softmax/ckpt_175000.pt
#         torchrun --standalone --nproc_per_node=8 train.py configs/paper/softmax.py resume=True   # on to 200,000
#         torchrun --standalone --nproc_per_node=8 train.py configs/paper/ssmax_swap.py
#   16 batch x 1,024 tokens x 128 accum = 2,097,152 tokens/iter x 25,000 iters = 52,428,800,000 tokens
#   (e) after pretraining, no further training (max_iters=0 only converts, evaluates and saves):
#         python train.py configs/paper/ssmax_swap.py init_from=out-paper-softmax/ckpt.pt max_iters=0 \
#             out_dir=out-paper-ssmax-e
# Every other field is TrainConfig's default, which is the recipe (written out in configs/paper/softmax.py).
scorer = "ssmax"
init_from = "out-paper-softmax/ckpt_175000.pt"
max_iters = 25_000
warmup_iters = 1_000
out_dir = "out-paper-ssmax-swap"
dataset = "slimpajama"
