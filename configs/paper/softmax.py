# (a) The baseline at the SSMax paper's full scale (Nakanishi 2025, App. A-B): the 162M Llama-style model (12 layers x
# 12 heads x 768, SwiGLU 2,048, untied head), N = 1,024, softmax attention, 8 GPUs:
#   16 batch x 1,024 tokens x 128 accum = 2,097,152 tokens/iter x 200,000 iters = 419,430,400,000 tokens
#   AdamW (0.9, 0.95), wd 0.1 on matrices, clip 1.0, lr 6e-4 constant after 1,000 warmup iters.
# 3.6e20 FLOP (854,553,600 per token: model.GPT.flops_per_token(1024)): on 8 H100s at the quick run's measured rates
# a GPU (configs/softmax.py), ~1.5 days compiled (393,900 tokens/s, 34 % MFU: add compile=True), ~4 days eager
# (149,744 tokens/s: the default).
# The paper trains on SlimPajama; prepare a slice of it first (10B tokens, ~20 GB, which the run sees ~42 times):
#   python prepare_data.py hf:cerebras/SlimPajama-627B --name slimpajama --max_tokens 1e10
#   torchrun --standalone --nproc_per_node=8 train.py configs/paper/softmax.py
# The quick single-GPU experiment: configs/softmax.py.
scorer = "softmax"
out_dir = "out-paper-softmax"
dataset = "slimpajama"
n_layer = 12
n_head = 12
n_embd = 768
ffn_hidden = 2048
block_size = 1024
batch_size = 16
gradient_accumulation_steps = 128  # global: 16 per GPU on 8
max_iters = 200_000
learning_rate = 6e-4
lr_schedule = "constant"
warmup_iters = 1000
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
eval_interval = 1000
eval_iters = 50
log_interval = 10
