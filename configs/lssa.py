# Length-Scaled Softplus Attention (Gao & Spratling 2025, eq. 4): softplus(log(d) log(N) cos(q, k)), l1-normalised.
scorer = "lssa"
out_dir = "out-lssa"
