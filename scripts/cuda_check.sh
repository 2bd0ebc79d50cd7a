#!/usr/bin/env bash
# The GPU half of rlx's checks, on a CUDA machine without network (../shared/notes/cuda.md):
# builds with RLX_CUDA=ON against the LibTorch inside PyTorch 2.x and runs the GPU tests,
# the HF parity check and the GPU benchmarks, each bounded in time. Everything it prints
# goes to OUT/log.txt; each step's JSON result is a line {"step": NAME, "result": {...}} of
# OUT/results.jsonl (the device tool brings back at most 8 files).
#
#   source .device/setup.sh; scripts/cuda_check.sh OUT [STEP...]
# .device comes from scripts/prepare_device.sh on the Debian machine (the .deb files of the
# dependencies, TensorBoard files of a CPU run for the `tensorboard` step, a reward model and
# a LoRA run for the `readers` step).
#   steps (default all, in this order): build ceilings tensorboard readers parity model learner sync
#   gpu_tests sanitizer unit decode profile sampler colocated
# RLX_CUDA_DEADLINE=S: no step starts after S seconds, and none runs past them (a lease is short:
# the steps run in the order given, so name the most wanted first). A lease is 15 minutes of
# device time, starts (~45 s) included, and the machine goes back 30 s after a call, so a failed
# build costs a fresh start and a full build (127 s at -j16 on the H200, 2026-11-26): one call.
set -uo pipefail
out=${1:?usage: cuda_check.sh OUT [STEP...]}
shift
steps=${*:-build ceilings tensorboard readers parity model learner sync gpu_tests sanitizer unit decode profile sampler colocated}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${RLX_CUDA_BUILD:-$root/build/cuda}
rlx=$build/rlx
mkdir -p "$out"
log=$out/log.txt
deadline=${RLX_CUDA_DEADLINE:-100000}
say() { echo "== $(date +%T) $*" | tee -a "$log"; }
# step NAME SECONDS CMD...: runs CMD with a time limit (cut to the deadline); its output is
# appended to the log. A step past the deadline is skipped (rc 125).
step() {
  local name=$1 limit=$2 t0=$SECONDS rc left=$((deadline - SECONDS))
  shift 2
  if [ "$left" -lt 15 ]; then say "$name: skipped, past the deadline"; return 125; fi
  [ "$limit" -gt "$left" ] && limit=$left
  say "$name: $*"
  timeout --kill-after=10 "$limit" "$@" >> "$log" 2>&1
  rc=$?
  say "$name: rc $rc after $((SECONDS - t0)) s"
  return $rc
}
# json NAME: the last line of the log that is a JSON object goes to OUT/results.jsonl.
json() { echo "{\"step\": \"$1\", \"result\": $(grep '^{' "$log" | tail -1)}" >> "$out/results.jsonl"; }
# have FILE: FILE was built (a failed build leaves the steps that need it out).
have() { [ -x "$1" ] || { say "skipped: $1 was not built"; return 1; }; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$log" 2>&1
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' >> "$log" 2>&1

for s in $steps; do
  case $s in
    build|ceilings|tensorboard|readers) ;;
    gpu_tests) have "$build/tests/rlx_tests" || continue ;;
    sanitizer) have "$build/tests/rlx_cuda_kernel_tests" || continue ;;
    unit) have "$build/tests/rlx_tests" || continue ;;
    *) have "$rlx" || continue ;;
  esac
  case $s in
    build)
      # The image may hold Catch2 v3; the tests are written for v2 (carried in .device/debs).
      c2=/tmp/rlx-catch2; rm -rf $c2; dpkg -x .device/debs/catch2_*.deb $c2
      step configure 120 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRLX_CUDA=ON \
        -DRLX_BUILD_EXAMPLES=OFF -DCatch2_DIR=$c2/usr/lib/cmake/Catch2 -DRLX_TENSORBOARD=${RLX_CUDA_TENSORBOARD:-OFF} || exit 1
      # TensorBoard is off here: librlx linked with the carried protobuf left its symbols
      # unresolved on this image (2026-11-26); what the image holds, for the next look:
      ls -la /usr/lib/x86_64-linux-gnu/libprotobuf* /usr/local/lib/libprotobuf* >> "$log" 2>&1
      # -k 0: what builds is built, so one broken target leaves the others' steps to run.
      step build 420 cmake --build "$build" -j"$(nproc)" --target rlx_cli rlx_tests rlx_cuda_kernel_tests -- -k 0 ||
        grep -E -A4 "error:|FAILED|undefined reference" "$log" | grep -v "^/opt/gcc/bin" | head -200 > "$out/build_errors.txt" ;;
    ceilings)
      # This device's ceilings, measured in the run: device-to-device copy bandwidth (bytes read
      # and written) and the bf16 GEMM rate, for the roofline and MFU figures.
      step ceilings 60 python3 -c '
import json, torch
x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda"); b = torch.randn_like(a)
def t(f, n):
    for _ in range(3): f()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True); s.record()
    for _ in range(n): f()
    e.record(); torch.cuda.synchronize(); return s.elapsed_time(e) / 1e3 / n
c = t(lambda: y.copy_(x), 20); g = t(lambda: a @ b, 20)
print(json.dumps({"device": torch.cuda.get_device_name(), "copy_gbs": 2 * x.numel() / c / 1e9,
                  "bf16_gemm_tflops": 2 * 8192**3 / g / 1e12}))' && json ceilings ;;
    parity)
      step parity 180 python3 scripts/hf_parity.py --rlx "$rlx" --out /tmp/rlx-parity --device cuda && json parity ;;
    model)
      # Training-shaped forward/backward, then the bare model's KV-cache decode step at the
      # sampler's batch sizes (what the engine's step costs without paging or sampling).
      step model 120 "$rlx" bench model --preset qwen2.5-0.5b --arch qwen2 --dtype bfloat16 --device cuda \
        --batch 8 --seq 2048 --iters 3 && json model
      for b in 1 64 256; do
        step model_decode_b$b 120 "$rlx" bench model --preset qwen2.5-0.5b --arch qwen2 --dtype bfloat16 \
          --device cuda --batch $b --seq 512 --decode-steps 64 --iters 2 && json model
      done ;;
    decode)
      # The engine's decode step eager, as CUDA graphs one step at a time, and as CUDA graphs
      # with step k+1 launched before step k's tokens are read back (same kernels otherwise),
      # random Qwen2.5-0.5B-shaped weights: graph_steps and overlapped_steps in the JSON say
      # how many steps replayed and how many overlapped.
      # RLX_DECODE_BATCHES, RLX_DECODE_MODES (graphs:overlap pairs) and RLX_DECODE_NEW narrow it.
      for b in ${RLX_DECODE_BATCHES:-1 64 256}; do
        for go in ${RLX_DECODE_MODES:-0:1 1:0 1:1}; do
          g=${go%:*} o=${go#*:}
          step decode_b${b}_graphs${g}_overlap$o 120 "$rlx" bench sampler --preset qwen2.5-0.5b --arch qwen2 \
            --dtype bfloat16 --device cuda --batch $b --prompt 512 --new ${RLX_DECODE_NEW:-128} --iters 1 --kv-cache-mb 16384 \
            --max-batch-tokens 16384 --cuda-graphs $g --overlap $o && json decode
        done
      done ;;
    tensorboard)
      # TensorBoard's own reader (the image's tensorboard package) on a CPU run's event files.
      step tensorboard 60 python3 scripts/read_tensorboard.py .device/tb .device/tb.expected.jsonl && json tensorboard ;;
    readers)
      # transformers on `rlx rm`'s sequence classifier, PEFT (if installed) on a LoRA run's adapter.
      r=.device/readers
      step readers 120 python3 scripts/check_hf_readers.py --rm $r/rm --rm-expected $r/rm_expected.json --base $r/base \
        --lora-final $r/lora && json readers ;;
    profile)
      # Where a decode step's time goes, by kernel: ncu times each launch (graphs off, so each
      # kernel is its own launch; the summary averages by kernel name). 16 decode steps.
      for b in ${RLX_PROFILE_BATCHES:-1 64}; do
        step profile_decode_b$b 240 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
          --launch-count 3000 "$rlx" bench sampler --preset qwen2.5-0.5b --arch qwen2 --dtype bfloat16 --device cuda \
          --batch $b --prompt 512 --new 16 --iters 1 --kv-cache-mb 16384 --max-batch-tokens 16384 --cuda-graphs 0 --overlap 0
      done ;;
    sampler)
      step sampler 540 python3 scripts/bench_hf_generate.py --rlx "$rlx" --out /tmp/rlx-sampler \
        --batches "${RLX_SAMPLER_BATCHES:-1,64,256}" --compiled "${RLX_SAMPLER_COMPILED:-1}" \
        --bandwidth-gbs "$(grep -o '"copy_gbs": [0-9.]*' "$out/results.jsonl" 2>/dev/null | tail -1 | grep -o '[0-9.]*$' || echo 3000)" \
        && json sampler ;;
    learner)
      step learner_torch 150 python3 scripts/bench_torch_train.py --seq 2048 --batch-seqs 8 && json learner_torch
      step learner 200 "$rlx" bench learner --device cuda --preset qwen2.5-0.5b --arch qwen2 --dtype bfloat16 \
        --seq 2048 --batch-seqs 8 --micro-batch-tokens 16384 --steps 5 --ranks 1 && json learner
      # Where the step's time goes: rank 0's operators by device time over 3 more steps.
      step learner_profile 200 "$rlx" bench learner --device cuda --preset qwen2.5-0.5b --arch qwen2 --dtype bfloat16 \
        --seq 2048 --batch-seqs 8 --micro-batch-tokens 16384 --steps 2 --ranks 1 --profile 3
      [ "${RLX_LEARNER_ACCUM:-1}" = 1 ] && step learner_mb4k 200 "$rlx" bench learner --device cuda --preset qwen2.5-0.5b --arch qwen2 --dtype bfloat16 \
        --seq 2048 --batch-seqs 8 --micro-batch-tokens 4096 --steps 5 --ranks 1 && json learner_mb4k
      # A GRPO-shaped batch: 2 prompts x 8 samples, 1536 prompt + 512 completion tokens each;
      # the prompt packed once (shared prefix), the policy head at the completions only, then at
      # every token (RLX_LEARNER_GRPO=0 skips both).
      if [ "${RLX_LEARNER_GRPO:-1}" = 1 ]; then
        for head in 1 0; do
          step "learner_grpo_head$head" 200 "$rlx" bench learner --device cuda --preset qwen2.5-0.5b --arch qwen2 \
            --dtype bfloat16 --seq 2048 --batch-seqs 16 --loss-tokens 512 --group-size 8 --row-tokens 16384 \
            --micro-batch-tokens 16384 --steps 5 --ranks 1 --head-on-loss-tokens $head && json "learner_grpo_head$head"
        done
      fi ;;
    sync)
      # Weight sync by CUDA IPC (a subscriber process, device-to-device copies; the
      # subscriber checks every version's values) against a device copy of the same bytes.
      step sync_cuda_ipc 120 "$rlx" bench sync --path cuda-ipc --mb 1000 --versions 10 && json sync_cuda_ipc
      step sync_shm 120 "$rlx" bench sync --path shm --mb 1000 --versions 10 && json sync_shm ;;
    gpu_tests)
      # The engine's own kernels against their CPU references (tests/cuda/kernels_test.cpp).
      [ -x "$build/tests/rlx_cuda_kernel_tests" ] && step kernel_tests 120 "$build/tests/rlx_cuda_kernel_tests" -d yes
      step gpu_tests 240 "$build/tests/rlx_tests" "[cuda]" -d yes ;;
    sanitizer)
      # The kernels under compute-sanitizer: out-of-bounds and misaligned accesses, then races
      # in shared memory.
      cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
      step memcheck 240 "$cs" --tool memcheck --error-exitcode 1 "$build/tests/rlx_cuda_kernel_tests"
      step racecheck 240 "$cs" --tool racecheck --error-exitcode 1 "$build/tests/rlx_cuda_kernel_tests" ;;
    unit)
      # The CPU unit suite against this LibTorch. Tokenizer parity needs the npm fixtures,
      # which are fetched where there is network; without them those cases fail by design.
      (cd "$build" && step unit 300 ctest -L unit -j"$(nproc)" --timeout 120 --output-on-failure) ;;
    colocated)
      # One GPU, the whole loop (train.placement = colocated): the throughput config (random
      # Qwen2.5-0.5B shape, 64 x 8 samples x 512 tokens a step), then generation alone and
      # training alone on the same shapes, for "step time within 15% of their sum"; then the
      # quickstart's task from an SFT warm start, for its reward curve and wall time.
      runs=/tmp/rlx-colocated
      step colocated_throughput 540 "$rlx" run examples/configs/throughput_0.5b.yaml run.out_dir=$runs --force ${RLX_COLOCATED_ARGS:-} \
        && cp $runs/throughput_0.5b/metrics.jsonl "$out/colocated_throughput.jsonl"
      grep "memory plan" -A14 $runs/throughput_0.5b/logs/learner-0/rank-0.err >> "$log" 2>/dev/null
      step colocated_generate_alone 300 "$rlx" bench sampler --preset qwen2.5-0.5b --arch qwen2 --dtype bfloat16 \
        --device cuda --batch 512 --prompt 64 --new 512 --iters 1 --kv-cache-mb 6144 --max-batch-tokens 16384 \
        && json colocated_generate_alone
      step colocated_train_alone 300 "$rlx" bench learner --device cuda --preset qwen2.5-0.5b --arch qwen2 \
        --dtype bfloat16 --seq 576 --batch-seqs 512 --micro-batch-tokens 16384 --steps 3 --ranks 1 \
        && json colocated_train_alone
      # The same split on one GPU: learner and worker processes, weights by CUDA IPC.
      step split_throughput 540 "$rlx" run examples/configs/throughput_0.5b.yaml run.out_dir=$runs run.name=split_0.5b \
        train.placement=split --force && cp $runs/split_0.5b/metrics.jsonl "$out/split_throughput.jsonl"
      step colocated_sft 300 "$rlx" sft examples/configs/sft_arithmetic.yaml run.out_dir=$runs model.device=cuda
      step colocated_quickstart 540 "$rlx" run examples/configs/grpo_arithmetic_gpu.yaml run.out_dir=$runs \
        model.path=$runs/sft_arithmetic/final --force && cp $runs/grpo_arithmetic_gpu/metrics.jsonl "$out/colocated_quickstart.jsonl"
      step colocated_eval 120 "$rlx" eval examples/configs/grpo_arithmetic_gpu.yaml run.out_dir=$runs \
        model.path=$runs/grpo_arithmetic_gpu/final && json colocated_eval ;;
    *) say "unknown step $s"; exit 2 ;;
  esac
done
say "done"
