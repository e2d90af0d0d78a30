#!/usr/bin/env bash
# Leases for the small-card profiles in 16 bits (model.train_dtype): whole runs, one per GPU, and the
# step benchmarks that the speed targets and the card estimates rest on.
#
#   bash benchmarks/small_cards_lease.sh start PLAN  # copy the tree to $HOME/w, start PLAN's queues, return
#   bash benchmarks/small_cards_lease.sh watch       # print progress for WATCH_S seconds (default 540),
#                                                    # then pack what is done into $OUT/results.tar.gz
#
# Run from the repository root on the GPU machine, after `. $HOME/ppo-stage/env.sh` (the model, the
# data and bitsandbytes: device-stage qwen-coder with EXTRA_WHEELS=bitsandbytes==0.50.2). The queues
# run from a copy of the tree outside the repository (the device tool replaces the working tree
# between calls), each in a process group of its own (setsid), so that they outlive the call.
#
# PLAN x4 (4 GPUs; as run on 2026-11-28 in reports/performance.md Part 5, but for the float32
# profiles' benchmarks, now profiled too):
#   GPU 0: the 24 GB profile's whole run, then the 16 GB profile's step benchmark (profiled)
#   GPU 1: the 16 GB profile's whole run, then the float16 profile's step benchmark (profiled)
#   GPU 2: the float16 profile's whole run
#   GPU 3: step benchmarks of the recipe (profiled), the 24 GB and 16 GB profiles as they were (float32
#          training: the before), the recipe with TF32 off (profiled: the card model's check), the
#          24 GB profile (profiled)
# PLAN diagnose (2 GPUs): where the 16-bit update's host time goes, and the float16 NaN
#   GPU 0: the 24 GB profile in bfloat16 under its cap (host profile, compile's recompiles logged),
#          without its cap (kernels profiled), and under its cap with half the minibatch
#   GPU 1: the 16 GB profile in bfloat16 (kernels profiled), then in float16 for 6 steps (a skipped
#          step names the parameters whose gradient was not finite)
# PLAN evening (2 GPUs): the 24 GB profile's whole run in bfloat16 (GPU 0); beside it (GPU 1) the step
#   benchmarks of both profiles in bfloat16 compiled by layer (model.compile_scope), the recipe in
#   float32 with TF32 and without (the card model's check), the 24 GB profile in float32 by layer
# PLAN sixteen (2 GPUs), with cuDNN's attention off in 16-bit training: the 16 GB profile's whole
#   runs in float16 (GPU 0) and bfloat16 (GPU 1), evaluated in float32, then each card benchmarks a
#   bfloat16 profile for 10 steps (past the warm-up the 4-step benchmarks measured)
# PLAN proof (4 GPUs), with cuDNN's attention off in 16-bit training, every run evaluated in float32:
#   GPU 0: the 24 GB profile's whole run in bfloat16 (again: the first was evaluated in bfloat16)
#   GPU 1: the 16 GB profile's whole run in bfloat16
#   GPU 2: the 16 GB profile's whole run in float16 (float16 sampler and reference: a T4's path)
#   GPU 3: benchmarks, the last update profiled: 10 steps (past the 16-bit warm-up) of the recipe in
#          float32 (the ratios' baseline on this machine) and of both profiles in bfloat16, then 6
#          of the 16 GB profile in float32 (its kernels, never profiled: the card estimate's float32 row)
# PLAN float16 (1 GPU): why the float16 16 GB profile's update is slower than bfloat16's on the H200
#   (12.6 against 10.6 s over their whole runs): its last update host-profiled; then the 24 GB profile
#   in float16 (does it fit its cap, and how fast: the next 24 GB whole run's candidate)
# PLAN next (4 GPUs): what the profiles still need, every run evaluated in float32:
#   GPU 0: the 24 GB profile's whole run in float16 (if it gains +8, the 24 GB profile moves to it)
#   GPU 1: the 24 GB profile's whole run as shipped (float32; its report predates the sampler metrics)
#   GPU 2: the 16 GB profile's whole run as shipped (float32; the same)
#   GPU 3: 10-step benchmarks, profiled: the recipe (the ratios' baseline), the 16 GB profile in
#          float32 (the float16 profile's before), the float16 profile (its overflow test now once a
#          backward), the 24 GB profile in float16
# PLAN evaluate (2 GPUs): the last lever on the card goal by the estimate (generation and the float32
#   greedy evaluations bound the small cards; reports/performance.md Part 8):
#   GPU 0: the float16 profile's whole run evaluated greedily by its float16 sampler copy (eager),
#          before and after alike (eval.model=sampler): its accuracy, and the evaluations' seconds
#   GPU 1: the float16 profile's whole run evaluated in float32 (as it shipped then), after the
#          overflow test moved: its whole-run step, and a second draw of its gain
#   Ran 2026-11-28 (reports/performance.md Part 9); the profile now evaluates by its sampler.
set -uo pipefail
W=$HOME/w
R=$HOME/r
. "$(dirname "$0")/lease_common.sh"  # queue, record_machine, watch_queues

# The 16-bit versions of the profiles, as overrides of the shipped (float32) profile files.
BF16_24="model.train_dtype=bfloat16 model.reference_dtype=bfloat16 eval.model=sampler"
BF16_16="model.train_dtype=bfloat16 eval.model=sampler"
FP16_16="model.train_dtype=float16 model.reference_dtype=float16 rollout.generation_dtype=float16 eval.model=sampler"
FP16_24="model.train_dtype=float16 model.reference_dtype=float16 rollout.generation_dtype=float16"  # evaluated in float32

run() {  # run NAME PROFILE OVERRIDES...: a whole run of configs/gsm8k_qwen_coder_PROFILE.yaml into $R/NAME
  local name=$1 profile=$2; shift 2
  echo "python3 -m assignment.trainer --config configs/gsm8k_qwen_coder_$profile.yaml --impl solutions/exercises.py \
train.output_dir=$R/$name train.time_limit_s=null train.final_checkpoint=false $*"
}
bench() {  # bench NAME CONFIG LABEL ARGS...: ppo_step.py, 4 steps (the first compiles)
  local name=$1 config=$2 label=$3; shift 3
  echo "python3 benchmarks/ppo_step.py --config configs/$config --steps 4 --label '$label' --json $R/bench/$name.json \
--output-dir $R/bench/run_$name $*"
}

plan_x4() {
  queue 0 "$(run 24gb 24gb $BF16_24)" \
    "$(bench 16gb_after gsm8k_qwen_coder_16gb.yaml '16 GB profile, bfloat16 training' --profile-update $BF16_16)"
  queue 1 "$(run 16gb 16gb $BF16_16)" \
    "$(bench 16gb_float16_after gsm8k_qwen_coder_16gb.yaml '16 GB profile, float16 training' --profile-update $FP16_16)"
  queue 2 "$(run 16gb_float16 16gb $FP16_16)"
  queue 3 "$(bench recipe gsm8k_qwen_coder.yaml 'recipe, float32 (TF32)' --profile-update)" \
    "$(bench 24gb_before gsm8k_qwen_coder_24gb.yaml '24 GB profile, float32 training (before)' --profile-update)" \
    "$(bench 16gb_before gsm8k_qwen_coder_16gb.yaml '16 GB profile, float32 training (before)' --profile-update)" \
    "$(bench recipe_fp32 gsm8k_qwen_coder.yaml 'recipe, plain FP32 (TF32 off)' --profile-update --no-tf32)" \
    "$(bench 24gb_after gsm8k_qwen_coder_24gb.yaml '24 GB profile, bfloat16 training' --profile-update $BF16_24)"
}
plan_diagnose() {
  queue 0 "TORCH_LOGS=recompiles $(bench 24gb_bf16_capped gsm8k_qwen_coder_24gb.yaml '24 GB profile, bfloat16, under its cap' \
      --host-profile $R/bench/24gb_bf16_capped_host.txt $BF16_24)" \
    "$(bench 24gb_bf16_uncapped gsm8k_qwen_coder_24gb.yaml '24 GB profile, bfloat16, no cap' --profile-update \
      $BF16_24 train.max_gpu_memory_gib=null)" \
    "$(bench 24gb_bf16_mb4 gsm8k_qwen_coder_24gb.yaml '24 GB profile, bfloat16, minibatches of 4' --profile-update \
      $BF16_24 ppo.minibatch_size=4 ppo.grad_accum_steps=16)"
  queue 1 "$(bench 16gb_bf16 gsm8k_qwen_coder_16gb.yaml '16 GB profile, bfloat16' --profile-update $BF16_16)" \
    "$(bench 16gb_fp16 gsm8k_qwen_coder_16gb.yaml '16 GB profile, float16, 6 steps' --steps 6 $FP16_16)"  # the later --steps wins
}
plan_evening() {
  queue 0 "$(run 24gb 24gb $BF16_24)"
  queue 1 "$(bench 24gb_bf16_layer gsm8k_qwen_coder_24gb.yaml '24 GB profile, bfloat16, compiled by layer' --profile-update \
      $BF16_24 model.compile_scope=layer)" \
    "$(bench 16gb_bf16_layer gsm8k_qwen_coder_16gb.yaml '16 GB profile, bfloat16, compiled by layer' --profile-update \
      $BF16_16 model.compile_scope=layer)" \
    "$(bench recipe gsm8k_qwen_coder.yaml 'recipe, float32 (TF32)' --profile-update)" \
    "$(bench recipe_fp32 gsm8k_qwen_coder.yaml 'recipe, plain FP32 (TF32 off)' --profile-update --no-tf32)" \
    "$(bench 24gb_fp32_layer gsm8k_qwen_coder_24gb.yaml '24 GB profile, float32, compiled by layer' --profile-update \
      model.compile_scope=layer)"
}
plan_sixteen() {
  # evaluated in float32 (eval.model=null), as the float32 profiles' runs were: the bfloat16 24 GB
  # run's +6.6 came from bfloat16 greedy evaluations, which the float32 runs' +9.1 did not
  queue 0 "$(run 16gb_float16 16gb $FP16_16 eval.model=null)" \
    "$(bench 24gb_bf16 gsm8k_qwen_coder_24gb.yaml '24 GB profile, bfloat16, cuDNN attention off' --steps 10 --profile-update $BF16_24)"
  queue 1 "$(run 16gb 16gb $BF16_16 eval.model=null)" \
    "$(bench 16gb_bf16 gsm8k_qwen_coder_16gb.yaml '16 GB profile, bfloat16, cuDNN attention off' --steps 10 --profile-update $BF16_16)"
}

plan_proof() {
  queue 0 "$(run 24gb 24gb $BF16_24 eval.model=null)"
  queue 1 "$(run 16gb 16gb $BF16_16 eval.model=null)"
  queue 2 "$(run 16gb_float16 16gb $FP16_16 eval.model=null)"
  queue 3 "$(bench recipe gsm8k_qwen_coder.yaml 'recipe, float32 (TF32)' --steps 10 --profile-update)" \
    "$(bench 24gb_bf16 gsm8k_qwen_coder_24gb.yaml '24 GB profile, bfloat16, cuDNN attention off' --steps 10 --profile-update $BF16_24)" \
    "$(bench 16gb_bf16 gsm8k_qwen_coder_16gb.yaml '16 GB profile, bfloat16, cuDNN attention off' --steps 10 --profile-update $BF16_16)" \
    "$(bench 16gb_fp32 gsm8k_qwen_coder_16gb.yaml '16 GB profile, float32' --steps 6 --profile-update)"
}

plan_float16() {
  queue 0 "$(bench 16gb_fp16_host gsm8k_qwen_coder_16gb.yaml '16 GB profile, float16, host-profiled' --steps 6 \
      --host-profile $R/bench/16gb_fp16_host.txt $FP16_16 eval.model=null)" \
    "$(bench 24gb_fp16 gsm8k_qwen_coder_24gb.yaml '24 GB profile, float16' --steps 6 --profile-update $FP16_24)"
}

plan_next() {
  queue 0 "$(run 24gb_float16 24gb $FP16_24)"
  queue 1 "$(run 24gb 24gb)"
  queue 2 "$(run 16gb 16gb)"
  queue 3 "$(bench recipe gsm8k_qwen_coder.yaml 'recipe, float32 (TF32)' --steps 10 --profile-update)" \
    "$(bench 16gb_fp32 gsm8k_qwen_coder_16gb.yaml '16 GB profile, float32' --steps 10 --profile-update)" \
    "$(bench 16gb_float16 gsm8k_qwen_coder_16gb_float16.yaml 'float16 profile' --steps 10 --profile-update)" \
    "$(bench 24gb_fp16 gsm8k_qwen_coder_24gb.yaml '24 GB profile, float16' --steps 10 --profile-update $FP16_24)"
}

plan_evaluate() {
  queue 0 "$(run 16gb_float16_sampler_eval 16gb_float16 eval.model=sampler)"
  queue 1 "$(run 16gb_float16 16gb_float16 eval.model=null)"
}

case "${1:-}" in
  start)
    declare -F "plan_${2:-}" > /dev/null || { echo "usage: $0 start x4|diagnose|evening|sixteen|proof|float16|next|evaluate" >&2; exit 2; }
    rm -rf "$W" "$R"; mkdir -p "$W" "$R/bench"
    cp -r assignment solutions configs benchmarks pyproject.toml "$W/"
    record_machine python3
    "plan_$2"
    cat "$R/gpu.txt"; echo "started: $(ls $R/queue*.sh | wc -l) queues"
    ;;
  watch)
    # what comes back: every run folder without checkpoints, the benchmarks' JSON, the logs
    watch_queues "^==|eval step .*accuracy|^\[step [0-9]*[05]\] |skipped|Error|error|WARNING" 'checkpoint*' 'run_*' 'tb'
    ;;
  *) echo "usage: $0 start x4|diagnose|evening|sixteen|proof|float16|next|evaluate, or $0 watch" >&2; exit 2 ;;
esac
