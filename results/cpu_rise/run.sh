#!/bin/bash
# one process at a time, OMP_NUM_THREADS=1: per seed, train softmax and ssmax at the cpu scale (reproduce.py
# SCALES["cpu"], VARIANTS), then eval_rows.py on the pair (512 windows: the gate's 256 + 256 fresh)
cd "$(dirname "$0")/../.."  # the repository root
# s1337 was evaluated with --context 16 32 (its loss_c16 column); s1338-s1341 with --context 32 (time)
export OMP_NUM_THREADS=1
while [ -n "$WAIT_PID" ] && kill -0 "$WAIT_PID" 2>/dev/null; do sleep 5; done
for seed in ${SEEDS:-1337 1338 1339 1340 1341}; do
  for v in softmax ssmax; do
    grep -q '"iter": 250, "train_loss"' out-rise/s$seed/$v/log.jsonl 2>/dev/null && continue
    t0=$(date +%s)
    .venv/bin/python train.py n_layer=4 n_head=2 n_embd=64 ffn_hidden=176 block_size=128 batch_size=8 \
      gradient_accumulation_steps=1 max_iters=250 learning_rate=0.003 warmup_iters=25 lr_schedule="'constant'" \
      eval_interval=125 eval_iters=8 log_interval=50 device="'cpu'" dataset=english data_dir=data seed=$seed \
      scorer="'$v'" out_dir="'out-rise/s$seed/$v'" > out-rise/train_s${seed}_$v.log 2>&1
    echo "{\"step\": \"train $v s$seed\", \"rc\": $?, \"wall_s\": $(( $(date +%s) - t0 ))}" >> out-rise/times.jsonl
  done
  [ -f out-rise/rows/s$seed/summary.json ] && continue
  t0=$(date +%s)
  .venv/bin/python eval_rows.py --ckpt out-rise/s$seed/softmax/ckpt.pt out-rise/s$seed/ssmax/ckpt.pt \
    --labels softmax ssmax --data data/english --num_seqs 512 --seed 0 --context 32 --batch_size 32 \
    --out_dir out-rise/rows/s$seed > out-rise/rows_s$seed.log 2>&1
  echo "{\"step\": \"eval_rows s$seed\", \"rc\": $?, \"wall_s\": $(( $(date +%s) - t0 ))}" >> out-rise/times.jsonl
done
