#!/usr/bin/env bash
# The node agent against a real GPU: on a machine with an NVIDIA GPU, PyTorch and root
# (the lent GPU machine; never CI). agent/examples/real_gpu.rs puts a CUDA process in
# a notebook pod's cgroup and runs the agent's rounds against real NVML, twice:
#   1. a process that takes 4 GiB of GPU memory and computes nothing: reclaimed
#      (SIGTERM) once 30 idle rounds have passed, its memory freed;
#   2. a process that multiplies matrices without a pause: left alone for 35 rounds;
#   3. the VRAM watchdog: the pod's process holds 4 GiB against a budget of 1 GiB
#      while a process outside any pod fills the card to under 1 GiB free: the
#      pod's process is ended at the first round (the watchdog not a dry run).
#
#   cargo build --release -p gpu-booking-agent --example real_gpu
#   scripts/agent-real-gpu.sh [path of real_gpu, default target/release/examples/real_gpu]
#
# MODES picks the runs (default "idle busy watchdog").
set -u
bin="${1:-target/release/examples/real_gpu}"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv

# Starts a CUDA process ($1: idle, busy or filler, which then takes all but 1 GiB of
# what is free) and waits until NVML lists it.
hold() {
  python3 - "$1" <<'PY' &
import sys, time, torch
x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("holding", x.numel() >> 20, "MiB,", sys.argv[1], flush=True)
if sys.argv[1] == "filler":
    free, _ = torch.cuda.mem_get_info()
    y = torch.empty(free - (1 << 30), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print("filler: the card has", torch.cuda.mem_get_info()[0] >> 20, "MiB free", flush=True)
if sys.argv[1] == "busy":
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    while True:
        a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
time.sleep(3600)
PY
  holder=$!
  for _ in $(seq 1 120); do
    nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -qw "$holder" && break
    sleep 0.5
  done
}

rc=0
for mode in ${MODES:-idle busy watchdog}; do
  echo "== $mode: GPU processes before"
  hold "$mode"
  filler=""
  if [ "$mode" = watchdog ]; then
    pod_process=$holder
    hold filler
    filler=$holder
    holder=$pod_process
    for _ in $(seq 1 120); do
      [ "$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)" -lt 1536 ] && break
      sleep 0.5
    done
  fi
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
  case "$mode" in
    idle) "$bin" "$holder" 40 || rc=$? ;;
    busy) "$bin" "$holder" 35 || rc=$? ;;
    watchdog) "$bin" "$holder" 3 1024 || rc=$? ;;
  esac
  sleep 1
  echo "== $mode: GPU processes after"
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
  kill -9 "$holder" $filler 2>/dev/null
  wait 2>/dev/null
done
exit "$rc"
