#!/usr/bin/env bash
# The GPU runs behind the reward controls and Part II across seeds: 8 whole runs of the GSM8K
# configs, one per GPU, in batches of as many runs as the machine has GPUs (4 GPUs: two batches, 2
# GPUs: four). Modelled on small_cards_lease.sh. Batch 1 ran on 2026-11-28 (SLOTS="2 2 3 3" beside
# small_cards_lease.sh's 'evaluate' plan on GPUs 0-1 of four H200s: 17:28-17:51; nvidia-smi read
# 142165 of GPU 3's 143771 MiB used by its two recipe runs at one reading, committed in
# reports/performance/gsm8k_seeds_lease_1/nvidia-smi.txt: two to a card is the edge, not a margin).
# Batch 2 ran the same day on two H200s, two runs a card under a cap (SLOTS="0 0 1 1" CAP_GIB=68:
# from 20:41:52, 1,322-1,332 s a run with both evaluations; each run reserved at most 39 GiB,
# nvidia-smi read at most 59799 MiB a card: reports/performance/gsm8k_seeds_lease_2/). Staging it
# took 21 calls (device-stage cut 22 folders beside a 35 MiB checkout). Queue N logs to gpuN.log
# (N counts queues: with SLOTS, not the GPU; the watch names each queue's GPU).
#
#   bash benchmarks/gsm8k_seeds_lease.sh plan [BATCH]   # print what each GPU of a batch runs (all batches
#                                                       # without BATCH); needs no GPU
#   bash benchmarks/gsm8k_seeds_lease.sh start BATCH    # copy the tree to $HOME/ws, start the batch's
#                                                       # queues (BATCH counts from 1), return
#   bash benchmarks/gsm8k_seeds_lease.sh watch          # print progress for WATCH_S seconds (default 540),
#                                                       # then pack what is done into $OUT/results.tar.gz
#
# Run from the repository root on the GPU machine, after `. $HOME/ppo-stage/env.sh` (device-stage
# qwen-coder: the model and GSM8K). GPUS sets the batch size, one run per GPU (default: the GPUs
# nvidia-smi lists).
# SLOTS places a batch by hand: the GPU of each of its runs, in order, so that two runs can share a
# card (an H200 holds two of these runs, just: 36 GiB allocated each at most, more reserved) and the
# batch can sit beside another script's queues: SLOTS="2 2 3 3" runs batch 1 as two runs on GPU 2
# and two on GPU 3. Runs that share a card report their steps' seconds shared; what they compute
# does not depend on it.
# CAP_GIB caps each run's allocator (train.max_gpu_memory_gib) so that runs sharing a card cannot
# starve each other: uncapped, one run's cache reserved up to 115 GiB of the H200's 140 (batch 1),
# and the other's next allocation would fail. CAP_GIB=68 gives two runs 136 GiB with their CUDA
# contexts inside 140, nearly twice the 35.7 GiB a run allocates at most. The cap changes where the
# allocator fails, not what a run computes (course/committed.py counts it as run control).
# The queues run from a copy of the tree outside the repository (the device tool replaces the
# working tree between calls), each in a process group of its own (setsid), so that they outlive
# the call. Each queue runs its run whole (no time limit, no final checkpoint: neither changes
# what the run computes), then its report into $HOME/rs/reports/NAME.md and the folder
# $HOME/rs/reports/NAME, under the names course.seeds and course.controls read (ws and rs: not the
# w and r of small_cards_lease.sh, so that both can run on one machine):
#
#   batch 1 of 4 GPUs: the random and format controls, the recipe's seeds 3 and 4;
#   batch 2: GRPO's and Dr. GRPO's seeds 1 and 2 (2 GPUs: the same order, two runs a batch; with
#   SLOTS="0 0 1 1" CAP_GIB=68, all four on two GPUs as it ran).
#
# A whole run of the recipe took 11 min on an H200 with both evaluations; `watch` again until every
# queue says done. Then, on the CPU machine, from the repository root, with the tar unpacked in FILES:
#
#   cp -r FILES/reports/. reports/
#   python -m course.controls reports/gsm8k_control_random.md --recipe reports/gsm8k_qwen_coder
#   python -m course.controls reports/gsm8k_control_format.md --recipe reports/gsm8k_qwen_coder
#   python -m course.seeds ablation && python -m course.seeds recipe
set -uo pipefail
W=$HOME/ws
R=$HOME/rs
PYTHON=${PYTHON:-python3}
. "$(dirname "$0")/lease_common.sh"  # queue, record_machine, watch_queues

# NAME CONFIG OVERRIDES...: the report's name, the config in configs/, what differs from it (the seed).
RUNS=(
  "gsm8k_control_random gsm8k_control_random.yaml"
  "gsm8k_control_format gsm8k_control_format.yaml"
  "gsm8k_qwen_coder_seed3 gsm8k_qwen_coder.yaml train.seed=3"
  "gsm8k_qwen_coder_seed4 gsm8k_qwen_coder.yaml train.seed=4"
  "gsm8k_qwen_coder_grpo_seed1 gsm8k_qwen_coder_grpo.yaml train.seed=1"
  "gsm8k_qwen_coder_grpo_seed2 gsm8k_qwen_coder_grpo.yaml train.seed=2"
  "gsm8k_qwen_coder_dr_grpo_seed1 gsm8k_qwen_coder_dr_grpo.yaml train.seed=1"
  "gsm8k_qwen_coder_dr_grpo_seed2 gsm8k_qwen_coder_dr_grpo.yaml train.seed=2"
)

# gpus: the batch size (SLOTS' word count, else GPUS); gpu_of I: the GPU of a batch's run I
gpus() { if [ -n "${SLOTS:-}" ]; then wc -w <<< "$SLOTS"; else echo "${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}"; fi; }
gpu_of() { if [ -n "${SLOTS:-}" ]; then local slots; read -ra slots <<< "$SLOTS"; echo "${slots[$1]}"; else echo "$1"; fi; }
where() { if [ -n "${SLOTS:-}" ]; then echo "SLOTS='$SLOTS'"; else echo "$(gpus) GPUs"; fi; }

batches() { local g; g=$(gpus); echo $(( (${#RUNS[@]} + g - 1) / g )); }

check() {  # check BATCH: refuse a GPU count or a batch number that names no runs
  local g; g=$(gpus)
  if [ -n "${SLOTS:-}" ] && ! [[ $SLOTS =~ ^[0-9]+( [0-9]+)*$ ]]; then
    echo "SLOTS must be GPU numbers separated by single spaces, got '$SLOTS'" >&2; return 2
  fi
  if ! [[ $g =~ ^[1-9][0-9]*$ ]]; then
    echo "no GPU to run on (GPUS='$g'; nvidia-smi lists none): set GPUS to the GPUs of the machine" >&2; return 2
  fi
  if ! [[ ${1:-} =~ ^[1-9][0-9]*$ ]] || [ "$1" -gt "$(batches)" ]; then
    echo "BATCH must be 1 to $(batches) on $(where), got '${1:-}'" >&2; return 2
  fi
}

run() {  # run NAME CONFIG OVERRIDES...: the whole run, then (if it finished) its report
  local name=$1 config=$2; shift 2
  echo "$PYTHON -m assignment.trainer --config configs/$config --impl solutions/exercises.py \
train.output_dir=$R/$name train.time_limit_s=null train.final_checkpoint=false${CAP_GIB:+ train.max_gpu_memory_gib=$CAP_GIB}${*:+ $*} && \
$PYTHON -m assignment.trainer --report $R/$name --report-out $R/reports/$name.md${STAGING_S:+ --staging-seconds $STAGING_S}"
}

batch_runs() {  # batch_runs BATCH (checked): the RUNS indices of that batch, one per GPU, in GPU order
  local b=$1 g last; g=$(gpus); last=$(( b * g - 1 < ${#RUNS[@]} - 1 ? b * g - 1 : ${#RUNS[@]} - 1 ))
  seq $(( (b - 1) * g )) "$last"
}

plan() {  # plan BATCH (checked): "GPU i: command" for each run of the batch
  local gpu=0 index
  for index in $(batch_runs "$1"); do
    # shellcheck disable=SC2086  # a run's words: its name, config and overrides
    echo "GPU $(gpu_of $gpu): $(run ${RUNS[$index]})"; gpu=$((gpu + 1))
  done
}

case "${1:-}" in
  plan)
    if [ -n "${2:-}" ]; then check "$2" || exit 2; plan "$2"; exit 0; fi
    check 1 || exit 2
    for b in $(seq 1 "$(batches)"); do echo "--- batch $b of $(batches) ($(where))"; plan "$b"; done
    ;;
  start)
    check "${2:-}" || exit 2
    if ls "$R"/queue*.sh > /dev/null 2>&1 && [ "$(ls "$R"/done* 2>/dev/null | wc -l)" -lt "$(ls "$R"/queue*.sh | wc -l)" ]; then
      echo "a batch is still running in $R: watch it to its end first" >&2; exit 2
    fi
    # an earlier batch's runs and reports stay in $R (and in the next tar); its queues and logs go
    mkdir -p "$R/reports" "$R/logs"
    for f in "$R"/gpu*.log; do [ -f "$f" ] && mv "$f" "$R/logs/$(date +%s)_$(basename "$f")"; done
    rm -rf "$W" "$R"/queue*.sh "$R"/done*; mkdir -p "$W"
    cp -r assignment solutions configs pyproject.toml "$W/"
    record_machine "$PYTHON"
    gpu=0
    for index in $(batch_runs "$2"); do
      # shellcheck disable=SC2086
      QUEUE_GPU=$(gpu_of $gpu) queue $gpu "$(run ${RUNS[$index]})"; gpu=$((gpu + 1))
    done
    cat "$R/gpu.txt"; echo "started batch $2 of $(batches): $gpu queues"
    ;;
  watch)
    # what comes back: every run folder without checkpoints, the reports, the logs
    watch_queues "^==|eval step .*accuracy|^\[step [0-9]*[05]\] |^wrote|Error|error|WARNING" 'checkpoint*' 'tb'
    ;;
  *) echo "usage: $0 plan [BATCH] | start BATCH | watch" >&2; exit 2 ;;
esac
