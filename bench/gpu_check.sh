#!/usr/bin/env bash
# The GPU check (issue #18), in two halves, for the project's GPU test
# machine (one H200, CUDA 13, PyTorch + transformers and the pip packages of
# cuBLAS and NCCL in its Python; none of the Debian development libraries).
#
#   bench/gpu_check.sh build   here: builds the GPU tests and bench with nvcc
#                              for sm_90 (cudart and the project's libraries
#                              linked statically) and packs them, with the
#                              shared libraries they need, into
#                              .gpu-check.tar.xz
#   bench/gpu_check.sh run     there, from the repository root (carry
#                              .gpu-check.tar.xz): finds cuBLAS and NCCL in its
#                              Python's nvidia packages, runs the GPU unit
#                              tests, the bench and the transformers check,
#                              then the host benches (store_bench and
#                              activation_bench at 1 GB: the byte-path and
#                              pointer-latency figures on a machine of more
#                              than two cores), and prints the figures (also
#                              under $OUT when $OUT is set). Under 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
pack=.gpu-check
tests=(gpu_device_memory_test engine_device_model_test engine_builtin_engine_test)
# The host benches and the programs store_bench starts from its own folder.
host=(store_bench activation_bench stitch-node stitch)

build() {
  if [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
    echo "gpu_check: build needs nvcc (the CUDA toolkit)" >&2
    exit 1
  fi
  cmake --preset default -DSTITCH_CUDA=ON >/dev/null
  cmake --build --preset default -j "$(nproc)" --target "${tests[@]}" gpu_bench "${host[@]}"
  rm -rf "$pack"
  mkdir -p "$pack/lib" "$pack/lib-stdc++"
  for b in "${tests[@]}" gpu_bench "${host[@]}"; do
    cp build/bin/$b "$pack/"
    strip "$pack/$b"
  done
  cp bench/gpu_hf_check.py "$pack/"
  # Every shared library they load but the C library's own, the kernel's and
  # the driver's (cuBLAS and NCCL are loaded at run time from the machine).
  for b in "${tests[@]}" gpu_bench "${host[@]}"; do
    ldd "$pack/$b" | awk '/=> \//{print $3}'
  done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda.so*) ;;
      # Used only if the machine's own C++ runtime is older than this one.
      libstdc++.so*|libgcc_s.so*) cp -L "$lib" "$pack/lib-stdc++/" ;;
      *) cp -L "$lib" "$pack/lib/" ;;
    esac
  done
  # Packed, the binaries would pass the 64 MiB a device call may carry.
  tar -cf - "$pack" | xz -6 -T "$(nproc)" >"$pack.tar.xz"
  rm -rf "$pack"
  echo "gpu_check: packed $(du -sh "$pack.tar.xz" | cut -f1) into $pack.tar.xz (carry it to the GPU machine)"
}

run() {
  if [ ! -d "$pack" ] && [ -f "$pack.tar.xz" ]; then
    # Python's tarfile: the GPU machine may have no xz.
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(".")' "$pack.tar.xz"
  fi
  [ -d "$pack" ] || { echo "gpu_check: no $pack; run 'bench/gpu_check.sh build' first" >&2; exit 1; }
  local out=${OUT:-/tmp/gpu-check}
  mkdir -p "$out"
  local libs
  libs=$(python3 - <<'PY'
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
found = set()
for root in roots:
    for pattern in ("libcublas.so*", "libcublasLt.so*", "libnccl.so*"):
        for path in glob.glob(os.path.join(root, "nvidia", "**", pattern), recursive=True):
            found.add(os.path.dirname(path))
print(":".join(sorted(found)))
PY
)
  # Only our binaries see these paths: Python keeps its own libraries.
  local path="$PWD/$pack/lib${libs:+:$libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ! LD_LIBRARY_PATH="$path" "$pack/gpu_device_memory_test" --gtest_list_tests >/dev/null 2>&1; then
    path="$PWD/$pack/lib-stdc++:$path"
  fi
  bin() { LD_LIBRARY_PATH="$path" "$@"; }
  echo "gpu_check: $(date -u +%FT%TZ) on $(nvidia-smi -L 2>/dev/null | head -1 || echo 'no nvidia-smi')"
  echo "gpu_check: cuBLAS and NCCL from ${libs:-nowhere}"
  local failed=0
  for t in "${tests[@]}"; do
    echo "== $t"
    if ! bin timeout 120 "$pack/$t" --gtest_brief=1 2>&1 | tee "$out/$t.log" | tail -n 40; then
      failed=1
    fi
    grep -q "FAILED" "$out/$t.log" && failed=1
    # On the GPU machine a GPU test that skips is a failure: it says why.
    if grep -q "needs a CUDA device" "$out/$t.log"; then
      echo "gpu_check: $t skipped GPU tests on the GPU machine" >&2
      failed=1
    fi
  done
  echo "== gpu_bench"
  bin timeout 240 "$pack/gpu_bench" --json | tee "$out/gpu_bench.json" || failed=1
  echo "== transformers"
  rm -rf /tmp/stitch-hf
  if bin timeout 60 "$pack/gpu_bench" --hf-dir /tmp/stitch-hf; then
    timeout 120 python3 "$pack/gpu_hf_check.py" /tmp/stitch-hf | tee "$out/hf_check.json" || failed=1
  else
    failed=1
  fi
  echo "gpu_check: $([ $failed -eq 0 ] && echo passed || echo FAILED)"
  # The host figures on this machine's 16 cores (they do not decide the GPU
  # check's verdict; record them in bench/README.md's tables beside the 2-core figures).
  echo "== store_bench --mb 1024"
  STITCH_PYTHON_CLIENT="$PWD/clients/python" bin timeout 300 "$pack/store_bench" --mb 1024 --json \
    | tee "$out/store_bench.json" || echo "gpu_check: store_bench failed"
  echo "== activation_bench --mb 1024"
  bin timeout 180 "$pack/activation_bench" --mb 1024 --json | tee "$out/activation_bench.json" \
    || echo "gpu_check: activation_bench failed"
  return $failed
}

case "${1:-}" in
  build) build ;;
  run) run ;;
  *) echo "usage: bench/gpu_check.sh build | run" >&2; exit 2 ;;
esac
