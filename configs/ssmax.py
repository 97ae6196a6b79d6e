# (b) SSMax (Nakanishi 2025, eq. 2): logits of row i times s*log(n_i), s learnable per layer and head (144 params).
# Everything else is configs/softmax.py's recipe (TrainConfig's defaults).
scorer = "ssmax"
out_dir = "out-ssmax"
