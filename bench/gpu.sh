#!/usr/bin/env bash
# On a GPU machine without internet (issue 7): install the prepared wheels from .whl/ (see README), register
# NVIDIA's OpenCL driver, then run the given stages, each writing under $OUT:
#   test    the kernel and model checks of the test suite on the GPU (TUNER_TEST_DEVICE=nvidia)
#   tune    tune the layer suite (bench/gpu.py tune; resumable, stops starting tasks after $DEADLINE s; with
#           PRIORITY=path/gpu_cudnn.csv only the layers slower than cuDNN there, the slowest first)
#   cudnn   time cuDNN / PyTorch eager on the same layers
#   matmul  the matmul template tuned on attention shapes against torch.bmm (bench/matmul_gpu.py) -> matmul_gpu.md
#   transfer  the committed H200 log on this GPU, as is and with --transfer-from (issue 26) -> transfer_from_h100.txt
#   agent   the device agent's conformance suite against the local backend on this GPU (issue 24), then
#           bench/agent.py (trials per minute and kernel times, agent against local); MNN's build (for peers)
#           runs in the background during the suite and is waited for before the timed part
#   peers   whole models with transfers (issue 25): native runtime with pinned staging and without, the Python
#           executor (and bench/_trees/old's, if prepared), MNN's OpenCL backend, PyTorch (bench/runtimes_gpu.py
#           all, the H200 log relabeled for this GPU; MNN's source and wheel in .mnn/, carried)
#   fallback  untuned models (every layer's fallback config) with each of bench/_trees/{$TREES}'s fallbacks
#           (default: old new; $FB_MODELS, the zoo's and torchvision's (tv_NAME), exported here; $ROUNDS rounds)
#   plans   --scope auto with the committed H100 log, bench/_trees/{$TREES}: plans timed, kept plans run alternately
#   plan_noise  the timing that picks --scope auto's plan: in one process, alone, native, and compile's own (issue 26)
#   plan_timer  compile --scope auto with --plan-timer native and python (3 processes each), the kept plans run natively
#   fallback_layers  the same, per layer: each tree's fallback configs' kernel time (bench/fallbacks.py)
#   peak    the device's float32 FMA rate (OpenCL kernel; torch.matmul without TF32 as a cross-check) and copy
#           bandwidth (clEnqueueCopyBuffer of 1 GiB; a torch copy as a cross-check) -> gpu_peak.json (~30 s)
#   stream  per layer: the best logged kernels re-timed (one launch, profiling events) and, like cuDNN, as one of
#           100 back-to-back launches (ours: wall clock on a queue without profiling; cuDNN: a CUDA graph of 100
#           calls); the empty-kernel floors of each way of timing
#   models  whole-model latency with the tuned log against PyTorch eager and its CUDA-graph replay
#   tuning  bench/tuning.py on the GPU: the samplers on the report set (REPORT_2), $JOBS (5) workloads at once, resumable
#           across calls (TUNING_FROM=the tuning.tgz a call returned, copied into the checkout; $DEADLINE s a call)
#   glue    bench/glue.py (issue 35): $GLUE_MODELS exported by torch with PyTorch's CUDA-graph replay timed, then
#           compiled with the committed logs and --transfer-from auto, checked and profiled under each of
#           bench/_trees/{$TREES} (compute, reduction and glue kernel time, launches; $GLUE_LOGS: more logs,
#           $GLUE_LOGS_<tree>: one tree's own; model by model, the trees alternating, none started $GLUE_DEADLINE s after
#           the script's start;
#           $GLUE_SCOPE:
#           compile's --scope, auto; $PLAN_TIMER: its --plan-timer, python) -> glue_<device>.csv/.md
#   glue_tune  the same models exported, then the reduction tasks of their plans in $GLUE_SCOPES (auto; e.g.
#           auto,texture,buffer) tuned ($TRIALS each, 24; until $DEADLINE s; GLUE_UNTUNED=1: also any other task the
#           logs have no record of; GLUE_TEMPLATES=depthwise_conv2d,se_gate: only those templates' tasks;
#           GLUE_AGAIN=1: those the logs hold records of too; GLUE_FIX=knob=value,...: those knobs pinned;
#           GLUE_REWRITE=gates-in-producers, gates-in-readers,
#           stats-in-producers, norms-as-read or norms-as-read+stats-in-producers: only the tasks of that plan that
#           the graph's own plan lacks --
#           convolutions, so with GLUE_TEMPLATES=depthwise_conv2d or conv2d; pools-in-dense (GLUE_TEMPLATES=dense):
#           each classifier's dense reading its global pool's maps; GLUE_SCOPES=auto,buffer: the scopes
#           the compile plans those candidates in)
#           into logs/glue_tuned.jsonl (beside the device's logs: later stages of the call read it), copied to
#           $OUT/glue_tuned.jsonl, to append to the device's log under logs/
#   tasks   the tasks set (bench/export_tasks.py: detectors, segmenters, super-resolution, pose, U-Net, style) exported
#           at $SIZE (224), then bench/models.py on the GPU (auto scope, Python and native) -> models_*tasks*.csv/.md
#   conv_transpose  bench/conv_transpose.py: ConvTranspose layers as phases against zero insertion, each tuned with
#           $TRIALS (24) measurements -> conv_transpose_<device>.csv/.md (issue 38)
#   budget  bench/budget.py tune: $BUDGETS (model:seconds,...) from empty logs -> budget.tgz (issue 53)
#   budget_curve  bench/budget.py curve on budget.tgz (carried): latency after $POINTS minutes, fallback, committed
#   precision  bench/precision.py (issue 56): fp32, fp16 (--precision off) and the precision guard's mixed plan of
#           $PREC_MODELS (the zoo's and torchvision's tv_NAME, exported here with torch) with BatchNorm-calibrated and
#           uncalibrated weights, compiled with the committed logs and --transfer-from auto: tuner-run latency
#           ($RUNS, 100), error and top-1 against onnxruntime in both runtimes, the nodes kept -> precision_<fp>.csv/.md
#   stats_epilogue  bench/stats_epilogue.py: each of $SE_PRESETS' (gn32 style gn1) convolutions without and with its
#           norm statistics, for the log's config and its neighbours in $SE_KNOBS (split_k,wg_w,wg_h,tile_oc; none);
#           SE_ABLATE=1: also with parts of the epilogue left out; each of bench/_trees/{$SE_TREES} (new), $SE_CALLS
#           (1) processes each, alternating -> $OUT/stats_epilogue_<tree>_<call>/
#   norm_readers  bench/norm_readers.py: each of $NR_PRESETS' (gn32) readers (a norm applied as read) against the
#           plain convolution, for the log's config, its neighbours in $NR_KNOBS and the knob dicts of $NR_CONFIGS
#           (JSON, ';' between) -> $OUT/norm_readers/
#   norm_plans  bench/norm_plans_profile.py: each of $GLUE_MODELS' norms-step plans (plain, as read, the candidate)
#           profiled node by node, under each of bench/_trees/{$TREES} (new) -> $OUT/norm_plans_<model>_<tree>.json
#   profile  where a measurement's seconds go (bench/measure_profile.py): phases in one process, the Measurer's rate
#   table   gpu_summary.md from the files under $OUT and the log: per layer against cuDNN and the roofline bound
# usage: OUT=/tmp/out bench/gpu.sh test tune
set -uo pipefail
shopt -s expand_aliases
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# the checkout with bench/results/ and logs/ is over what the device tool copies (64 MiB): a copy without them
# (git sparse-checkout set --no-cone '/*' '!/bench/results/' '!/logs/') carries the logs as bench/_trees/logs.tgz
# (tar czf bench/_trees/logs.tgz logs/*.jsonl), unpacked here
if ! ls logs/*.jsonl > /dev/null 2>&1 && [ -f bench/_trees/logs.tgz ]; then tar xzf bench/_trees/logs.tgz; fi
if [ ! -d /tmp/site/tuner ]; then  # the wheels, then this checkout as a package (templates/ -> tuner.templates)
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -3
  PYTHONPATH=/tmp/site python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -3
fi
export PYTHONPATH=/tmp/site
# timm for bench/glue.py's timm_NAME models (.whl_timm/, carried, as prepared in bench/notes/glue.md): its own
# wheels always, the generic ones only where the machine's Python lacks them (never shadowing torch's)
if [ -d .whl_timm ] && [ ! -d /tmp/site/timm ]; then
  for w in .whl_timm/*.whl; do
    m=$(basename "$w" | cut -d- -f1 | tr 'A-Z' 'a-z'); m=${m/pyyaml/yaml}
    case $m in packaging|fsspec|filelock|typing_extensions|tqdm|yaml|idna|click)
      python3 -c "import $m" 2>/dev/null && continue ;;
    esac
    python3 -m pip install -q --no-index --no-deps --target /tmp/site "$w" 2>&1 | tail -1
  done
fi
# run outside the checkout: its tuner/ (without tuner.templates) must not shadow the installed package,
# in this shell or in the measuring processes it starts
REPO=$PWD; mkdir -p /tmp/gpu_work; cd /tmp/gpu_work
alias python3="python3 -P"
mkdir -p /etc/OpenCL/vendors
[ -f /etc/OpenCL/vendors/nvidia.icd ] || echo /usr/lib/libnvidia-opencl.so.1 > /etc/OpenCL/vendors/nvidia.icd
FB_MODELS=${FB_MODELS:-resnet18,mobilenet_v2,mobilenet_v3_small,tv_mobilenet_v3_large,tv_efficientnet_b0}
export_models() {  # DIR LIST: the zoo's and torchvision's (tv_NAME) models as ONNX under DIR/models
  python3 "$REPO/bench/runtimes_gpu.py" export --work "$1" --models "$2" --input-size "${SIZE:-224}" 2>&1 | tail -2
}
for stage in "$@"; do
  echo "== $stage $(date -u +%H:%M:%S)"
  case $stage in
    test)
      { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -m tuner devices
        (cd "$REPO/tests" && TUNER_TEST_DEVICE=nvidia python3 -P -m pytest -q -p no:cacheprovider test_conv2d.py \
          test_codegen.py test_examples.py test_graph_kernels.py test_model.py -m "not slow" -k "not cli" 2>&1 | tail -15)
      } 2>&1 | tee "$OUT/gpu_tests.txt" ;;
    tune) python3 "$REPO/bench/gpu.py" tune --out "$OUT" --deadline "${DEADLINE:-400}" --trials "${TRIALS:-16}" --templates "${TEMPLATES:-}" \
            ${PRIORITY:+--priority "$REPO/$PRIORITY"} \
            --dtypes "${DTYPES:-float32,float16}" --scopes "${SCOPES:-texture,buffer}" 2>&1 | grep -v "CompilerWarning\|lambda: self._prg" | tee -a "$OUT/gpu_tune.txt"
          for f in "$OUT"/*.jsonl; do gzip -kf "$f"; done ;;  # files over 16 MiB do not come back
    agent)  # tests import the installed tuner: its native/ is the checkout's
      ln -sfn "$REPO/native" /tmp/site/native
      MNN_PID=
      if [ -f "$REPO/.mnn/mnn-src.tgz" ] && [ ! -x /tmp/mnn_build/b/benchmark.out ]; then
        python3 "$REPO/bench/runtimes_gpu.py" mnn-build --out "$OUT" --work /tmp/mnn_work \
          --mnn-src "$REPO/.mnn/mnn-src.tgz" > "$OUT/mnn_build.txt" 2>&1 &
        MNN_PID=$!
      fi
      { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
        # the repository on the path after the installed package: the faulty templates are tests.faulty_templates
        (cd "$REPO/tests" && PYTHONPATH=/tmp/site:$REPO TUNER_TEST_DEVICE=nvidia python3 -P -m pytest -q \
          -p no:cacheprovider test_agent_conformance.py -rs 2>&1 | grep -v "CompilerWarning\|lambda: self._prg" \
          > "$OUT/agent_conformance_full.txt"; tail -25 "$OUT/agent_conformance_full.txt")
      } 2>&1 | tee "$OUT/agent_conformance_nvidia.txt"
      [ -n "$MNN_PID" ] && { wait "$MNN_PID"; tail -3 "$OUT/mnn_build.txt"; }  # the timing below runs alone
      [ "${AGENT_BENCH:-1}" = 0 ] || python3 "$REPO/bench/agent.py" --device nvidia --out "$OUT" 2>&1 \
        | grep -v "CompilerWarning\|lambda: self._prg\|_create_built\|prg.build" | tail -20 ;;
    glue)
      python3 "$REPO/bench/glue.py" export --work /tmp/gw --cuda ${GLUE_MODELS:+--models "$GLUE_MODELS"} 2>&1 | grep -v Warning | tail -12
      # model by model, the trees alternating and their order reversed every other model (the same conditions
      # for each); no new model after $GLUE_DEADLINE s from the script's start
      models=${GLUE_MODELS:-$(python3 -c "import sys; sys.path.insert(0, sys.argv[1]); import glue; print(','.join(glue.MODELS))" "$REPO/bench")}
      [ -n "$models" ] || { echo "glue: no model list"; exit 1; }
      order="${TREES:-old new}"
      for m in ${models//,/ }; do
        [ -n "${GLUE_DEADLINE:-}" ] && [ "$SECONDS" -ge "$GLUE_DEADLINE" ] && { echo "deadline: $m and later not run"; break; }
        for tree in $order; do
          own="GLUE_LOGS_$tree"  # a tree's own extra logs (records of a knob the other tree's template lacks)
          PYTHONPATH="$REPO/bench/_trees/$tree:/tmp/site" python3 "$REPO/bench/glue.py" ours --work /tmp/gw --tree "$tree" \
            --device nvidia --log "$REPO/logs/*.jsonl${GLUE_LOGS:+,$GLUE_LOGS}${!own:+,${!own}}" --models "$m" \
            --scope "${GLUE_SCOPE:-auto}" --plan-timer "${PLAN_TIMER:-python}" 2>&1 \
            | grep -v "Warning\|warn(\|siblings =" | tail -12
          cp /tmp/gw/ours_*.json /tmp/gw/torch.json "$OUT/" 2>/dev/null  # what is done comes back if the call is cut
        done
        order=$(echo $order | tr ' ' '\n' | tac | tr '\n' ' ')
      done
      python3 "$REPO/bench/glue.py" table --work /tmp/gw --out "$OUT" 2>&1 | tail -20 ;;
    tasks)
      python3 "$REPO/bench/export_tasks.py" --out /tmp/task_models --input-size "${SIZE:-224}" 2>&1 | grep -v Warn | tail -12
      python3 "$REPO/bench/models.py" --models-dir /tmp/task_models --device nvidia --variants auto,native:auto \
        --repeats 20 --tag tasks --log "$REPO/logs/nvidia-gpu-d4a6eca0.jsonl" --out "$OUT" 2>&1 | tail -16 ;;
    precision)
      python3 "$REPO/bench/precision.py" --device nvidia --out "$OUT" --runs "${RUNS:-100}" --size "${SIZE:-224}" \
        --models "${PREC_MODELS:-resnet18,mobilenet_v2,mobilenet_v3_small,tv_resnet18,tv_mobilenet_v2,tv_efficientnet_b0,tv_mobilenet_v3_large}" \
        --log "$REPO/logs/*.jsonl" --transfer-from auto 2>&1 | grep -v "Warning\|warn(" | tail -60 ;;
    conv_transpose)
      python3 "$REPO/bench/conv_transpose.py" --device nvidia --trials "${TRIALS:-24}" --out "$OUT" 2>&1 \
        | grep -v "Warning\|warn(" | tail -20 ;;
    glue_tune)
      python3 "$REPO/bench/glue.py" export --work /tmp/gw ${GLUE_MODELS:+--models "$GLUE_MODELS"} 2>&1 | grep "exported"
      # the new records go beside the device's logs, whose records seed each study (the other dtype's, the same
      # loop nest's: tuner.search.loop), then come back under $OUT
      rm -f "$REPO/logs/glue_tuned.jsonl"
      python3 "$REPO/bench/glue.py" tune --work /tmp/gw --device nvidia --log "$REPO/logs/*.jsonl" --trials "${TRIALS:-24}" \
        --deadline "${DEADLINE:-400}" --out-log "$REPO/logs/glue_tuned.jsonl" ${GLUE_MODELS:+--models "$GLUE_MODELS"} \
        --scopes "${GLUE_SCOPES:-auto}" ${GLUE_UNTUNED:+--untuned} \
        ${GLUE_TEMPLATES:+--templates "$GLUE_TEMPLATES"} ${GLUE_AGAIN:+--again} ${GLUE_REWRITE:+--rewrite "$GLUE_REWRITE"} ${GLUE_FIX:+--fix "$GLUE_FIX"} 2>&1 \
        | grep -v "Warning\|warn(" | tail -40
      cp "$REPO/logs/glue_tuned.jsonl" "$OUT/" 2>/dev/null ;;
    stats_epilogue)  # what a convolution's norm-statistics epilogue costs, config by config (issue 55), under each
      # of bench/_trees/{$SE_TREES} (new; the installed checkout where that tree is not prepared), alternately
      for r in $(seq "${SE_CALLS:-1}"); do for tree in ${SE_TREES:-new}; do
        PYTHONPATH="$REPO/bench/_trees/$tree:/tmp/site" python3 "$REPO/bench/stats_epilogue.py" \
          $(for p in ${SE_PRESETS:-gn32 style gn1}; do echo --preset "$p"; done) ${SE_ABLATE:+--ablate} \
          --log "$REPO/logs/*.jsonl" --knobs "${SE_KNOBS:-split_k,wg_w,wg_h,tile_oc}" --device nvidia \
          --out "$OUT/stats_epilogue_${tree}_$r" 2>&1 | grep -v "Warning\|warn(" | sed "s/^/[$tree $r] /" | tail -60
      done; done ;;
    norm_readers)  # what a convolution normalizing what it reads costs, config by config (issue 55; with its
      # factors kept in local memory too: keep_norm_factors), for $NR_PRESETS (gn32)
      given=(); IFS=';' read -ra cfgs <<< "${NR_CONFIGS:-}"; for c in "${cfgs[@]}"; do given+=(--config "$c"); done
      python3 "$REPO/bench/norm_readers.py" $(for p in ${NR_PRESETS:-gn32}; do echo --preset "$p"; done) "${given[@]}" \
        --log "$REPO/logs/*.jsonl" --knobs "${NR_KNOBS:-vec_load,tile_oc,split_k,split_c,local_input}" \
        --device nvidia --out "$OUT/norm_readers" 2>&1 | grep -v "Warning\|warn(" | tail -60 ;;
    norm_plans)  # bench/norm_plans_profile.py: $GLUE_MODELS' norms-step plans node by node, under bench/_trees/{$TREES}
      python3 "$REPO/bench/glue.py" export --work /tmp/gw ${GLUE_MODELS:+--models "$GLUE_MODELS"} 2>&1 | grep "exported"
      for m in ${GLUE_MODELS//,/ }; do for tree in ${TREES:-new}; do
        PYTHONPATH="$REPO/bench/_trees/$tree:/tmp/site" python3 "$REPO/bench/norm_plans_profile.py" \
          "/tmp/gw/models/$m.onnx" --log "$REPO/logs/*.jsonl" --device nvidia --scope "${GLUE_SCOPE:-buffer}" \
          --repeats 20 --out "$OUT/norm_plans_${m}_$tree.json" 2>&1 | grep -v "Warning\|warn(" | tail -40
      done; done ;;
    peers) python3 "$REPO/bench/runtimes_gpu.py" all --out "$OUT" --new-tree "$REPO/bench/_trees/new" \
             $([ -d "$REPO/bench/_trees/old/tuner" ] && echo --old-tree "$REPO/bench/_trees/old") \
             --only-variants "${VARIANTS:-relabeled}" --mnn-src "$REPO/.mnn/mnn-src.tgz" \
             --mnn-wheel "$(ls "$REPO"/.mnn/mnn-*.whl | head -1)" --mnn-modes "${MNN_MODES:-68,132,66,130}" --deadline "${DEADLINE:-540}" ${RESUME:+--resume} 2>&1 \
             | grep -v "CompilerWarning\|lambda: self._prg\|_create_built\|prg.build" | tail -40 ;;
    fallback)  # untuned models (an empty log: every layer's fallback config), bench/_trees/{$TREES} alternately (issue 26)
      : > /tmp/empty.jsonl; export_models /tmp/fbw "$FB_MODELS"
      for f in /tmp/fbw/models/*.onnx; do m=$(basename "$f" .onnx)
        for tree in ${TREES:-old new}; do
          PYTHONPATH="$REPO/bench/_trees/$tree:/tmp/site" python3 -m tuner compile "$f" --device nvidia \
            --log /tmp/empty.jsonl --scope "${SCOPE:-texture}" --no-progress -o /tmp/fb_${m}_$tree 2>&1 | grep -E "^compiled|error" | head -2
        done
        for r in $(seq "${ROUNDS:-3}"); do for tree in ${TREES:-old new}; do  # alternating: the same conditions for each
          echo "$m $tree round $r: $(PYTHONPATH="$REPO/bench/_trees/$tree:/tmp/site" python3 -m tuner run /tmp/fb_${m}_$tree --device nvidia --bench 50 2>/dev/null | tail -1)"
        done; done
      done 2>&1 | tee "$OUT/fallback_h100.txt" ;;
    fallback_layers)  # the same models' fallback configs per layer under each of bench/_trees/{$TREES}: kernel time (bench/fallbacks.py)
      export_models /tmp/fbw "$FB_MODELS"
      pairs=""
      for tree in ${TREES:-old new}; do
        PYTHONPATH="$REPO/bench/_trees/$tree:/tmp/site" python3 "$REPO/bench/fallbacks.py" configs --models /tmp/fbw/models/*.onnx \
          --device nvidia --scope "${SCOPE:-texture}" --out "$OUT/fallback_configs_$tree.jsonl" 2>&1 | tail -1
        pairs="$pairs $tree=$OUT/fallback_configs_$tree.jsonl"
      done
      PYTHONPATH="$REPO/bench/_trees/$(echo ${TREES:-old new} | awk '{print $NF}'):/tmp/site" python3 "$REPO/bench/fallbacks.py" measure \
        --configs $pairs --device nvidia --rounds "${ROUNDS:-3}" --out "$OUT" 2>&1 | grep -v "CompilerWarning\|prg.build\|_create_built" \
        | tee "$OUT/fallback_layers.txt" | tail -30 ;;
    plans)  # --scope auto with the committed H100 log under bench/_trees/{$TREES}: the plans timed, then the kept plans run alternately
      export_models /tmp/plw "${PL_MODELS:-tv_efficientnet_b0,tv_mobilenet_v3_large}"
      for f in /tmp/plw/models/*.onnx; do m=$(basename "$f" .onnx)
        for tree in ${TREES:-old new}; do
          echo "$m $tree: $(PYTHONPATH="$REPO/bench/_trees/$tree:/tmp/site" python3 -m tuner compile "$f" --device nvidia \
            --log "$REPO/logs/nvidia-gpu-*.jsonl" --transfer-from nvidia-gpu-fcae3850 --scope auto --no-progress \
            -o /tmp/pl_${m}_$tree 2>&1 | grep -E "^--scope auto|^compiled" | tr '\n' ' ')"
        done
        for r in $(seq "${ROUNDS:-5}"); do for tree in ${TREES:-old new}; do
          echo "$m $tree round $r: $(PYTHONPATH="$REPO/bench/_trees/$tree:/tmp/site" python3 -m tuner run /tmp/pl_${m}_$tree --device nvidia --bench 100 2>/dev/null | tail -1)"
        done; done
      done 2>&1 | tee "$OUT/plans_h100.txt" ;;
    plan_noise)  # how steady the timing is that picks --scope auto's plan (bench/plan_noise.py): $PL_MODELS, $PROCS processes
      export_models /tmp/pn "${PL_MODELS:-tv_efficientnet_b0}"
      make -C "$REPO/native" BUILD=/tmp/pn/native -j8 cli >/dev/null 2>&1 || echo "native build failed"
      for f in /tmp/pn/models/*.onnx; do m=$(basename "$f" .onnx); W=/tmp/pn/$m; PN="python3 $REPO/bench/plan_noise.py"
        $PN compile "$f" --out "$W" --log "$REPO/logs/nvidia-gpu-*.jsonl" --transfer-from nvidia-gpu-fcae3850 2>&1 | grep -v Warning
        for i in $(seq "${PROCS:-6}"); do
          $PN together "$W" >/dev/null; $PN kernels "$W" --repeats 20 >/dev/null; for p in auto texture buffer; do $PN alone "$W" --plan $p >/dev/null; done
        done
        $PN native "$W" --exe /tmp/pn/native/tuner-run --rounds "${PROCS:-6}" >/dev/null
        for i in 1 2 3; do  # what compile itself times and keeps, in fresh processes
          echo "compile $i: $(python3 -m tuner compile "$f" --device nvidia --log "$REPO/logs/nvidia-gpu-*.jsonl" \
            --transfer-from nvidia-gpu-fcae3850 --scope auto --no-progress -o "$W/compiled_$i" 2>&1 | grep -o "whole plans timed.*")"
        done | tee "$W/compiles.txt"
        $PN table "$W"; mkdir -p "$OUT/plan_noise/$m"; cp "$W/times.jsonl" "$W/plan_noise.md" "$W/compiles.txt" "$OUT/plan_noise/$m/"
      done 2>&1 | tee "$OUT/plan_noise.txt" ;;
    plan_timer)  # compile --scope auto with --plan-timer native and python, 3 processes each; then the kept plans run by tuner-run
      export_models /tmp/pt "${PL_MODELS:-tv_efficientnet_b0,tv_mobilenet_v3_large}"
      ln -sfn "$REPO/native" /tmp/site/native  # the installed package has no native sources; tuner-run builds from these
      for f in /tmp/pt/models/*.onnx; do m=$(basename "$f" .onnx)
        for i in 1 2 3; do for t in native python; do
          s=$SECONDS
          line=$(python3 -m tuner compile "$f" --device nvidia --log "$REPO/logs/nvidia-gpu-*.jsonl" --transfer-from nvidia-gpu-fcae3850 \
            --plan-timer $t --no-progress -o /tmp/pt/${m}_${t}_$i 2>&1 | grep -E "whole plans timed|rror" | head -3)
          echo "$m --plan-timer $t, compile $i ($((SECONDS - s)) s): $line"
        done; done
        for r in 1 2 3; do for t in native python; do
          echo "$m kept by $t, tuner-run round $r: $(python3 -m tuner run /tmp/pt/${m}_${t}_1 --device nvidia --runtime native --bench 100 2>&1 | tail -1)"
        done; done
      done 2>&1 | tee "$OUT/plan_timer.txt" ;;
    profile)  # where a measurement's time goes on $PROFILE_MODEL's tasks (bench/measure_profile.py, issue 53)
            python3 "$REPO/bench/measure_profile.py" --model "${PROFILE_MODEL:-resnet18}" --device nvidia --out "$OUT" \
              --configs "${CONFIGS:-4}" --tasks "${TASKS:-6}" --parallel "${PARALLEL:-12}" --tune-seconds "${TUNE_S:-0}" 2>&1 \
              | grep -v "CompilerWarning\|prg.build\|_create_built" | tail -30 ;;
    budget)  # bench/budget.py tune (issue 53): each of $BUDGETS (model:seconds,...) from an empty log (or the logs of
             # budget.tgz, carried back into the checkout: a resumed run), the logs back in $OUT/budget.tgz
            mkdir -p "$OUT/budget"; [ -f "$REPO/budget.tgz" ] && tar xzf "$REPO/budget.tgz" -C "$OUT"
            tv=$(echo "${BUDGETS//,/ }" | tr ' ' '\n' | cut -d: -f1 | grep '^tv_' | paste -sd, -)
            [ -n "$tv" ] && export_models /tmp/bw "$tv"  # torchvision's, exported here with random weights
            for mb in ${BUDGETS//,/ }; do
              python3 "$REPO/bench/budget.py" tune --models "${mb%%:*}" --budget "${mb##*:}" --device nvidia --out "$OUT/budget" \
                --models-dir /tmp/bw/models --parallel "${PARALLEL:-12}" 2>&1 | grep -v "CompilerWarning\|prg.build\|_create_built" | tail -4
            done
            (cd "$OUT" && tar czf budget.tgz --exclude='*.onnx' --exclude='studies.db*' --exclude='artifact_*' budget) && rm -rf "$OUT/budget" ;;
    budget_curve)  # bench/budget.py curve over budget.tgz's logs (carried): $CURVE_MODELS at $POINTS, the fallback
            # plan and the committed H200 log -> budget_gpu.csv/.md/.png
            mkdir -p /tmp/budget; tar xzf "$REPO/budget.tgz" -C /tmp
            tv=$(echo "$CURVE_MODELS" | tr ',' '\n' | grep '^tv_' | paste -sd, -)
            [ -n "$tv" ] && [ ! -f "/tmp/bw/models/${tv%%,*}.onnx" ] && export_models /tmp/bw "$tv"
            python3 "$REPO/bench/budget.py" curve --models "$CURVE_MODELS" --points "${POINTS:-1,2,5,10}" --device nvidia \
              --models-dir /tmp/bw/models --out /tmp/budget --runs "${RUNS:-100}" --rounds "${ROUNDS:-3}" ${COMMITTED:+--committed "$REPO/$COMMITTED"} 2>&1 \
              | grep -v "CompilerWarning\|prg.build\|_create_built" | tail -20
            cp /tmp/budget/budget_gpu.* "$OUT/" ;;
    cudnn) python3 "$REPO/bench/gpu.py" cudnn --out "$OUT" 2>&1 | tail -5 ;;
    transfer) S=${SIZE:-224}; LOG="$REPO/logs/nvidia-gpu-fcae3850.jsonl"  # the H200's log on this GPU (issue 26)
            for m in resnet18 mobilenet_v2 mobilenet_v3_small; do
              python3 -m tuner zoo $m -o /tmp/tf_$m.onnx --input-size $S >/dev/null || break
              for v in log-as-is transfer-from; do
                python3 -m tuner compile /tmp/tf_$m.onnx --device nvidia --log "$LOG" \
                  $([ $v = transfer-from ] && echo --transfer-from nvidia-gpu-fcae3850) --no-progress -o /tmp/tf_${m}_$v 2>&1 \
                  | grep -E "^compiled|layers use|sibling|plans timed" | head -4
                for r in 1 2 3; do echo "$m $v round $r: $(python3 -m tuner run /tmp/tf_${m}_$v --device nvidia --bench 50 2>/dev/null | tail -1)"; done
              done
            done 2>&1 | tee "$OUT/transfer_from_h100.txt" ;;
    matmul) python3 "$REPO/bench/matmul_gpu.py" tune --out "$OUT" --deadline "${DEADLINE:-400}" --trials "${TRIALS:-40}" 2>&1 \
              | grep -v "CompilerWarning\|lambda: self._prg\|_create_built\|prg.build" | tee "$OUT/matmul_tune.txt" | tail -20
            python3 "$REPO/bench/matmul_gpu.py" torch --out "$OUT" 2>&1 | tail -3
            python3 "$REPO/bench/matmul_gpu.py" table --out "$OUT" 2>&1 | tail -20 ;;
    peak) timeout 600 python3 -P "$REPO/bench/gpu.py" peak --out "$OUT" 2>&1 | grep -v "CompilerWarning\|prg.build\|_create_built" \
            | tee "$OUT/gpu_peak.txt" ;;
    stream) for side in ours torch; do  # each side in its own process: neither shares the GPU with the other's context
              python3 "$REPO/bench/gpu.py" stream --side $side --out "$OUT" --log "$(ls "$OUT"/*.jsonl "$REPO"/logs/nvidia*.jsonl 2>/dev/null | head -1)" \
                --dtypes "${DTYPES:-float32}" 2>&1 | grep -v "CompilerWarning\|lambda: self._prg\|_create_built\|prg.build" | tail -2
            done ;;
    models) for side in ours torch; do
              python3 "$REPO/bench/gpu.py" models --side $side --out "$OUT" --log "$(ls "$OUT"/*.jsonl "$REPO"/logs/nvidia*.jsonl 2>/dev/null | head -1)" \
                --dtypes "${DTYPES:-float32,float16}" 2>&1 | grep -v "CompilerWarning\|lambda: self._prg\|_create_built\|prg.build" | tail -8
            done ;;
    table) python3 "$REPO/bench/gpu.py" table --out "$OUT" --log "$(ls "$OUT"/*.jsonl "$REPO"/logs/nvidia*.jsonl 2>/dev/null | head -1)" \
             > "$OUT/gpu_table.txt" 2>&1; tail -3 "$OUT/gpu_table.txt"; head -12 "$OUT/gpu_summary.md" ;;
    tuning) # bench/tuning.py on the report set (issue 37), resumable across calls: the output folder comes back
            # as $OUT/tuning.tgz; copy it into the checkout and pass TUNING_FROM=<its path in the checkout> to go on
            # (a warm machine's /tmp/tuning_out is kept too). Stops starting work after $DEADLINE s (420); until the
            # benchmark is done it says "deadline: not finished" and the stage is run again
            T=${TUNING_OUT:-/tmp/tuning_out}; mkdir -p "$T"  # many files: they come back as one archive
            if [ -n "${TUNING_FROM:-}" ]; then tar -xzf "$REPO/$TUNING_FROM" -C "$T" || exit 1; fi
            python3 "$REPO/bench/tuning.py" --device nvidia --out "$T" --trials "${TRIALS:-48}" --seeds "${SEEDS:-3}" \
              --samplers "${SAMPLERS:-xgb,tpe,random,xgb-cold}" --corpus-trials "${CORPUS:-16}" \
              --workloads "${WORKLOADS:-^(conv3x3.48-32@10|conv1x1.96-48@12|conv3x3s2.24-56@20|dw5x5s2.48@24|dense.320-128)\$}" \
              --jobs "${JOBS:-5}" --parallel "${PAR:-2}" --deadline "${DEADLINE:-420}" 2>&1 \
              | grep -v "CompilerWarning\|lambda: self._prg\|_create_built\|prg.build" > "$OUT/gpu_tuning.txt"
            tar -czf "$OUT/tuning.tgz" -C "$T" . ; cp "$T"/*.md "$OUT"/ 2>/dev/null
            grep -E "^\[|corpus|geometric|wrote|deadline" "$OUT/gpu_tuning.txt" | tail -25 ;;
    model_tuning)  # BEFORE_TREE / AFTER_TREE: checkouts of the two revisions (`git archive` of each)
      python3 "$REPO/bench/model_tuning.py" --device nvidia --before-tree "$BEFORE_TREE" --after-tree "$AFTER_TREE" \
        --before "${BEFORE:-}" --after "${AFTER:-}" \
        --model "${MODEL:-resnet18}" --input-size "${SIZE:-224}" --trials "${TRIALS:-96}" --out "$OUT" 2>&1 \
        | grep -v "CompilerWarning\|lambda: self._prg\|_create_built\|prg.build" | tail -20 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
