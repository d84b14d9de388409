#!/usr/bin/env bash
# Issue 26's H100 job (bench/notes/peers.md): torchvision ResNet-18, MobileNetV2, MobileNetV3-Large and
# EfficientNet-B0, float32, 224x224, ours against MNN's OpenCL backend, onnxruntime and PyTorch's CUDA-graph
# replay (bench/peers.py), untuned (the committed H200 log, --transfer-from nvidia-gpu-fcae3850) and after tuning
# each model's remaining tasks with at most $TRIALS (16) trials each.
#
# The device tool ends a machine 30 s after a call and a command after 10 minutes, so the work runs as one
# background pipeline (setsid) under $W (/tmp/pj), resumable from stamp files, and each call of
#     bash $T/bench/peers_gpu.sh poll PHASE        (T: this tree, e.g. .peers/tree)
# starts it if it is not running, waits up to $WAIT (540) s, prints progress and copies the results to $OUT.
# PHASE: tune (export, then tune the remaining tasks until $TUNE_DEADLINE s) or measure (export, finish the
# tuning within $TUNE_DEADLINE s, then `peers.py run` untuned and tuned, every side in the same run).
# Carried beside the tree: $P/whl/*.whl (cp312 wheels), $P/mnn/{mnn-src.tgz,MNN-*.whl}, $P/tunelogs/part*.jsonl.gz
# (an earlier machine's tuning, restored before anything is tuned). P is the tree's parent folder.
# SKIP_TUNE=1: measure with the tuning restored from $P/tunelogs only.
set -uo pipefail
T=$(cd "$(dirname "$0")/.." && pwd); P=$(dirname "$T")
W=${W:-/tmp/pj}; mkdir -p "$W"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MODELS=${MODELS:-tv_resnet18,tv_mobilenet_v2,tv_mobilenet_v3_large,tv_efficientnet_b0}
SIB=nvidia-gpu-fcae3850
TRIALS=${TRIALS:-16}
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0

setup() {
  [ -f "$W/setup.ok" ] && return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$P"/whl/*.whl 2>&1 | tail -3
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site "$T" 2>&1 | tail -3
  mkdir -p /etc/OpenCL/vendors
  if ! grep -qil nvidia /etc/OpenCL/vendors/*.icd 2>/dev/null; then
    lib=$(ldconfig -p | awk '/libnvidia-opencl\.so\.1/ {print $NF; exit}')
    echo "${lib:-/usr/lib/libnvidia-opencl.so.1}" > /etc/OpenCL/vendors/nvidia.icd
  fi
  mkdir -p "$W/tune" "$W/sib"
  for f in "$P"/tunelogs/part*.jsonl.gz; do [ -f "$f" ] && gunzip -c "$f" > "$W/tune/$(basename "$f" .gz)"; done
  # the carried tree is replaced at every call: the H200's log is unpacked outside it
  if [ -f "$T/logs/$SIB.jsonl.gz" ]; then gunzip -c "$T/logs/$SIB.jsonl.gz" > "$W/sib/$SIB.jsonl"; else cp "$T/logs/$SIB.jsonl" "$W/sib/"; fi
  cp "$W/sib/$SIB.jsonl" "$W/tune/"  # where the tuned compile's glob and the history look for the sibling
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -P -m tuner devices; } \
    > "$W/devices.txt" 2>&1
  touch "$W/setup.ok"
}

pipeline() {
  local phase=$1
  cd "$W"
  echo "== pipeline $phase $(date -u +%T)"
  setup
  cat "$W/devices.txt"
  if [ ! -x /tmp/mnn_build/b/benchmark.out ] && [ "$phase" = measure ]; then  # in the background: CPU only
    python3 -P "$T/bench/runtimes_gpu.py" mnn-build --out "$W/mnnb" --work /tmp/mnn_bw --mnn-src "$P/mnn/mnn-src.tgz" \
      --mnn-build /tmp/mnn_build > "$W/mnn_build.txt" 2>&1 &
    MNN_PID=$!
  fi
  echo "== export $(date -u +%T)"
  python3 -P "$T/bench/runtimes_gpu.py" export --work "$W/work" --models "$MODELS" --input-size 224 2>&1 | tail -6
  if [ "${SKIP_TUNE:-0}" = 0 ]; then
    echo "== tune $(date -u +%T)"
    python3 -P "$T/bench/peers.py" tune --device nvidia --models "$MODELS" --work "$W/work" --out "$W/res" \
      --tune-log-dir "$W/tune" --transfer-from $SIB --sibling-logs "$W/sib/$SIB.jsonl" --trials "$TRIALS" \
      --deadline "${TUNE_DEADLINE:-1200}" 2>&1 | tail -5
    tail -3 "$W"/tune/part*.txt
  fi
  if [ "$phase" = measure ]; then
    [ -n "${MNN_PID:-}" ] && { wait "$MNN_PID"; tail -2 "$W/mnn_build.txt"; }
    for tag in untuned tuned; do
      [ -f "$W/$tag.ok" ] && continue
      echo "== run $tag $(date -u +%T)"
      if [ $tag = untuned ]; then LOG="$W/sib/$SIB.jsonl"; SIDES=native,python,mnn,ort,torch
      else LOG="$W/tune/*.jsonl"; SIDES=native,mnn,torch; fi
      python3 -P "$T/bench/peers.py" run --device nvidia --models "$MODELS" --input-size 224 --work "$W/work" \
        --out "$W/res" --tag $tag --log "$LOG" --transfer-from $SIB --sides $SIDES --rounds "${ROUNDS:-3}" \
        --repeats 50 --warmup 10 --mnn-src "$P/mnn/mnn-src.tgz" --mnn-wheel "$(ls "$P"/mnn/*.whl | head -1)" \
        --mnn-build /tmp/mnn_build --mnn-modes "${MNN_MODES:-132,68,130}" --mnn-timeout 120 2>&1 \
        | grep -E "^\[.*(ours|round [0-9]+ \S+ (native|mnn)|device)|^\|" | cut -c1-300
      touch "$W/$tag.ok"
    done
  fi
  if [ "$phase" = retune ]; then  # a plan the first pass did not tune: e.g. MobileNetV3-Large's buffer plan
    echo "== retune $(date -u +%T)"
    python3 -P "$T/bench/peers.py" tune --device nvidia --models "$TUNE_MODELS" --scope "$TUNE_SCOPE" --work "$W/work" \
      --out "$W/res" --tune-log-dir "$W/tune" --transfer-from $SIB --sibling-logs "$W/sib/$SIB.jsonl" \
      --trials "$TRIALS" --deadline "${TUNE_DEADLINE:-600}" 2>&1 | tail -3
    tail -2 "$W"/tune/part*.txt
    [ -x /tmp/mnn_build/b/benchmark.out ] || python3 -P "$T/bench/runtimes_gpu.py" mnn-build --out "$W/mnnb" \
      --work /tmp/mnn_bw --mnn-src "$P/mnn/mnn-src.tgz" --mnn-build /tmp/mnn_build > "$W/mnn_build.txt" 2>&1
    echo "== run tuned2 $(date -u +%T)"
    python3 -P "$T/bench/peers.py" run --device nvidia --models "$MODELS" --input-size 224 --work "$W/work" \
      --out "$W/res" --tag tuned2 --log "$W/tune/*.jsonl" --transfer-from $SIB --sides native,mnn,torch --rounds 3 \
      --repeats 50 --warmup 10 --mnn-src "$P/mnn/mnn-src.tgz" --mnn-wheel "$(ls "$P"/mnn/*.whl | head -1)" \
      --mnn-build /tmp/mnn_build --mnn-modes "${MNN_MODES:-132,68,130}" --mnn-timeout 120 2>&1 \
      | grep -E "^\[.*(ours )|^\|" | cut -c1-300
  fi
  echo "== done $(date -u +%T)"
  touch "$W/done.$phase"
}

collect() {
  cat "$W"/tune/part*.jsonl 2>/dev/null | gzip > "$OUT/h100_tuning.jsonl.gz"
  cp "$W"/res/peers.{json,md,csv} "$W"/res/tune_tasks*.json "$OUT/" 2>/dev/null
  tar -czf "$OUT/logs.tgz" -C "$W" pipeline.log devices.txt $(cd "$W" && ls tune/*.txt tune/*.db res/peers.log mnn_build.txt 2>/dev/null) 2>/dev/null
  ls -la "$OUT"
}

case ${1:-} in
  pipeline) pipeline "$2" ;;
  poll)
    phase=$2
    if [ ! -f "$W/started.$phase" ]; then
      touch "$W/started.$phase"
      setsid nohup bash "$0" pipeline "$phase" >> "$W/pipeline.log" 2>&1 < /dev/null &
    fi
    t0=$(date +%s)
    while [ ! -f "$W/done.$phase" ] && [ $(( $(date +%s) - t0 )) -lt "${WAIT:-540}" ]; do sleep 10; done
    tail -40 "$W/pipeline.log"; tail -2 "$W"/tune/part*.txt 2>/dev/null
    collect
    [ -f "$W/done.$phase" ] && echo "PIPELINE DONE" || echo "PIPELINE RUNNING" ;;
  *) echo "usage: $0 poll tune|measure"; exit 2 ;;
esac
