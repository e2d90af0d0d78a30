# Sourced by the lease scripts (small_cards_lease.sh, gsm8k_seeds_lease.sh): queues of commands on
# the GPUs of a leased machine that outlive the device call, and the watch that brings back what
# they wrote. Needs W (the copy of the tree the queues run from) and R (where they write).

# NVLink multicast stays off in every process (the machine's rule).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1

queue() {  # queue SLOT COMMAND...: the commands in order on GPU SLOT, each logged, then a marker
  # (QUEUE_GPU=G puts queue SLOT on GPU G instead: two queues can share a card)
  local slot=$1; shift
  local script=$R/queue$slot.sh gpu=${QUEUE_GPU:-$slot}
  { echo "cd $W; export CUDA_VISIBLE_DEVICES=$gpu"
    for command in "$@"; do echo "echo \"== \$(date +%T) $command\"; $command; echo \"== rc \$?\""; done
    echo "touch $R/done$slot"; } > "$script"
  # a process group of its own (setsid): the queue outlives the device call that started it
  setsid nohup bash "$script" > "$R/gpu$slot.log" 2>&1 < /dev/null &
}

record_machine() {  # record_machine PYTHON: the cards and the library versions, into $R/gpu.txt
  { nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
    "$1" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  } > "$R/gpu.txt" 2>&1
}

watch_queues() {  # watch_queues LINES EXCLUDE...: wait up to WATCH_S seconds (default 540) for every
  # queue's marker, print each queue's log lines matching the regex LINES, then pack $R (less the
  # EXCLUDE patterns: checkpoints and the like) into $OUT/results.tar.gz
  local lines=$1; shift
  local queues end slot excludes=()
  queues=$(ls "$R"/queue*.sh 2>/dev/null | wc -l)
  end=$((SECONDS + ${WATCH_S:-540}))
  while [ $SECONDS -lt $end ] && [ "$(ls "$R"/done* 2>/dev/null | wc -l)" -lt "$queues" ]; do sleep "${POLL_S:-15}"; done
  for ((slot = 0; slot < queues; slot++)); do
    echo "--- queue $slot ($(grep -o 'CUDA_VISIBLE_DEVICES=[0-9]*' "$R/queue$slot.sh" | tr = ' ')) \
$( [ -f "$R/done$slot" ] && echo done || echo running)"
    grep -E "$lines" "$R/gpu$slot.log" | tail -8
  done
  for pattern in "$@"; do excludes+=("--exclude=$pattern"); done
  tar -C "$R" "${excludes[@]}" -czf "${OUT:-/tmp}/results.tar.gz" . 2>/dev/null
  ls -la "${OUT:-/tmp}/results.tar.gz"
}
