# LSSA with re-weighting (Gao & Spratling 2025, eq. 5): ReLU(A N - O)^p, l1-normalised again, p = 15 (the paper's).
scorer = "lssar"
reweight_p = 15.0
out_dir = "out-lssar"
