"""Check 11 reads a kernel source as the OpenCL compiler (clang) does, or refuses it (issue #54, held-out round,
finding F1): sources the red team edited so that the bounds analysis read them otherwise than clang -- a line
ended by a lone carriage return, a comment continued by a backslash, digraphs and trigraphs, a helper the source
redefines, float literals read as doubles, unsigned arithmetic read as signed, mul24 past 24 bits -- and that
then wrote outside their buffers. Both analyses (tuner/artifact/bounds.py, native/src/bounds.c) must refuse each
one, with the same reason at the same line, and still read the code generator's own sources."""
from __future__ import annotations

import ctypes
import shutil

import pytest

from test_hostile_round3 import _c_bounds, _py_bounds

pytestmark = pytest.mark.skipif(shutil.which("make") is None or shutil.which("gcc") is None,
                                reason="the native runtime is built with make and gcc")

# the red team's output unpack kernel (Y holds 512 floats at global size 128)
_BASE = """__kernel __attribute__((reqd_work_group_size(64, 1, 1)))
void relayout(
    __global const float* restrict X,
    __global float* restrict Y) {
  const int g = get_group_id(0);
  const int l = get_local_id(0);
  const int p = g * 64 + l;
  const int i1 = p / 64;
  const int i2 = p / 8 % 8;
  const int i3 = p % 8;
  const float4 x = vload4(i1 * 64 + i2 * 8 + i3, X);
  Y[i1 * 256 + i2 * 8 + i3] = x.x;
BODY
}"""
_FLOORMOD = "inline int floormod_i(int a, int b) { int r = a % b; return r < 0 ? r + b : r; }\n"
_LAUNCH = ((128, 1, 1), (64, 1, 1))


def _k(body: str, pre: str = "") -> str:
    return pre + _BASE.replace("BODY", body)


# each source, and the reason both analyses must give (at that line)
MUST_REFUSE = {
    # lexing: clang ends a line at a lone CR, splices a line ending in a backslash, reads ??= and %: as '#'
    "cr_ends_comment": (_k("  // note\r  Y[p + 4096] = 7.0f;"), 13, "a carriage return not followed by a line feed"),
    "cr_ends_pragma": (_k("#pragma OPENCL EXTENSION cl_khr_fp16 : enable\r  Y[p + 4096] = 7.0f;"), 13,
                       "a carriage return not followed by a line feed"),
    "cr_in_code": (_k("  Y[p\r + 4096] = 7.0f;"), 13, "a carriage return not followed by a line feed"),
    "backslash_hides_guard": (_k("  const int q = p + 4096;\n  // keep in range \\\n  if (q < 512)\n  Y[q] = 7.0f;"),
                              14, "a backslash at the end of a line"),
    "backslash_space_newline": (_k("  // keep in range \\  \n  if (p < 2) Y[p] = 7.0f;"), 13,
                                "a backslash at the end of a line"),
    "backslash_crlf": (_k("  // keep in range \\\r\n  if (p < 2) Y[p] = 7.0f;"), 13,
                       "a backslash at the end of a line"),
    "backslash_at_the_end": (_k("") + "\n// \\", 15, "a backslash at the end of a line"),
    "digraph_define": (_k("  HIDDEN;", "%:define HIDDEN Y[p + 4096] = 7.0f\n;\n"), 1, "the digraph '%:'"),
    "digraph_brackets": (_k("  Y<:p:> = 7.0f;"), 13, "the digraph '<:'"),
    "digraph_braces": (_k("  if (p < 2) <% Y[p] = 7.0f; %>"), 13, "the digraph '<%'"),
    "trigraph_define": (_k("  HIDDEN;", "??=define HIDDEN Y[p + 4096] = 7.0f\n;\n"), 1, "the trigraph sequence '??'"),
    "trigraph_splice": (_k("  // keep in range ??/\n  if (p < 2)\n  Y[p + 4096] = 7.0f;"), 13,
                        "the trigraph sequence '??'"),
    "comment_in_pragma": (_k("#pragma unroll /*\n  if (p < 512 */**/ 1)\n  Y[p + 4096] = 7.0f;"), 13,
                          "a comment in a preprocessor directive"),
    # helpers: only the code generator's own, byte for byte
    "helper_redefined": (_k("  Y[floormod_i(p, 512)] = 7.0f;", "inline int floormod_i(int a, int b) { return a + 4096; }\n"),
                         1, "a file-scope definition naming 'floormod_i' that is not the compiler's own helper"),
    "floordiv_redefined": (_k("  Y[floordiv_i(p, 1)] = 7.0f;",
                              "inline int floordiv_i(int a, int b) { int q = a / b; return (q * b > a) ? q - 1 : q + 4096; }\n"),
                           1, "a file-scope definition naming 'floordiv_i' that is not the compiler's own helper"),
    "helper_declared_first": (_k("  Y[floormod_i(p, 512)] = 7.0f;", "int floormod_i(int a, int b);\n" + _FLOORMOD), 1,
                              "a file-scope definition naming 'floormod_i' that is not the compiler's own helper"),
    "builtin_redefined": (_k("  Y[min(p, 511)] = 7.0f;", "inline int min(int a, int b) { return a + b; }\n"), 1,
                          "a file-scope definition naming 'min' that is not the compiler's own helper"),
    "mul24_redefined": (_k("  Y[mul24(p, 1)] = 7.0f;", "inline int mul24(int a, int b) { return a * b + 4096; }\n"), 1,
                        "a file-scope definition naming 'mul24' that is not the compiler's own helper"),
    "a_sampler_named_min": (_k("  Y[min(p, 511)] = 7.0f;", "__constant sampler_t min = CLK_ADDRESS_CLAMP;\n"), 1,
                            "a file-scope definition naming 'min' that is not the compiler's own helper"),
    "a_kernel_named_clamp": ("__kernel void clamp(__global float* restrict Y) { Y[0] = 1.0f; }", 1,
                             "a kernel named 'clamp'"),
    # unsigned arithmetic: known only while it is proven non-negative
    "unsigned_wrap": (_k("  Y[p + (0u - 1u) / 2097152u] = 7.0f;"), 13, "cannot bound the index of parameter 'Y'"),
    "unsigned_literal_neg": (_k("  Y[p + -1u / 2097152u] = 7.0f;"), 13, "cannot bound the index of parameter 'Y'"),
    "unsigned_cast": (_k("  Y[((uint)p - 1) / 2097152] = 7.0f;"), 13, "cannot bound the index of parameter 'Y'"),
    "unsigned_variable": (_k("  const uint q = p;\n  Y[(q - 1) / 2097152] = 7.0f;"), 14,
                          "cannot bound the index of parameter 'Y'"),
    "size_t_wraps": (_k("  Y[(get_global_id(0) - 1) / 2097152] = 7.0f;"), 13, "cannot bound the index of parameter 'Y'"),
    "abs_is_unsigned": (_k("  Y[(abs(p) - 1) / 2097152] = 7.0f;"), 13, "cannot bound the index of parameter 'Y'"),
    "unsigned_divisor": (_k("  Y[(p + 600) % (p - 1u)] = 7.0f;"), 13, "cannot bound the index of parameter 'Y'"),
    "max_of_unsigned": (_k("  Y[max(p, 0u - 1u) >> 23] = 7.0f;"), 13, "cannot bound the index of parameter 'Y'"),
    "min_of_negative_unsigned": (_k("  Y[min(p - 1, 5u) % 8 + 504] = 7.0f;"), 13,
                                 "cannot bound the index of parameter 'Y'"),
    "min_of_an_unknown_long": (_k("  Y[(min(p, (long)X[1]) >> 31) + 1] = 7.0f;"), 13,
                               "cannot bound the index of parameter 'Y'"),
    # clamp(x, lo, hi) with lo > hi is undefined (Intel computes min(max(x, lo), hi), another max(min(x, hi), lo))
    "clamp_inverted": (_k("  Y[clamp(p, 4096, 0)] = 7.0f;"), 13, "cannot bound the index of parameter 'Y'"),
    # mul24 / mad24: a product only of 24-bit operands
    "mul24_wide": (_k("  Y[mul24(p + 16777216, 1) - 16777216] = 7.0f;"), 13, "cannot bound the index of parameter 'Y'"),
    "mad24_wide": (_k("  Y[mad24(p + 16777216, 1, -16777216)] = 7.0f;"), 13, "cannot bound the index of parameter 'Y'"),
}

# sources both analyses read, and (at most its first, at least its last) element of Y they must find addressed: what
# the device addresses, past Y's 512 floats (check 11 then refuses the call)
MUST_SEE = {
    # (int)1073741889.0f is 1073741952 in float32: Y[574], not Y[511]
    "float_literal_rounding": (_k("  Y[(int)1073741889.0f - 1073741889 + 511 - p % 2] = 7.0f;"), 0, 574),
    # 2051.0h is 2052 in half: Y[512], not Y[511]
    "half_literal_rounding": (_k("  Y[(int)2051.0h - 1540] = 7.0f;"), 0, 512),
    # an unsigned comparison: p - 1 < 5u is false for p = 0, whose Y[p - 1] is Y[-1]
    "unsigned_compare": (_k("  if (p - 1 < 5u) { } else { Y[p - 1] = 7.0f; }"), -1, 126),
    # a guard whose product wraps in int32 (p = 64: p * 2^25 is -2^31) narrows nothing
    "signed_wrap_guard": (_k("  if (p * 33554432 < 33554432) { Y[p * 4 + 100] = 7.0f; }"), 0, 4 * 64 + 100),
    # get_global_id(0) < -1 compares with SIZE_MAX: always true
    "size_t_compare": (_k("  if (get_global_id(0) < -1) { Y[p + 4096] = 7.0f; }"), 0, 4096 + 127),
}

# sources both analyses still read, and the range they must find for Y (the second parameter)
MUST_READ = {
    "the_helper_verbatim": (_k("  Y[floormod_i(p - 7, 400)] = 7.0f;", _FLOORMOD), (0, 399)),
    "both_helpers_verbatim": (_k("  Y[floormod_i(p - 7, 400) + floordiv_i(p - 7, 2)] = 7.0f;",
                                 "inline int floordiv_i(int a, int b) { int q = a / b; return (q * b > a) ? q - 1 : q; }\n"
                                 + _FLOORMOD), (-4, 459)),
    "crlf_lines": (_k("  // note\n  Y[p + 200] = 7.0f;").replace("\n", "\r\n"), (0, 327)),
    "digraph_and_question_marks_in_a_comment": (_k("  /* Y<:p:> ? */ Y[p + 200] = 7.0f;"), (0, 327)),
    "float_literals": (_k("  Y[(int)1073741824.0f - 1073741824 + (int)fmax(0.5f, 0.25) + (int)1.0h + 330] = 7.0f;"),
                       (0, 331)),
    # get_global_id is a size_t: proven non-negative, it is read (and narrowed) as before
    "an_unsigned_position": (_k("  if (get_global_id(0) < 100) { Y[get_global_id(0) * 4 + 1u] = 7.0f; }"), (0, 397)),
    "unsigned_non_negative": (_k("  Y[((uint)p + 1u) * 3u] = 7.0f;"), (0, 384)),
    "mul24_small": (_k("  Y[mul24(p, 2) + mad24(p, 1, 3)] = 7.0f;"), (0, 384)),
}


def _both(lib, text: str):
    return _py_bounds(text, "relayout", *_LAUNCH), _c_bounds(lib, text, "relayout", *_LAUNCH)


def test_helpers_are_the_code_generators_own():
    from tuner.artifact import bounds
    from tuner.codegen.opencl import _HELPERS
    assert bounds.HELPERS == tuple(_HELPERS[k] for k in sorted(_HELPERS))


@pytest.mark.parametrize("case", sorted(MUST_REFUSE))
def test_a_source_clang_reads_otherwise_is_refused_by_both(case, native):
    lib = ctypes.CDLL(str(native["library"]))
    text, line, what = MUST_REFUSE[case]
    py, c = _both(lib, text)
    assert py == ("error", line, what), py
    assert c == py, c


@pytest.mark.parametrize("case", sorted(MUST_READ))
def test_what_the_compiler_writes_is_still_read(case, native):
    lib = ctypes.CDLL(str(native["library"]))
    text, want = MUST_READ[case]
    py, c = _both(lib, text)
    assert py[0] == "ok", py
    assert c == py, c
    assert py[1][1][0] == want, py[1][1]


@pytest.mark.parametrize("case", sorted(MUST_SEE))
def test_what_the_device_addresses_is_seen(case, native):
    lib = ctypes.CDLL(str(native["library"]))
    text, first, last = MUST_SEE[case]
    py, c = _both(lib, text)
    assert py[0] == "ok", py
    assert c == py, c
    lo, hi = py[1][1][0]
    assert lo <= first and hi >= last, (lo, hi)
