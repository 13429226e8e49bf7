#!/usr/bin/env bash
# gpu/run.sh [SECTION...] - run on the GPU machine, from the checkout's root, after
# `cargo xtask gpu-stage` laid out target/gpu/ here (see the README, "Measuring on a GPU").
# Sections (default: check llm cnn):
#   install  only install the staged parts (the first of the two calls that carry them)
#   check    the device plumbing on the GPU: python/check_device_memory.py with the GPU backend
#   llm      the Qwen2.5-0.5B-shaped int4 decoders, fp16 and fp32: ORT's CPU EP, the MLX EP
#            (KV in the EP's memory, and growing), and the native MLX floor, in one run
#   cnn      an OCR-style and a YOLO-style detector (gpu/cnn_models.py): CPU EP vs MLX EP,
#            session, first run and steady state
#   soak     python/check_soak.py on the GPU (memory flat over runs, sessions and shapes)
#   tune     the fp16 decoder's steady decode under MLX's CUDA batching settings
#            (MLX_MAX_OPS_PER_BUFFER, MLX_USE_CUDA_GRAPHS), after one run that compiles
#   profile  the fp32 decoder (KV in the EP's memory, then growing) with the EP's verbose
#            summary (time per phase, bytes copied), and the fp16 one with per-step progress
#   probe    gpu/decode_probe.py: a decode step written in MLX, one change per variant
#   steps    the fp16 decoder with the KV in the EP's memory, verbose, per-step progress,
#            once per value of $COMPILE (default "1"; "0 1" runs eager first); each compiled
#            graph's Graphviz text into $OUT/graphs-c$COMPILE/
#   native   the native MLX floor alone, fp16 and fp32, eager and compiled
#   report   the README's GPU figures in one call: both decoders (KV in the EP's memory, traced,
#            the bare compiled graph), the native floor, the CNNs, the fp16 decoder growing
#   coldstart first runs on an empty kernel cache and in a second process, per compile mode
#            ($MODES: fuse0 eager fuse1, or default): the CNNs and the fp16 decoder
#   controlflow python/check_control_flow.py --bench: the VAD-shaped model and the audio
#            front-end (If, LSTM, Scan, DFT), ORT's CPU EP against the MLX EP
#   primcost the cost of one primitive on the device: gpu/chain_models.py's chains (staged in
#            target/gpu/models/) through the EP, bare compiled graph per node, fused and not;
#            with target/gpu/old/libonnxruntime_mlx_ep.so present, that plugin too (A/B)
#   overhead the EP's per-run overhead: the decoders ($PRESETS, default the fp16 one) with the KV
#            in the EP's memory, spans per run (gpu/trace_summary.py) and the bare compiled
#            graph; the native floor; the CNNs with host-bound, then device-bound inputs and
#            outputs (`--io device`); each again with target/gpu/old/'s plugin when present
#   hostcopy the copies between host memory and the EP's per ONNXRUNTIME_EP_MLX_HOST_COPY mode
#            (direct, staged, kernel): the fp16 decoder (KV in the EP's memory, spans per run)
#            and the CNNs with host-bound inputs and outputs
#   kerneltimes a decoder's first generation on an empty kernel cache ($PRESETS), then the
#            modules MLX compiled in order with the time each took (gpu/kernel_times.py)
#   attention the EP's one-query attention kernel on and off: gpu/attention_models.py's models
#            against the CPU EP, the decoders' spans, primitives and bare graph, the native floor
#   conformance the property suite on the GPU against ORT's CPU EP: $CASES cases (default 4) of
#            every lowering's spec ($OPS: a comma-separated subset), a line per op as it ends;
#            shrunk failures into $OUT/conformance-failures
#   cmd      the command in $GPU_CMD, in this environment (for one-off measurements)
#   keep     the JIT kernel cache into $OUT/kernels.tar.gz (a later machine can carry it
#            back: MLX_EP_KERNELS=path/kernels.tar.gz unpacks it before anything runs)
# Everything printed also goes to $OUT/log (the device tool brings $OUT back), each report's
# JSON to $OUT/results.tar.gz.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-/tmp/mlx-gpu-out}
mkdir -p "$out" /tmp/mlx-gpu/json
log=$out/log
exec > >(tee -a "$log") 2>&1
sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=(check llm cnn)

# The staged runtime: installed once per machine, then the kept environment.
if [ -f "$HOME/mlx-stage/.installed" ]; then
  source "$HOME/mlx-stage/env.sh"
else
  parts=(target/gpu/stage/*/)
  env_line=$(bash "${parts[0]}install.sh" "${parts[@]}" 2>&1 | tail -1)
  case $env_line in
    export*) eval "$env_line" ;;
    *) echo "gpu/run.sh: runtime not complete yet ($env_line)"; exit 3 ;;
  esac
fi
site=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
export ORT_DYLIB_PATH=$site/onnxruntime/capi/libonnxruntime.so.1.31.1
export ORT_MLX_EP_LIB=$root/target/gpu/bin/libonnxruntime_mlx_ep.so
export PATH=$root/target/gpu/bin:$PATH PYTHONUNBUFFERED=1
# MLX keeps JIT-compiled kernels under the temporary directory: one per machine, kept across calls.
export TMPDIR=${TMPDIR:-/tmp}
kernels=${XDG_CACHE_HOME:-$HOME/.cache}/onnxruntime-mlx-ep/kernels
if [ -n "${MLX_EP_KERNELS:-}" ] && [ -f "$MLX_EP_KERNELS" ] && [ ! -e "$kernels.unpacked" ]; then
  mkdir -p "$kernels" && tar -C "$kernels" -xzf "$MLX_EP_KERNELS" && touch "$kernels.unpacked"
  echo "kernel cache: $(find "$kernels" -type f | wc -l) files unpacked from $MLX_EP_KERNELS"
fi

with_env() { (if [ ${#env_set[@]} -gt 0 ]; then export "${env_set[@]}"; fi; "$@"); }
section() { echo; echo "===== $* ($(date +%T))"; }
timed() {  # timed LIMIT_S NAME CMD...: run CMD under a time limit, print its wall time
  local limit=$1 name=$2; shift 2
  local t0 rc; t0=$(date +%s%N)
  timeout "$limit" "$@"; rc=$?
  echo "----- $name: exit $rc in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
}

for s in "${sections[@]}"; do
  case $s in
    install) section "installed"; python3 -c "import mlx.core as mx, onnxruntime as o; print(mx.default_device(), o.__version__)";;
    check)
      section "device plumbing on the GPU"
      nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
      python3 -c "import mlx.core as mx; print('MLX', mx.__version__, mx.default_device())"
      MLX_EP_BACKEND=cuda timed 300 check_device_memory python3 python/check_device_memory.py ;;
    llm)
      for p in qwen2.5-0.5b-fp16 qwen2.5-0.5b; do
        section "decoder $p, KV in the EP's memory"
        timed 240 "llm $p device" mlx-ep-run llm --preset "$p" --kv device --prompt 128 --steps 32 \
          --json "/tmp/mlx-gpu/json/llm-$p-device.json"
        section "native MLX floor $p (eager, mlx-lm's way)"
        timed 120 "native $p" mlx-ep-bench native --preset "$p" --prompt 128 --steps 32 \
          --json "/tmp/mlx-gpu/json/native-$p.json"
        section "native MLX floor $p (compiled shapeless step)"
        timed 120 "native $p compiled" mlx-ep-bench native --preset "$p" --prompt 128 --steps 32 --mode compiled \
          --json "/tmp/mlx-gpu/json/native-$p-compiled.json"
      done
      for p in qwen2.5-0.5b qwen2.5-0.5b-fp16; do
        section "decoder $p, growing KV"
        timed 150 "llm $p growing" mlx-ep-run llm --preset "$p" --kv growing --prompt 128 --steps 32 \
          --json "/tmp/mlx-gpu/json/llm-$p-growing.json"
      done ;;
    cnn)
      section "CNN models"
      timed 300 export python3 gpu/cnn_models.py /tmp/mlx-gpu/models
      for m in ocr_det yolo_det; do
        section "$m (first process)"
        timed 200 "$m" mlx-ep-run run "/tmp/mlx-gpu/models/$m.onnx" --repeat 30 --json "/tmp/mlx-gpu/json/$m-1.json"
        section "$m (second process: kernels cached)"
        timed 100 "$m again" mlx-ep-run run "/tmp/mlx-gpu/models/$m.onnx" --repeat 30 --json "/tmp/mlx-gpu/json/$m-2.json"
      done ;;
    soak)
      section "soak and churn on the GPU"
      timed 300 soak python3 python/check_soak.py --json /tmp/mlx-gpu/json/soak.json ;;
    tune)
      for setting in default MLX_MAX_OPS_PER_BUFFER=100 MLX_MAX_OPS_PER_BUFFER=1000 MLX_USE_CUDA_GRAPHS=0; do
        section "tune: fp16 decoder, KV in the EP's memory, $setting"
        name=${setting//=/-}
        if [ "$setting" = default ]; then env_set=(); else env_set=("$setting"); fi
        timed 200 "tune $setting" env "${env_set[@]}" mlx-ep-run llm --preset qwen2.5-0.5b-fp16 --kv device \
          --prompt 128 --steps 32 --json "/tmp/mlx-gpu/json/tune-$name.json"
      done
      section "tune: native MLX floor, fp16 (same run)"
      timed 120 "native fp16" mlx-ep-bench native --preset qwen2.5-0.5b-fp16 --prompt 128 --steps 32 \
        --json /tmp/mlx-gpu/json/tune-native.json ;;
    profile)
      for kv in device growing; do
        section "profile: fp32 decoder, KV $kv, verbose"
        MLX_EP_RUN_PROGRESS=1 ONNXRUNTIME_EP_MLX_VERBOSE=1 timed 150 "profile fp32 $kv" mlx-ep-run llm --preset qwen2.5-0.5b \
          --kv "$kv" --prompt 128 --steps 32 --json "/tmp/mlx-gpu/json/profile-fp32-$kv.json"
      done
      section "profile: fp16 decoder, KV in the EP's memory, per step"
      MLX_EP_RUN_PROGRESS=1 ONNXRUNTIME_EP_MLX_VERBOSE=1 timed 200 "profile fp16 device" mlx-ep-run llm \
        --preset qwen2.5-0.5b-fp16 --kv device --prompt 128 --steps 32 --json "/tmp/mlx-gpu/json/profile-fp16-device.json" ;;
    probe)
      section "decode step written in MLX, variants"
      timed 400 probe python3 gpu/decode_probe.py --json /tmp/mlx-gpu/json/probe.json ;;
    steps)
      for c in ${COMPILE:-1}; do
        section "probe: fp16 decoder, KV in the EP's memory, compile=$c, verbose"
        ONNXRUNTIME_EP_MLX_GRAPH_DIR=$out/graphs-c$c \
        ONNXRUNTIME_EP_MLX_COMPILE=$c ONNXRUNTIME_EP_MLX_VERBOSE=1 MLX_EP_RUN_PROGRESS=1 timed 300 "probe fp16 compile=$c" \
          mlx-ep-run llm --preset qwen2.5-0.5b-fp16 --kv device --prompt 128 --steps 32 \
          --json "/tmp/mlx-gpu/json/probe-fp16-device-c$c.json"
      done ;;
    native)
      for p in qwen2.5-0.5b-fp16 qwen2.5-0.5b; do
        for m in eager compiled; do
          section "native MLX floor $p ($m)"
          timed 150 "native $p $m" mlx-ep-bench native --preset "$p" --prompt 128 --steps 32 --mode "$m" \
            --json "/tmp/mlx-gpu/json/native-$p-$m.json"
        done
      done ;;
    overhead)
      # With target/gpu/old/libonnxruntime_mlx_ep.so present, each run again with that plugin
      # (the same machine and kernel cache: an A/B of the EP's own work).
      plugins=(new); [ -f target/gpu/old/libonnxruntime_mlx_ep.so ] && plugins+=(old)
      for p in ${PRESETS:-qwen2.5-0.5b-fp16}; do
        for which in "${plugins[@]}"; do
          lib=$ORT_MLX_EP_LIB; [ "$which" = old ] && lib=$root/target/gpu/old/libonnxruntime_mlx_ep.so
          section "overhead: decoder $p, KV in the EP's memory, $which plugin"
          ORT_MLX_EP_LIB=$lib ONNXRUNTIME_EP_MLX_VERBOSE=1 ONNXRUNTIME_EP_MLX_BARE_REPLAYS=20 \
            ONNXRUNTIME_EP_MLX_TRACE=$out/trace-$p-$which.json timed 200 "llm $p $which" mlx-ep-run llm \
            --preset "$p" --kv device --prompt 128 --steps 32 --json "/tmp/mlx-gpu/json/overhead-$p-$which.json" 2>&1 \
            | grep -E "bare compiled|decode  |first generation|agree|time:|EP's memory|fallback|prologue"
          python3 gpu/trace_summary.py "$out/trace-$p-$which.json"
        done
        section "overhead: native MLX floor $p"
        timed 90 "native $p" mlx-ep-bench native --preset "$p" --prompt 128 --steps 32 \
          --json "/tmp/mlx-gpu/json/overhead-native-$p.json" | grep -E "decode|prefill"
      done
      if [ "${CNN:-1}" = 1 ]; then
        timed 120 export python3 gpu/cnn_models.py /tmp/mlx-gpu/models >/dev/null 2>&1
        for m in ocr_det yolo_det; do
          for which in "${plugins[@]}"; do
            lib=$ORT_MLX_EP_LIB; [ "$which" = old ] && lib=$root/target/gpu/old/libonnxruntime_mlx_ep.so
            section "overhead: $m, host-bound and device-bound inputs and outputs, $which plugin"
            ORT_MLX_EP_LIB=$lib ONNXRUNTIME_EP_MLX_VERBOSE=1 ONNXRUNTIME_EP_MLX_BARE_REPLAYS=20 \
              ONNXRUNTIME_EP_MLX_TRACE=$out/trace-$m-$which.json timed 200 "$m $which" mlx-ep-run run \
              "/tmp/mlx-gpu/models/$m.onnx" --repeat 30 --io device --json "/tmp/mlx-gpu/json/overhead-$m-$which.json" 2>&1 \
              | grep -E "first run|  (CPU|MLX)ExecutionProvider|bare compiled|max abs|EP's memory"
            echo "host-bound runs:"; python3 gpu/trace_summary.py "$out/trace-$m-$which.json" --runs 2:32
            echo "device-bound runs:"; python3 gpu/trace_summary.py "$out/trace-$m-$which.json" --runs -30:
          done
        done
      fi ;;
    hostcopy)
      timed 120 export python3 gpu/cnn_models.py /tmp/mlx-gpu/models >/dev/null 2>&1
      for mode in ${HOST_COPY_MODES:-direct staged kernel}; do
        section "hostcopy: $mode, decoder qwen2.5-0.5b-fp16, KV in the EP's memory"
        ONNXRUNTIME_EP_MLX_HOST_COPY=$mode ONNXRUNTIME_EP_MLX_TRACE=$out/trace-hc-$mode.json timed 200 "llm $mode" \
          mlx-ep-run llm --preset qwen2.5-0.5b-fp16 --kv device --prompt 128 --steps 32 \
          --json "/tmp/mlx-gpu/json/hostcopy-llm-$mode.json" 2>&1 | grep -E "decode  |first generation|agree"
        python3 gpu/trace_summary.py "$out/trace-hc-$mode.json"
        for m in ocr_det yolo_det; do
          section "hostcopy: $mode, $m"
          ONNXRUNTIME_EP_MLX_HOST_COPY=$mode timed 100 "$m $mode" mlx-ep-run run "/tmp/mlx-gpu/models/$m.onnx" \
            --repeat 30 --json "/tmp/mlx-gpu/json/hostcopy-$m-$mode.json" 2>&1 | grep -E "  (CPU|MLX)ExecutionProvider: [0-9]|max abs"
        done
      done ;;
    report)
      # The README's GPU table in one call (about 450 s on a fresh machine): the decoders with
      # the KV in the EP's memory (trace per run, the bare compiled graph), the native floor,
      # the CNNs (second process: the bare compiled graph too), the fp16 decoder's growing KV.
      for p in qwen2.5-0.5b-fp16 qwen2.5-0.5b; do
        section "report: decoder $p, KV in the EP's memory"
        ONNXRUNTIME_EP_MLX_VERBOSE=1 ONNXRUNTIME_EP_MLX_BARE_REPLAYS=20 ONNXRUNTIME_EP_MLX_TRACE=$out/trace-$p.json \
          timed 200 "llm $p device" mlx-ep-run llm --preset "$p" --kv device --prompt 128 --steps 32 \
          --json "/tmp/mlx-gpu/json/llm-$p-device.json" 2>&1 | cut -c1-200
        python3 gpu/trace_summary.py "$out/trace-$p.json"
      done
      for p in qwen2.5-0.5b-fp16 qwen2.5-0.5b; do
        section "report: native MLX floor $p (eager)"
        timed 90 "native $p" mlx-ep-bench native --preset "$p" --prompt 128 --steps 32 \
          --json "/tmp/mlx-gpu/json/native-$p.json"
      done
      timed 60 export python3 gpu/cnn_models.py /tmp/mlx-gpu/models >/dev/null 2>&1
      for m in ocr_det yolo_det; do
        section "report: $m (first process, then a second with the kernels cached)"
        timed 60 "$m" mlx-ep-run run "/tmp/mlx-gpu/models/$m.onnx" --repeat 30 --json "/tmp/mlx-gpu/json/$m-1.json" \
          | grep -E "first run|latency|  (CPU|MLX)ExecutionProvider: [0-9]|max abs"
        ONNXRUNTIME_EP_MLX_VERBOSE=1 ONNXRUNTIME_EP_MLX_BARE_REPLAYS=20 timed 30 "$m again" mlx-ep-run run \
          "/tmp/mlx-gpu/models/$m.onnx" --repeat 30 --io device --json "/tmp/mlx-gpu/json/$m-2.json" 2>&1 \
          | grep -E "first run|  (CPU|MLX)ExecutionProvider(:|,)|bare compiled|EP's memory"
      done
      section "report: decoder qwen2.5-0.5b-fp16, growing KV"
      timed 90 "llm fp16 growing" mlx-ep-run llm --preset qwen2.5-0.5b-fp16 --kv growing --prompt 128 --steps 32 \
        --json /tmp/mlx-gpu/json/llm-fp16-growing.json
      section "report: the kernel caches"
      for d in "$kernels" "$TMPDIR/mlx"; do
        [ -d "$d" ] && echo "$d: $(find "$d" -type f | wc -l) files, $(du -sh "$d" | cut -f1)"
      done ;;
    coldstart)
      # First runs on an empty kernel cache (MLX's and the CUDA driver's, fresh per mode), then
      # a second process, per compile mode: $MODES (default "fuse0 eager fuse1"): compiled
      # without fused kernels (the default on CUDA), eager, compiled with them; `default` sets
      # nothing (the options' defaults). $LLM=0 skips the decoder.
      timed 60 export python3 gpu/cnn_models.py /tmp/mlx-gpu/models >/dev/null 2>&1
      for mode in ${MODES:-fuse0 eager fuse1}; do
        case $mode in
          fuse0) env_set=(ONNXRUNTIME_EP_MLX_FUSE=0) ;;
          eager) env_set=(ONNXRUNTIME_EP_MLX_COMPILE=0) ;;
          default) env_set=() ;;
          *) env_set=(ONNXRUNTIME_EP_MLX_FUSE=1) ;;
        esac
        rm -rf "/tmp/mlx-cold-$mode" "/tmp/nv-cold-$mode"
        env_set+=(ONNXRUNTIME_EP_MLX_KERNEL_CACHE="/tmp/mlx-cold-$mode" CUDA_CACHE_PATH="/tmp/nv-cold-$mode")
        for m in ocr_det yolo_det; do
          section "coldstart $mode: $m (empty kernel cache, then a second process)"
          with_env timed 150 "$mode $m" mlx-ep-run run "/tmp/mlx-gpu/models/$m.onnx" --repeat 30 \
            --json "/tmp/mlx-gpu/json/cold-$mode-$m-1.json" | grep -E "first run|  (CPU|MLX)ExecutionProvider: [0-9]|max abs"
          with_env timed 60 "$mode $m again" mlx-ep-run run "/tmp/mlx-gpu/models/$m.onnx" --repeat 30 \
            --json "/tmp/mlx-gpu/json/cold-$mode-$m-2.json" | grep -E "first run|  (CPU|MLX)ExecutionProvider: [0-9]"
        done
        if [ "${LLM:-1}" = 1 ]; then
          section "coldstart $mode: fp16 decoder, KV in the EP's memory (empty kernel cache)"
          with_env timed 200 "$mode llm fp16" mlx-ep-run llm --preset qwen2.5-0.5b-fp16 --kv device \
            --prompt 128 --steps 32 --json "/tmp/mlx-gpu/json/cold-$mode-llm-fp16.json" | grep -E "first generation|decode  |agree|^-----"
          section "coldstart $mode: fp16 decoder, second process (kernels cached), traced"
          with_env timed 100 "$mode llm fp16 again" env ONNXRUNTIME_EP_MLX_TRACE="$out/trace-cold-$mode-llm.json" \
            mlx-ep-run llm --preset qwen2.5-0.5b-fp16 --kv device --prompt 128 --steps 32 \
            --json "/tmp/mlx-gpu/json/cold-$mode-llm-fp16-2.json" | grep -E "first generation|decode  |agree|^-----"
          python3 gpu/trace_summary.py "$out/trace-cold-$mode-llm.json" --first 2
        fi
        echo "kernel cache $mode: $(find "/tmp/mlx-cold-$mode" -type f 2>/dev/null | wc -l) files, $(du -sh "/tmp/mlx-cold-$mode" 2>/dev/null | cut -f1)"
      done ;;
    controlflow)
      section "control flow: a VAD-shaped model and an audio front-end, CPU EP vs MLX EP"
      (cd python && timed 200 controlflow python3 check_control_flow.py --bench) ;;
    primcost)
      libs=("$ORT_MLX_EP_LIB"); [ -f target/gpu/old/libonnxruntime_mlx_ep.so ] && libs+=("$root/target/gpu/old/libonnxruntime_mlx_ep.so")
      for lib in "${libs[@]}"; do
        for m in add addb cast; do
          for f in 0 1; do
            section "primcost: $m, fuse=$f, $lib"
            ORT_MLX_EP_LIB=$lib ONNXRUNTIME_EP_MLX_FUSE=$f ONNXRUNTIME_EP_MLX_VERBOSE=1 ONNXRUNTIME_EP_MLX_BARE_REPLAYS=50 \
              timed 120 "primcost $m fuse=$f" mlx-ep-run run "target/gpu/models/$m.onnx" --repeat 50 2>&1 \
              | grep -E "bare compiled|graph per run|MLXExecutionProvider: [0-9.]+ ms" | cut -c1-220
          done
        done
      done ;;
    kerneltimes)
      # A decoder's first generation on an empty kernel cache ($PRESETS, default the fp16 one),
      # then which modules MLX compiled, in order, with the time each took (gpu/kernel_times.py).
      for p in ${PRESETS:-qwen2.5-0.5b-fp16}; do
        section "kerneltimes: decoder $p, KV in the EP's memory, empty kernel cache"
        rm -rf "/tmp/mlx-kt-$p" "/tmp/nv-kt-$p"
        start=$(date +%s.%N)
        ONNXRUNTIME_EP_MLX_KERNEL_CACHE="/tmp/mlx-kt-$p" CUDA_CACHE_PATH="/tmp/nv-kt-$p" MLX_EP_RUN_PROGRESS=1 \
          ONNXRUNTIME_EP_MLX_VERBOSE=1 timed 240 "cold llm $p" mlx-ep-run llm --preset "$p" --kv device \
          --prompt 128 --steps 32 2>&1 | grep -vE "^\s+step ([3-9]|[12][0-9]|3[0-2]):" | cut -c1-400
        python3 gpu/kernel_times.py "/tmp/mlx-kt-$p" --start "$start"
      done ;;
    attention)
      # The EP's own one-query attention kernel (ONNXRUNTIME_EP_MLX_ATTENTION_KERNEL) on and off:
      # gpu/attention_models.py's GroupQueryAttention models (built into target/gpu/models by
      # `cargo xtask gpu-stage`) against the CPU EP, then the decoders ($PRESETS) with the KV in
      # the EP's memory (primitives per run, bare compiled graph, spans per run), and the native floor.
      for k in 1 0; do
        section "attention: kernel=$k, GroupQueryAttention models against the CPU EP"
        ONNXRUNTIME_EP_MLX_ATTENTION_KERNEL=$k timed 120 "attention models kernel=$k" \
          python3 gpu/attention_models.py check target/gpu/models
      done
      for p in ${PRESETS:-qwen2.5-0.5b-fp16}; do
        for k in 1 0; do
          section "attention: decoder $p, KV in the EP's memory, kernel=$k"
          ONNXRUNTIME_EP_MLX_ATTENTION_KERNEL=$k ONNXRUNTIME_EP_MLX_VERBOSE=1 ONNXRUNTIME_EP_MLX_BARE_REPLAYS=20 \
            ONNXRUNTIME_EP_MLX_TRACE=$out/trace-$p-k$k.json timed 200 "llm $p kernel=$k" mlx-ep-run llm \
            --preset "$p" --kv device --prompt 128 --steps 32 --json "/tmp/mlx-gpu/json/attention-$p-k$k.json" 2>&1 \
            | grep -E "bare compiled|graph per run|decode  |first generation|agree" | cut -c1-400
          python3 gpu/trace_summary.py "$out/trace-$p-k$k.json"
        done
        section "attention: decoder $p, KV in the EP's memory, kernel=1, untraced"
        ONNXRUNTIME_EP_MLX_ATTENTION_KERNEL=1 timed 200 "llm $p untraced" mlx-ep-run llm --preset "$p" --kv device --prompt 128 --steps 32 \
          --json "/tmp/mlx-gpu/json/attention-$p-plain.json" 2>&1 | grep -E "prefill|decode  |agree"
        section "attention: native MLX floor $p"
        timed 90 "native $p" mlx-ep-bench native --preset "$p" --prompt 128 --steps 32 | grep -E "decode|prefill"
      done ;;
    conformance)
      section "conformance: the property suite on the GPU against the CPU EP (${CASES:-4} cases per op)"
      suite=/tmp/mlx-gpu/mlx-ep-conformance
      # (Unpacked every time: a warm machine may hold an earlier staging's suite.)
      gunzip -c target/gpu/bin/mlx-ep-conformance.gz > "$suite.tmp" && chmod +x "$suite.tmp" && mv "$suite.tmp" "$suite"
      args=(--log --cases "${CASES:-4}" --failures-dir "$out/conformance-failures" --json /tmp/mlx-gpu/json/conformance.json)
      [ -n "${OPS:-}" ] && args+=(--op "$OPS")
      timed "${CONFORMANCE_LIMIT:-540}" conformance "$suite" "${args[@]}" 2>&1 | grep --line-buffered -vE '^\S+ +\S+ +[0-9]+ +[0-9]+ +0 +0 |^(\S+): ([0-9]+)/\2 passed' ;;
    cmd)
      section "command: $GPU_CMD"
      bash -c "$GPU_CMD" ;;
    keep)
      section "kernel cache"
      du -sh "$kernels" 2>/dev/null; find "$kernels" -type f 2>/dev/null | wc -l
      tar -C "$kernels" -czf "$out/kernels.tar.gz" . && ls -la "$out/kernels.tar.gz" ;;
    *) echo "gpu/run.sh: unknown section '$s'"; exit 2 ;;
  esac
done
tar -C /tmp/mlx-gpu -czf "$out/results.tar.gz" json
