# A character-level model that learns to copy from distant context on 2 CPU cores (issue #32; RESULTS.md, "characters").
# english_char: the embedded Shakespeare + King James Bible in characters (85 ids). Every training window repeats a
# 16-character code drawn at random from its own characters, at a distance drawn uniformly over what the window holds
# (lib/longrange.py); val stays plain text. With copies in only 25 % or 50 % of windows, no model learnt to copy within
# 3,000 iterations; with every window, the loss on the codes' second copies drops between iterations ~1,100 and ~1,900.
# 2 layers x 4 heads x 128 wide (~0.42M parameters), N = 64.
# 32 batch x 64 tokens = 2,048 tokens/iter x 3,000 iters = 6,144,000 tokens; ~14,000 tokens/s on one core (~7 min).
# Then: python eval_copy.py out-char/ckpt.pt --span 16   (the copy gate: 2nd copy / control <= 0.5 at 0.5 N)
out_dir = "out-char"
dataset = "english_char"
copy_frac = 1.0
copy_span = 16
copy_kind = "random"
n_layer = 2
n_head = 4
n_embd = 128
ffn_hidden = 352
block_size = 64
batch_size = 32
gradient_accumulation_steps = 1
learning_rate = 3e-3
lr_schedule = "constant"
warmup_iters = 50
max_iters = 3000
eval_interval = 1000
eval_iters = 8
log_interval = 250
device = "cpu"
