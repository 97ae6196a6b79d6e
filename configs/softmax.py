# (a) the baseline: the SSMax paper's 162M Llama-style model and recipe (Nakanishi 2025, App. A-B) with softmax.
# TrainConfig's defaults ARE that recipe, so each paper config only names its scorer:
#   16 batch x 128 accum = 2,048 sequences x 1,024 tokens = 2,097,152 tokens/iter; 200,000 iters = ~419B tokens;
#   AdamW (0.9, 0.95), wd 0.1 on matrices, clip 1.0, lr 6e-4 constant after 1,000 warmup iters.
# The paper trains on SlimPajama; offline, the embedded Shakespeare (1.4M tokens) is the default dataset. For the
# real thing: python prepare_data.py hf:cerebras/SlimPajama-627B --name slimpajama --max_tokens 1e10
#          torchrun --standalone --nproc_per_node=8 train.py configs/softmax.py dataset=slimpajama
scorer = "softmax"
out_dir = "out-softmax"
