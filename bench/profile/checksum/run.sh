#!/usr/bin/env bash
# On the GPU machine, from the repository root: times the checksum kernel's
# variants (bench/profile/checksum/variants.cu) and profiles the shipped one
# at 1 GiB with Nsight Compute. Here: build it into .gpu-check first with
#   nvcc -O3 -std=c++20 -arch=sm_90 -I. bench/profile/checksum/variants.cu \
#     -o .gpu-check/checksum_variants
set -uo pipefail
out=${OUT:-/tmp/checksum-profile}
mkdir -p "$out"
timeout 120 .gpu-check/checksum_variants 2>&1 | tee "$out/variants.txt"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ -n "$ncu" ]; then
  # The shipped variant's first launch at 1 GiB: 2 sizes x 8 variants x 10 launches before it.
  timeout 180 "$ncu" --kernel-name regex:digest --launch-skip 160 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section LaunchStats --section SchedulerStats \
    .gpu-check/checksum_variants > "$out/ncu.txt" 2>&1
  grep -vE "^(==PROF==|  *-+ )" "$out/ncu.txt" | sed -n '/digest/,$p' | head -150
else
  echo "no ncu on this machine"
fi
