#!/usr/bin/env bash
# native/cross/qemu-arm64.sh: the native programs (tuner-agent, tuner-run, libtuner_runtime.so) cross-compiled for
# linux-arm64 and run under qemu-aarch64 (user mode) against Debian's arm64 PoCL. For Debian 12 (bookworm) on
# x86_64, as root or with sudo; run from anywhere, as often as you like (setup skips what is there).
#
#   native/cross/qemu-arm64.sh                    setup, build and check; the whole output goes to
#                                                 bench/results/qemu_arm64.txt (LOG=FILE elsewhere)
#   native/cross/qemu-arm64.sh setup              apt: qemu-user, Debian's aarch64 cross gcc, the arm64 libraries
#                                                 PoCL needs (multiarch); PoCL arm64 unpacked into build/qemu-arm64/
#   native/cross/qemu-arm64.sh build              tuner native build --target linux-arm64 (zig where present, else
#                                                 aarch64-linux-gnu-gcc): build/native/linux-arm64/
#   native/cross/qemu-arm64.sh check              (a) tests/test_agent_conformance.py with TUNER_TEST_AGENT=
#                                                 native/cross/arm64-agent (the arm64 agent under qemu, exec://)
#                                                 and TUNER_TEST_ADB_AGENT, TUNER_TEST_ADB_RUN (the same agent
#                                                 through adb:// and the stand-in adb); (b) `tuner
#                                                 devices` through it; (c) mobilenet_v3_small (32x32) compiled for its
#                                                 device, run by the arm64 tuner-run, compared with onnxruntime
#   native/cross/qemu-arm64.sh run PROG [ARGS]    an arm64 program under qemu-aarch64 with the arm64 OpenCL (what
#                                                 native/cross/arm64-agent does: --device exec://native/cross/arm64-agent)
#
# What it takes to run them (found here; qemu-user 7.2, PoCL 3.1, LLVM 15):
# - No -L: once `dpkg --add-architecture arm64` installs libc6:arm64, / is an arm64 root as well
#   (/lib/ld-linux-aarch64.so.1, /usr/lib/aarch64-linux-gnu). `-L /usr/aarch64-linux-gnu` (the cross compiler's
#   libc) runs the programs alone, but pairs that ld.so (2.36-8cross1) with the multiarch libc (2.36-9+deb12u*)
#   once PoCL's libraries load, and PoCL then hangs.
# - PoCL arm64 is unpacked, not installed: libpocl2:arm64 depends on clang-15:arm64, which needs binutils:arm64,
#   and that replaces the host's binutils, removing gcc, g++ and build-essential. What libpocl needs (LLVM 15,
#   clang-cpp 15, hwloc, the ocl-icd loader) installs beside the host's; libpocl2:arm64 and libpocl2-common are
#   unpacked (dpkg -x) into build/qemu-arm64/root and named by absolute path in build/qemu-arm64/vendors/pocl.icd
#   (OCL_ICD_VENDORS). PoCL finds its kernel library and headers next to libpocl.so (../../share/pocl): a qemu -L
#   prefix does not do, as qemu maps the paths of open() but not of faccessat(), which PoCL checks them with.
# - PoCL compiles kernels in-process (its LLVM, emulated: seconds per kernel) and links each kernel's .so by
#   exec'ing /usr/aarch64-linux-gnu/bin/ld, the host's cross ld (binutils-aarch64-linux-gnu, x86_64), which
#   qemu-user's execve runs natively, with crtbegin.o, -lc and -lgcc from libc6-dev:arm64 and libgcc-12-dev:arm64.
# - The agent's executor is a fork: the qemu process forks with it, and a kernel that faults kills that qemu
#   process with SIGSEGV, as on a board.
# - TUNER_OPENCL_LIB=libOpenCL.so.1 (the arm64 loader), PYOPENCL_HOME unset: otherwise the tuner's exec:// hands
#   the agent this machine's OpenCL environment (pyopencl's x86_64 loader). POCL_CACHE_DIR=build/qemu-arm64/pocl-cache.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
Q=${TUNER_QEMU_ARM64_DIR:-$ROOT/build/qemu-arm64}
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3
AGENT_SPEC=exec://native/cross/arm64-agent
SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
# host (amd64) packages, then the arm64 ones that install beside the host's (Multi-Arch: same)
HOST_PKGS="qemu-user gcc-aarch64-linux-gnu binutils-aarch64-linux-gnu libc6-dev-arm64-cross"
ARM64_PKGS="libc6:arm64 libc6-dev:arm64 libgcc-12-dev:arm64 libstdc++6:arm64 ocl-icd-libopencl1:arm64 libllvm15:arm64
  libclang-cpp15:arm64 libclang-common-15-dev:arm64 libhwloc15:arm64"
UNPACKED="libpocl2:arm64 libpocl2-common"   # into $Q/root, not installed (see above)

die() { echo "error: $*" >&2; exit 2; }

setup() {
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
        $SUDO dpkg --add-architecture arm64 || die "dpkg --add-architecture arm64 failed"
    fi
    local missing=""
    for p in $HOST_PKGS $ARM64_PKGS; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
    done
    if [ -n "$missing" ] || ! apt-cache show libpocl2:arm64 >/dev/null 2>&1; then
        $SUDO apt-get update -q || die "apt-get update failed"
    fi
    if [ -n "$missing" ]; then
        # --no-remove: never trade the host's packages for arm64 ones (it would rather fail)
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends --no-remove $HOST_PKGS \
            $ARM64_PKGS || die "apt-get install failed (the arm64 packages must be of the host's versions: an apt-get upgrade may help)"
    fi
    local want have
    want=$(apt-cache policy libpocl2:arm64 | awk '/Candidate:/ {print $2}')
    have=$(cat "$Q/root/.pocl-version" 2>/dev/null)
    if [ "$want" != "$have" ] || [ ! -f "$Q/vendors/pocl.icd" ]; then
        rm -rf "$Q/root" "$Q/debs" && mkdir -p "$Q/root" "$Q/debs" "$Q/vendors" || die "cannot write $Q"
        (cd "$Q/debs" && apt-get download -q -o APT::Sandbox::User=root $UNPACKED) || die "apt-get download $UNPACKED failed"
        for d in "$Q"/debs/*.deb; do dpkg-deb -x "$d" "$Q/root" || die "dpkg-deb -x $d failed"; done
        local lib
        lib=$(ls "$Q"/root/usr/lib/aarch64-linux-gnu/libpocl.so.*.* | head -1)
        [ -f "$lib" ] || die "no libpocl.so in $Q/root"
        echo "$lib" > "$Q/vendors/pocl.icd"
        echo "$want" > "$Q/root/.pocl-version"
    fi
    echo "setup: qemu-aarch64, aarch64-linux-gnu-gcc, arm64 PoCL $(cat "$Q/root/.pocl-version") in $Q/root"
}

build() {
    (cd "$ROOT" && "$PY" -m tuner native build --target linux-arm64) || die "the linux-arm64 build failed"
}

run() {
    local prog=${1:-}
    [ -n "$prog" ] || die "usage: $0 run PROGRAM [ARGS]"
    shift
    [ -f "$prog" ] || die "no arm64 program at $prog: run $0 build"
    command -v qemu-aarch64 >/dev/null || die "no qemu-aarch64: run $0 setup"
    [ -f "$Q/vendors/pocl.icd" ] || die "no arm64 PoCL in $Q: run $0 setup"
    export TUNER_OPENCL_LIB=libOpenCL.so.1 OCL_ICD_VENDORS="$Q/vendors" POCL_CACHE_DIR="$Q/pocl-cache"
    unset PYOPENCL_HOME OCL_ICD_FILENAMES
    exec qemu-aarch64 "$prog" "$@"
}

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f s", b - a}'; }

check() {
    cd "$ROOT" || exit 2
    local fails=0 t a_rc b_rc c_rc
    export TUNER_TEST_AGENT=native/cross/arm64-agent
    # and through adb:// with the stand-in adb (tests/stand_in_adb.py): the arm64 agent pushed to a "phone" that
    # runs it under qemu (this script's run), the launch token on its standard input, the link TCP
    export TUNER_TEST_ADB_AGENT=$ROOT/build/native/linux-arm64/tuner-agent TUNER_TEST_ADB_RUN="$HERE/qemu-arm64.sh run"
    # the run deadline: PoCL's emulated LLVM specializes each kernel on its first run (seconds under qemu, more on
    # a busy machine); the suite's 4 s is for a native device
    export TUNER_TEST_RUN_TIMEOUT=${TUNER_TEST_RUN_TIMEOUT:-30}
    rm -rf "$Q/pocl-cache" "$Q/model"   # cold: every kernel is compiled under emulation
    mkdir -p "$Q/model"

    echo "== (a) agent conformance: TUNER_TEST_AGENT=$TUNER_TEST_AGENT TUNER_TEST_RUN_TIMEOUT=$TUNER_TEST_RUN_TIMEOUT" \
         "TUNER_TEST_ADB_AGENT=$TUNER_TEST_ADB_AGENT TUNER_TEST_ADB_RUN='$TUNER_TEST_ADB_RUN'" \
         "pytest tests/test_agent_conformance.py (exec:// and adb://)"
    t=$(now)
    "$PY" -m pytest -q -p no:xdist -p no:cacheprovider -rps tests/test_agent_conformance.py; a_rc=$?
    echo "(a) exit status $a_rc, $(since "$t")"

    echo; echo "== (b) tuner devices --device $AGENT_SPEC"
    t=$(now)
    "$PY" -m tuner devices --device "$AGENT_SPEC" && "$PY" -m tuner devices --json --device "$AGENT_SPEC" > "$Q/model/profile.json"
    b_rc=$?
    echo "(b) exit status $b_rc, $(since "$t")"

    echo; echo "== (c) mobilenet_v3_small 32x32: tuner compile --device $AGENT_SPEC, the arm64 tuner-run, onnxruntime"
    t=$(now)
    c_rc=0
    "$PY" -m tuner zoo mobilenet_v3_small -o "$Q/model/m.onnx" --input-size 32 || c_rc=1
    if [ $c_rc = 0 ]; then
        local tc; tc=$(now)
        "$PY" -m tuner compile "$Q/model/m.onnx" --device "$AGENT_SPEC" --no-progress -o "$Q/model/art" || c_rc=1
        echo "compile: $(since "$tc")"
    fi
    if [ $c_rc = 0 ]; then
        "$PY" - "$Q/model" <<'EOF' || c_rc=1
import json, sys
from pathlib import Path
import numpy as np
d = Path(sys.argv[1])
g = json.loads((d / "art" / "graph.json").read_text())
shape = g["entries"][g["inputs"][0]]["shape"]
np.save(d / "x.npy", np.random.default_rng(1).standard_normal(shape).astype(np.float32))
print("input", shape)
EOF
    fi
    if [ $c_rc = 0 ]; then
        for pass in cold warm; do   # cold: PoCL builds every program; warm: from the artifact's binary cache
            local tr; tr=$(now)
            "$HERE/qemu-arm64.sh" run build/native/linux-arm64/tuner-run "$Q/model/art" --input "$Q/model/x.npy" \
                --output "$Q/model/y.npy" --bench 3 --warmup 1 || { c_rc=1; break; }
            echo "tuner-run ($pass start): $(since "$tr")"
        done
    fi
    if [ $c_rc = 0 ]; then
        "$PY" - "$Q/model" <<'EOF' || c_rc=1
import sys
from pathlib import Path
import numpy as np
import onnxruntime as ort
d = Path(sys.argv[1])
x, y = np.load(d / "x.npy"), np.load(d / "y.npy")
s = ort.InferenceSession(str(d / "m.onnx"), providers=["CPUExecutionProvider"])
want = s.run(None, {s.get_inputs()[0].name: x})[0]
assert y.shape == want.shape, (y.shape, want.shape)
rel = float(np.abs(y - want).max() / max(np.abs(want).max(), 1e-30))
print(f"output {list(y.shape)}: max |arm64 tuner-run - onnxruntime| / max |onnxruntime| = {rel:.3g} "
      f"(onnxruntime {ort.__version__}); top-1 {'matches' if y.argmax() == want.argmax() else 'differs'}")
sys.exit(0 if rel < 1e-4 else 1)
EOF
    fi
    echo "(c) exit status $c_rc, $(since "$t")"

    echo
    for r in "a:$a_rc" "b:$b_rc" "c:$c_rc"; do
        [ "${r#*:}" = 0 ] || fails=$((fails + 1))
    done
    echo "== summary: (a) conformance $( [ $a_rc = 0 ] && echo passed || echo FAILED ), (b) devices" \
         "$( [ $b_rc = 0 ] && echo passed || echo FAILED ), (c) model $( [ $c_rc = 0 ] && echo passed || echo FAILED )"
    return $fails
}

versions() {
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); host: $(uname -srm), Debian $(cat /etc/debian_version);" \
         "$(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
    local changed
    changed=$(cd "$ROOT" && git diff --name-only HEAD -- native/src native/include tuner/agent tuner/native.py tests/test_agent_conformance.py 2>/dev/null | paste -sd' ')
    echo "commit $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null)${changed:+, with uncommitted changes to $changed}"
    echo "qemu: $(qemu-aarch64 --version | head -1)"
    local cc
    cc=$(cd "$ROOT" && "$PY" -c 'from tuner.native import _cross_cc; print(" ".join(_cross_cc("linux-arm64", None, None)))')
    echo "compiler: $cc: $($cc --version 2>&1 | head -1)"
    echo "PoCL (unpacked): $(for d in "$Q"/debs/*.deb; do dpkg-deb -W --showformat='${Package}:${Architecture} ${Version}\n' "$d"; done | paste -sd',' | sed 's/,/, /g')"
    echo "packages: $(dpkg-query -W -f='${Package}:${Architecture} ${Version}\n' $HOST_PKGS $ARM64_PKGS 2>/dev/null | paste -sd',' | sed 's/,/, /g')"
    echo "python: $("$PY" -c 'import sys, pytest, onnxruntime, numpy; print(sys.version.split()[0], "pytest", pytest.__version__, "onnxruntime", onnxruntime.__version__, "numpy", numpy.__version__)')"
    for f in "$ROOT"/build/native/linux-arm64/{tuner-agent,tuner-run,libtuner_runtime.so}; do
        echo "$(basename "$f"): $(stat -c %s "$f") bytes; $(file -b "$f" | cut -d, -f1-2);" \
             "$(readelf -dW "$f" | grep -qE '\((FLAGS|FLAGS_1)\).*\b(BIND_NOW|NOW)\b' && echo BIND_NOW || echo 'lazy binding')," \
             "$(readelf -lW "$f" | grep -q GNU_RELRO && echo GNU_RELRO || echo 'no RELRO')"
    done
}

all() {
    local log=${LOG:-$ROOT/bench/results/qemu_arm64.txt} t rc
    mkdir -p "$(dirname "$log")"
    t=$(now)
    {
        echo "# native/cross/qemu-arm64.sh: linux-arm64 build under qemu-aarch64 with Debian's arm64 PoCL"
        setup && build || exit 2
        versions
        echo
        check; rc=$?
        echo "total $(since "$t")"
        exit $rc
    } 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    echo "(the output above is in $log)"
    return "$rc"
}

case "${1:-all}" in
    setup) setup ;;
    build) build ;;
    check) check ;;
    run) shift; run "$@" ;;
    all) all ;;
    -h|--help|help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
    *) die "unknown command ${1}: setup, build, check, run PROG [ARGS], or none for all" ;;
esac
