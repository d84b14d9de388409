"""``tuner native``: build the native programs (runtime, agent; cross builds) and print the OpenCL environment
they need here (``tuner.native`` does the work)."""
from __future__ import annotations

import sys

import tuner.native as native
from tuner.cli.parser import Parser  # the CLI's error line: `error: ...`, exit status 2
from tuner.errors import TunerError


def native_main(argv=None) -> int:
    """``tuner native build [--target host] [--build-dir DIR]``: build and print ``runtime PATH`` lines;
    ``tuner native env``: print the environment (``NAME=VALUE``) a native program needs for OpenCL here."""
    p = Parser(prog="tuner native", description="the native runtime (C): build it, run it")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build libtuner_runtime.so, tuner-run, tuner-agent and their ASan builds "
                                     "under asan/, in build/native of a source checkout, else in "
                                     "~/.cache/tuner/native/VERSION-HASH (the sources: native/, or those the "
                                     "installed package carries)")
    b.add_argument("--target", default="host", help="host (default), or a cross build (runtime and agent, in "
                                                     "TARGET/ of the build folder) for " + ", ".join(native.CROSS))
    b.add_argument("--compiler", choices=("zig", "gcc"), default=None,
                   help="for a Linux cross target: zig (the default where present) or Debian's cross gcc ("
                        + ", ".join(v[0] for v in native.GCC_CROSS.values()) + ")")
    b.add_argument("--ndk", default=None, help="the Android NDK's directory (--target android-arm64)")
    b.add_argument("--build-dir", default=None, help="where (default: build/native in a source checkout this user "
                                                      "can write, else ~/.cache/tuner/native/VERSION-HASH)")
    sub.add_parser("env", help="print the OpenCL environment a native program needs here")
    args = p.parse_args(argv)
    try:
        if args.cmd == "build":
            for key, path in native.build(args.target, args.build_dir, ndk=args.ndk, compiler=args.compiler).items():
                print(f"{'agent' if key in native.AGENTS else 'runtime'} {path}")
        else:
            env = native.opencl_env({})
            for k in ("TUNER_OPENCL_LIB", "OCL_ICD_VENDORS", "PYOPENCL_HOME"):
                if k in env:
                    print(f"{k}={env[k]}")
    except TunerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(native_main())
