#!/usr/bin/env bash
# What a session with the GPU machine runs (docs/gpu.md, "Checking on the GPU machine"): the
# binaries are built here, carried there in one tarball, and run there with the CUDA, cuDNN and
# NCCL libraries that machine has. Device time is scarce (30 minutes a session, 10 per command),
# so `check` does the whole first look in one command and writes everything under $OUT.
#
#   bash tools/gpu_session.sh pack          here: build-gpu for sm_90 (no oneDNN, no MPI), the
#                                           Debian libraries the binaries need, .gpu/run.tgz
#   bash tools/gpu_session.sh check         there (run with carry [".gpu"]): nvidia-smi, every
#                                           test_cuda test, a gpt2-tiny-gpu training smoke run
#                                           and generate --device cuda on its checkpoint,
#                                           and short Strata-only step benchmarks of GPT-2 124M
#                                           (as built, with the per-op device-time table of
#                                           --profile, and with STRATA_GRAD_INTO_BUFFER=off)
#   bash tools/gpu_session.sh bench MODELS [ARGS...]
#                                           there: tools/bench/run_gpt2_cuda.sh --fill for MODELS
#                                           (comma-separated) against PyTorch eager and compile
#   bash tools/gpu_session.sh switches [MODEL [ARGS...]]
#                                           there: Strata-only step benchmarks of MODEL (gpt2 by
#                                           default; ARGS e.g. --B 16) with the per-op table of
#                                           --profile, as built and with each switch that picks
#                                           an older path (STRATA_NORM_GRADS=separate,
#                                           STRATA_GRAD_INTO_BUFFER=off): what each path buys
#   bash tools/gpu_session.sh dgelu [MODEL [ARGS...]]
#                                           there: Strata-only step benchmarks of MODEL (gpt2-xl
#                                           --B 16 by default) with the per-op table, the MLP's
#                                           GELU gradient as a plain GEMM and Strata's kernel
#                                           (the default) and with cuBLASLt's DGELU_BGRAD
#                                           epilogue (STRATA_LINEAR_DGELU=epilogue): the
#                                           linear_backward_gelu rows decide the default
#   bash tools/gpu_session.sh ce [MODEL [ARGS...]]
#                                           there: Strata-only step benchmarks of MODEL (gpt2
#                                           --B 64 by default) with the per-op table, the fused
#                                           cross-entropy with its row in registers (the default)
#                                           and read twice (STRATA_CE_ROW_CACHE=off): the
#                                           cross_entropy_fused rows give each one's GB/s and %
#                                           of bound (the same bits either way)
#   bash tools/gpu_session.sh triage [FILTER]
#                                           there: each test_cuda test of FILTER (a gtest
#                                           filter; every test by default) in a process of its
#                                           own with CUDA_LAUNCH_BLOCKING=1, the first failures
#                                           again under compute-sanitizer (tools/gpu_triage.sh):
#                                           which tests fail alone, and where, after `check`
#                                           printed failures (it writes their filter to
#                                           triage_filter.txt)
#   bash tools/gpu_session.sh decode [MODELS]
#                                           there: bench_generate in bf16, KV-cached against
#                                           whole-window sampling, batch 1 and 8 (gpt2,gpt2-xl
#                                           by default), again with decode steps on the
#                                           training kernels (STRATA_DECODE_ATTENTION=off), then
#                                           gpt2 with whole-vocabulary draws, and with top-k 40
#                                           draws from the device's candidates and, with
#                                           STRATA_DEVICE_CANDIDATES=off, from whole rows
#
# There, the command is e.g. `bash tools/gpu_session.sh check` with carry [".gpu"]; $OUT gets
# smi.txt, test_cuda.log, train.log, bench.md, bench_grad_into_buffer_off.md (and bench-*.md from
# `bench`, switch-*.md from `switches`, dgelu-*.md from `dgelu`, ce-*.md from `ce`, decode.md, decode_split_off.md and decode_candidates.md
# from `decode`, triage.md and triage/*.log from `triage`).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
BINS=(test_cuda bench_gpt2_cuda bench_generate train tokenize generate)

# The libraries of the binaries there: the carried Debian ones first, then the toolkit's, then the
# PyTorch virtual environment's nvidia-* wheels (cuDNN, NCCL, nvrtc live only there).
device_env() {
  [[ -n ${OUT:-} ]] || { echo "gpu_session: \$OUT is not set; run this through the device tool" >&2; exit 2; }
  [[ -f .gpu/run.tgz ]] || { echo "gpu_session: .gpu/run.tgz missing: run 'pack' here and carry .gpu" >&2; exit 2; }
  tar xzf .gpu/run.tgz
  local venv_libs="" d
  for d in /opt/torch/.venv/lib/python3.12/site-packages/nvidia/*/lib; do
    [[ -d $d ]] && venv_libs+="$d:"
  done
  export LD_LIBRARY_PATH="$PWD/.devlibs:/usr/local/cuda/lib64:${venv_libs}${LD_LIBRARY_PATH:-}"
}

# The tests a GoogleTest log names as failed (`[  FAILED  ] Suite.Name (12 ms)`, and again
# in its summary, `[  FAILED  ] Suite.Name/0, where GetParam() = ...`), once each, joined
# into a --gtest_filter; empty when none failed.
failed_tests_filter() {
  { grep -oE '^\[  FAILED  \] [A-Za-z_][A-Za-z0-9_/]*\.[A-Za-z_][A-Za-z0-9_/]*' "$1" || true; } |
    cut -c14- | sort -u | paste -sd: -
}

# The test of a GoogleTest log's last `[ RUN      ] Suite.Name` line when no line after it says
# how that test ended (OK, FAILED or SKIPPED); empty otherwise.
unfinished_test() {
  awk '/^\[ RUN      \] / { t = $4; done = 0; next }
       t != "" && /^\[ *(OK|FAILED|SKIPPED) *\] / && $0 ~ ("] " t) { done = 1 }
       END { if (t != "" && !done) print t }' "$1"
}

case ${1:-} in
  pack)
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA_ARCHS=90 \
      -DSTRATA_WITH_ONEDNN=OFF -DSTRATA_WITH_MPI=OFF
    cmake --build "$BUILD" -j "$(nproc)" --target "${BINS[@]}"
    rm -rf .devlibs && mkdir -p .gpu
    paths=()
    for b in "${BINS[@]}"; do paths+=("$BUILD/bin/$b"); done
    bash ../shared/device/collect-libs.sh .devlibs "${paths[@]}"
    tar czf .gpu/run.tgz .devlibs "${paths[@]}"
    # The tarball travels as a carried (ignored) path; the device tool refuses over 64 MiB.
    mkdir -p .git/info
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    size=$(stat -c %s .gpu/run.tgz)
    echo "gpu_session: .gpu/run.tgz is $((size / 1048576)) MiB (the limit is 64 MiB with the tree)"
    ;;
  check)
    device_env
    set +e  # one failing step must not hide the others' results
    # One command may run 600 s: each step has its own limit (they add up to 570 s) and writes
    # its output line by line, so a step that hangs or is cut leaves what it printed and the
    # steps after it still run.
    nvidia-smi > "$OUT/smi.txt" 2>&1
    # The libraries the run loads from the PyTorch venv (cuDNN's release decides which attention
    # limits apply: Note [cuDNN SDPA limits]).
    ls -d /opt/torch/.venv/lib/python3.12/site-packages/nvidia_*.dist-info >> "$OUT/smi.txt" 2>&1
    /opt/torch/.venv/bin/python -c 'import torch; print("torch", torch.__version__, "cuDNN",
      torch.backends.cudnn.version(), "NCCL", torch.cuda.nccl.version())' >> "$OUT/smi.txt" 2>&1
    # The toolkit's tools there (is compute-sanitizer, which `triage` uses, among them?).
    { echo "/usr/local/cuda/bin:"; ls /usr/local/cuda/bin; } >> "$OUT/smi.txt" 2>&1
    # Poisoned allocations (Note [GPU caching allocator]): an output that cuBLASLt, cuDNN or a
    # kernel leaves partly unwritten reads as NaN, on the real libraries too.
    STRATA_GPU_POISON=on timeout 240 stdbuf -oL -eL "$BUILD/bin/test_cuda" \
      > "$OUT/test_cuda.log" 2>&1
    rc=$?
    echo "test_cuda exit $rc (124: cut at 240 s)" | tee -a "$OUT/test_cuda.log"
    # Cut at the limit, or the process died (a crash, an abort) inside a test: that test never
    # finished and the ones after it never ran.
    unfinished=$(unfinished_test "$OUT/test_cuda.log")
    if [[ -n $unfinished ]]; then
      echo "test_cuda stopped inside $unfinished (exit $rc), so later tests did not run;" \
        "bash tools/gpu_session.sh triage '*' runs every test alone" | tee -a "$OUT/test_cuda.log"
    fi
    # One bad kernel can fail every test after it (a sticky CUDA error): the failed tests'
    # filter, for `triage` to run each alone.
    failed=$(failed_tests_filter "$OUT/test_cuda.log")
    if [[ -n $failed ]]; then
      echo "$failed" > "$OUT/triage_filter.txt"
      echo "tests failed; run each alone: bash tools/gpu_session.sh triage '$failed'" |
        tee -a "$OUT/test_cuda.log"
    fi
    data=$(mktemp -d)
    "$BUILD/bin/tokenize" --tokenizer byte --format text --val-fraction 0.2 --output "$data" \
      docs/*.md README.md > "$OUT/train.log" 2>&1
    timeout 120 stdbuf -oL -eL "$BUILD/bin/train" --config configs/gpt2-tiny-gpu.yaml \
      --set "data.train=$data/train_*.bin" --set "data.val=$data/val_*.bin" \
      --set run.dir="$data/run" >> "$OUT/train.log" 2>&1
    echo "train exit $?" | tee -a "$OUT/train.log"
    timeout 20 "$BUILD/bin/generate" --checkpoint "$data/run" --prompt "The GPU" \
      --max-new-tokens 64 --device cuda >> "$OUT/train.log" 2>&1
    echo "generate exit $?" | tee -a "$OUT/train.log"
    timeout 120 "$BUILD/bin/bench_gpt2_cuda" --models gpt2 --warmup 2 --steps 5 --profile 3 \
      > "$OUT/bench.md" 2> "$OUT/bench.log"
    echo "bench exit $?" | tee -a "$OUT/bench.log"
    # The same without weight gradients added into their buffers by the GEMMs (Note [Weight
    # gradients into their buffer]): what that path buys, measured in the same session.
    STRATA_GRAD_INTO_BUFFER=off timeout 70 "$BUILD/bin/bench_gpt2_cuda" --models gpt2 --warmup 2 \
      --steps 5 > "$OUT/bench_grad_into_buffer_off.md" 2>> "$OUT/bench.log"
    echo "bench (STRATA_GRAD_INTO_BUFFER=off) exit $?" | tee -a "$OUT/bench.log"
    cat "$OUT/bench.md" "$OUT/bench_grad_into_buffer_off.md"
    tail -5 "$OUT/test_cuda.log"
    ;;
  bench)
    device_env
    models=${2:?"usage: gpu_session.sh bench MODELS [ARGS...]"}
    shift 2
    tools/bench/run_gpt2_cuda.sh "$BUILD" --fill --models "$models" "$@" \
      > "$OUT/bench-${models//,/_}.md" 2> "$OUT/bench-${models//,/_}.log"
    cat "$OUT/bench-${models//,/_}.md"
    ;;
  switches)
    device_env
    model=${2:-gpt2}
    shift $(($# < 2 ? $# : 2))
    set +e
    # Three runs of at most 180 s each: under the 600 s a command may take.
    for sw in "" STRATA_NORM_GRADS=separate STRATA_GRAD_INTO_BUFFER=off; do
      name=${sw:-as_built}
      name=${name//=/_}
      env $sw timeout 180 "$BUILD/bin/bench_gpt2_cuda" --models "$model" --warmup 2 --steps 5 \
        --profile 3 "$@" > "$OUT/switch-$model-$name.md" 2>> "$OUT/switch-$model.log"
      echo "bench $model ${sw:-as built} exit $?" | tee -a "$OUT/switch-$model.log"
      cat "$OUT/switch-$model-$name.md"
    done
    ;;
  dgelu)
    device_env
    model=${2:-gpt2-xl}
    shift $(($# < 2 ? $# : 2))
    (($# > 0)) || set -- --B 16
    set +e
    # Two runs of at most 270 s each: under the 600 s a command may take. Note [CUDA linear
    # epilogues]: the epilogue's bits are not the op's, so only its speed is compared here.
    for sw in STRATA_LINEAR_DGELU=kernels STRATA_LINEAR_DGELU=epilogue; do
      name=${sw#STRATA_LINEAR_DGELU=}
      env $sw timeout 270 "$BUILD/bin/bench_gpt2_cuda" --models "$model" --warmup 2 --steps 5 \
        --profile 3 "$@" > "$OUT/dgelu-$model-$name.md" 2>> "$OUT/dgelu-$model.log"
      echo "bench $model $sw exit $?" | tee -a "$OUT/dgelu-$model.log"
      cat "$OUT/dgelu-$model-$name.md"
    done
    ;;
  ce)
    device_env
    model=${2:-gpt2}
    shift $(($# < 2 ? $# : 2))
    (($# > 0)) || set -- --B 64
    set +e
    # Two runs of at most 270 s each: under the 600 s a command may take. Note [CUDA fused
    # cross-entropy]: the register cache changes where the second pass reads the row from, not
    # the bits, so only the cross_entropy_fused rows differ.
    for sw in on off; do
      STRATA_CE_ROW_CACHE=$sw timeout 270 "$BUILD/bin/bench_gpt2_cuda" --models "$model" \
        --warmup 2 --steps 5 --profile 3 "$@" > "$OUT/ce-$model-$sw.md" 2>> "$OUT/ce-$model.log"
      echo "bench $model STRATA_CE_ROW_CACHE=$sw exit $?" | tee -a "$OUT/ce-$model.log"
      grep -E '^\| (impl|strata|op|cross_entropy)' "$OUT/ce-$model-$sw.md"
    done
    ;;
  triage)
    device_env
    # Under the 600 s a command may run: 540 s for the tests and the memcheck runs.
    bash tools/gpu_triage.sh "$BUILD/bin/test_cuda" "${2:-*}" "$OUT" 540
    ;;
  decode)
    device_env
    models=${2:-gpt2,gpt2-xl}
    set +e
    # A 512-token prompt and 128 new tokens: the uncached sampler runs 512..639 positions per
    # token, the cached one a single position (Note [Cached sampling]); one sample, then 8 in
    # one batch (Note [Batched sampling]).
    timeout 240 "$BUILD/bin/bench_generate" --device cuda --dtype bf16 --models "$models" \
      --batch 1,8 --prompt 512 --new 128 --reps 3 > "$OUT/decode.md" 2> "$OUT/decode.log"
    echo "bench_generate exit $?" | tee -a "$OUT/decode.log"
    # The same with decode steps on the training kernels instead of the split-key decode kernel
    # (Note [CUDA decode attention]): the cached columns of the two tables show what it buys.
    STRATA_DECODE_ATTENTION=off timeout 120 "$BUILD/bin/bench_generate" --device cuda \
      --dtype bf16 --models "$models" --batch 1,8 --prompt 512 --new 128 --reps 3 \
      > "$OUT/decode_split_off.md" 2>> "$OUT/decode.log"
    echo "bench_generate (STRATA_DECODE_ATTENTION=off) exit $?" | tee -a "$OUT/decode.log"
    # Whole-vocabulary draws on GPT-2 124M: the host's draw per row and token against the GPU's
    # step (Note [Sampling cost]); compare with the greedy rows above.
    timeout 80 "$BUILD/bin/bench_generate" --device cuda --dtype bf16 --models gpt2 \
      --batch 1,8 --prompt 512 --new 128 --reps 3 --temperature 1 --top-k 0 \
      >> "$OUT/decode.md" 2>> "$OUT/decode.log"
    echo "bench_generate (drawn) exit $?" | tee -a "$OUT/decode.log"
    # `generate`'s default draw (temperature 0.8, top-k 40): the device picks each row's 40
    # candidates (Note [Device candidates]), then the same with whole rows to the host.
    for sw in on off; do
      STRATA_DEVICE_CANDIDATES=$sw timeout 70 "$BUILD/bin/bench_generate" --device cuda \
        --dtype bf16 --models gpt2 --batch 1,8 --prompt 512 --new 128 --reps 3 \
        --temperature 0.8 --top-k 40 >> "$OUT/decode_candidates.md" 2>> "$OUT/decode.log"
      echo "bench_generate (top-k 40, STRATA_DEVICE_CANDIDATES=$sw) exit $?" |
        tee -a "$OUT/decode.log"
    done
    cat "$OUT/decode.md"
    echo "STRATA_DECODE_ATTENTION=off:"
    cat "$OUT/decode_split_off.md"
    echo "top-k 40 draws, STRATA_DEVICE_CANDIDATES=on then off:"
    cat "$OUT/decode_candidates.md"
    ;;
  *)
    sed -n '2,/^set -euo/{/^set -euo/d;p}' "$0" >&2
    exit 2
    ;;
esac
