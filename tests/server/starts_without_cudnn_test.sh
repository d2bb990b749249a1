#!/usr/bin/env bash
# A CUDA build of kilnd starts and serves on --device cpu where cuDNN and cuBLAS cannot be loaded:
# both are opened only when a CUDA device is asked for. The libraries' folders are hidden behind
# empty tmpfs mounts in a private mount namespace (root, unshare); where that is not allowed the
# test skips (77) and says so.
# Usage: starts_without_cudnn_test.sh KILND
set -euo pipefail
kilnd="$1"
if [[ "${KILN_IN_NAMESPACE:-}" != 1 ]]; then
  if ! unshare -m true 2>/dev/null; then
    echo "SKIP: cannot make a private mount namespace here (needs root and unshare -m)"
    exit 77
  fi
  KILN_IN_NAMESPACE=1 exec unshare -m "$0" "$@"
fi

# Inside the namespace: every folder that holds a libcudnn or libcublas, by the loader's cache
# and LD_LIBRARY_PATH, mounted over with an empty tmpfs.
dirs=$( (ldconfig -p | awk '/lib(cudnn|cublas)/ {print $NF}'
  for d in ${LD_LIBRARY_PATH:+${LD_LIBRARY_PATH//:/ }}; do ls "$d"/libcudnn* "$d"/libcublas* 2>/dev/null || true; done) |
  xargs -r -n1 dirname | sort -u)
for d in $dirs; do mount -t tmpfs none "$d"; done
for lib in libcudnn.so.9 libcublas.so.13; do
  if python3 -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1])' "$lib" 2>/dev/null; then
    echo "FAIL: $lib can still be loaded; the test would prove nothing"
    exit 1
  fi
done
echo "hidden: ${dirs:-(no cuDNN or cuBLAS installed)}"

state=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$state"' EXIT
"$kilnd" --listen=127.0.0.1:0 --metrics_listen= --state_dir="$state/state" \
  --data_dir="$state/data" --device=cpu > "$state/out" 2> "$state/err" &
pid=$!
for _ in $(seq 100); do
  grep -q "kilnd: listening on port" "$state/out" && break
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "FAIL: kilnd exited at start without cuDNN:"
    cat "$state/err"
    exit 1
  fi
  sleep 0.1
done
if ! grep -q "kilnd: listening on port" "$state/out"; then
  echo "FAIL: kilnd did not start listening within 10 s:"
  cat "$state/err"
  exit 1
fi
cat "$state/out"
echo "PASS: kilnd starts on --device cpu with cuDNN and cuBLAS out of reach"
