# (a) The baseline, softmax: a quick single-GPU experiment on real web text. The SSMax paper's 162M Llama-style model
# (Nakanishi 2025, App. A: 12 layers x 12 heads x 768, SwiGLU 2,048, untied head) at N = 1,024 tokens, with its
# optimizer (AdamW (0.9, 0.95), wd 0.1 on matrices, clip 1.0, lr 6e-4 constant after warmup), for ~1B tokens:
#   16 batch x 1,024 tokens x 16 accum = 262,144 tokens/iter x 3,800 iters = 996,147,200 tokens
# Time on one H100: 854,553,600 FLOP/token (model.GPT.flops_per_token(1024): the untied embedding is a lookup, no
# matmul) x 996,147,200 tokens = 8.5e17 FLOP. Measured (bench/train_speed.py, H100, 2026-11-27, 30 steps at this
# batch): ~393,900 tokens/s compiled, 34 % MFU of 989 TFLOP/s bf16 (eager 149,744) = 42 min, plus ~2 min of evals and
# checkpoints. The Triton scorers, custom operators inside the compiled graph, take 1.2-1.5x as long (2026-11-27;
# 2-3.5x on 2026-11-26, when their kernels ran outside it).
# Data: dataset=fineweb_edu, the first 1B tokens of HuggingFaceFW/fineweb-edu sample-10BT, streamed on first use
# (prepare_data.py; ~3 GB): about one epoch of random windows, drawn with replacement as nanoGPT's (~63 % of train's
# tokens are read at least once, ~37 % of what is read repeats). Offline: dataset=english (2.4M tokens: overfits long
# before 3,800 iters; lower max_iters). With torchrun, run `python prepare_data.py fineweb_edu` first.
# The paper's full 419B-token, 8-GPU recipe: configs/paper/softmax.py.
scorer = "softmax"
out_dir = "out-softmax"
dataset = "fineweb_edu"
n_layer = 12
n_head = 12
n_embd = 768
ffn_hidden = 2048
block_size = 1024
batch_size = 16
gradient_accumulation_steps = 16  # global: torchrun divides it among the GPUs
max_iters = 3800
learning_rate = 6e-4
lr_schedule = "constant"  # the paper's; it also lets the (f) switch branch off at any iteration (ssmax_swap.py)
warmup_iters = 200  # 52M tokens, 5 % of the run
eval_interval = 200  # 20 points on the loss curve, ~2 s of eval each (2 x 40 batches)
eval_iters = 40
log_interval = 10
compile = True  # SDPA attention: tested on the CPU (tests/test_compile.py); train.py prints the compile time
