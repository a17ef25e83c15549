#!/usr/bin/env bash
# The GPU check (issue #18), in two halves, for the project's GPU test
# machine (one H200, CUDA 13, PyTorch + transformers and the pip packages of
# cuBLAS and NCCL in its Python; none of the Debian development libraries).
#
#   bench/gpu_check.sh build   here: builds the GPU tests and bench with nvcc
#                              for sm_90 (cudart and the project's libraries
#                              linked statically) and packs them, with the
#                              shared libraries they need, into .gpu-check/
#   bench/gpu_check.sh run     there, from the repository root (carry
#                              .gpu-check): finds cuBLAS and NCCL in its
#                              Python's nvidia packages, runs the GPU unit
#                              tests, the bench and the transformers check,
#                              and prints the figures (also $OUT/gpu_check.json
#                              when $OUT is set). Under 5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
pack=.gpu-check
tests=(gpu_device_memory_test engine_device_model_test engine_builtin_engine_test)

build() {
  if [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
    echo "gpu_check: build needs nvcc (the CUDA toolkit)" >&2
    exit 1
  fi
  cmake --preset default -DSTITCH_CUDA=ON >/dev/null
  cmake --build --preset default -j "$(nproc)" --target "${tests[@]}" gpu_bench
  rm -rf "$pack"
  mkdir -p "$pack/lib" "$pack/lib-stdc++"
  for b in "${tests[@]}" gpu_bench; do
    cp build/bin/$b "$pack/"
    strip "$pack/$b"
  done
  cp bench/gpu_hf_check.py "$pack/"
  # Every shared library they load but the C library's own, the kernel's and
  # the driver's (cuBLAS and NCCL are loaded at run time from the machine).
  for b in "${tests[@]}" gpu_bench; do
    ldd "$pack/$b" | awk '/=> \//{print $3}'
  done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda.so*) ;;
      # Used only if the machine's own C++ runtime is older than this one.
      libstdc++.so*|libgcc_s.so*) cp -L "$lib" "$pack/lib-stdc++/" ;;
      *) cp -L "$lib" "$pack/lib/" ;;
    esac
  done
  echo "gpu_check: packed $(du -sh "$pack" | cut -f1) into $pack (carry it to the GPU machine)"
}

run() {
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
  return $failed
}

case "${1:-}" in
  build) build ;;
  run) run ;;
  *) echo "usage: bench/gpu_check.sh build | run" >&2; exit 2 ;;
esac
