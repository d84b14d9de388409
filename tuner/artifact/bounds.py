"""What a kernel addresses, read from its source (docs/artifact.md, check 11): the element range each buffer
parameter's code reads and writes, and the pixels each image it writes (or reads without a clamping sampler)
touches, for one launch. A runtime compares them with the arguments a call binds, so a tensor, pool or weight
blob shrunk in graph.json (with its declared ``extent``), or a launch grown past what the kernel was generated
for, is refused before anything is allocated: the sizes come from the code that runs, not from what graph.json
says beside it.

The analysis is interval arithmetic over the OpenCL C that ``tuner.codegen.opencl`` generates: ``const`` lets,
``for (int v = A; v < B; ++v)`` loops, ``if`` and ``?:`` (a condition narrows, in its branch, the expressions
it tests and the variables they are linear in), ``min``/``max``/``clamp`` (``fmin``/``fmax`` of floats),
integer ``+ - * / %`` and shifts, casts; ``get_group_id``, ``get_local_id`` and ``get_global_id`` range over
the launch. Integer values are int32 (a result that may wrap is unknown); a value of an unsigned type (a ``u``
literal, ``uint``, ``size_t``, ``get_global_id``) is known only while it is proven non-negative, a float literal is
read as the float32 (half with ``h``) the compiler makes of it, and ``mul24``/``mad24`` only of 24-bit operands. The
source is read as clang reads it or refused: a lone carriage return, a backslash at the end of a line, ``??``
(trigraphs), the digraphs ``<: :> <% %> %:``, and a file-scope definition naming a function the analysis models
(``floordiv_i``, ``min`` ...) other than the compiler's own helper are refused. An index it cannot bound (a value
read from memory, a variable assigned twice, a parameter passed on to a function, a preprocessor macro)
refuses the artifact: such a source is not one the compiler writes. native/src/bounds.c is the same analysis,
rule for rule, and both runtimes run it on the same sources (tests/test_hostile_round3.py)."""
from __future__ import annotations

import math
import re
import sys
from functools import lru_cache

from .format import ArtifactError

I32MIN, I32MAX = -(1 << 31), (1 << 31) - 1
BIG = 1 << 61  # linear forms give up past this (both runtimes compute them in int64)
MAX_DEPTH = 100  # nesting of parentheses, unary operators and statements
MAX_HEIGHT = 1000  # a kernel's syntax tree, statements and expressions (a + b + c ...: as deep as it is long)
MAX_TOKENS = 4_000_000

_TOKEN = re.compile(r"""
    (?P<dir>^[ \t]*\#[ \t]*(?P<dname>[A-Za-z]*)[^\n]*)
  | (?P<nl>\n)
  | [ \t\r\f\v]+
  | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<id>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<num>(?:0[xX][0-9A-Fa-f]+|[0-9]+\.?[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)[A-Za-z]*)
  | (?P<digraph><:|:>|<%|%>|%:)
  | (?P<op><<=|>>=|\+\+|--|&&|\|\||<=|>=|==|!=|<<|>>|\+=|-=|\*=|/=|%=|&=|\|=|\^=|->|[-+*/%<>=!&|^~?:;,.()\[\]{}])
  | (?P<bad>.)
""", re.X | re.S | re.M)
_LEXICAL = re.compile(r"\r(?!\n)|\\[ \t\f\v]*(?:\r|\n|\Z)|\?\?")
_INT_LITERAL = re.compile(r"^(0[xX][0-9A-Fa-f]+|[0-9]+)[uUlL]*$")
_FLOAT_LITERAL = re.compile(r"^([0-9]+\.?[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)[fFhH]?$")

# integer types: the values a variable of the type holds (int32 at most: a wider value is unknown)
_INT_TYPES = {"char": (-128, 127), "uchar": (0, 255), "short": (-32768, 32767), "ushort": (0, 65535),
              "int": (I32MIN, I32MAX), "bool": (0, 1), "uint": None, "long": None, "ulong": None, "size_t": None,
              "ptrdiff_t": None, "intptr_t": None, "uintptr_t": None}
_UNSIGNED = {"uchar", "ushort", "uint", "ulong", "size_t", "uintptr_t", "bool"}
# the integer types an expression can have, as the analysis tells them apart: "i" a signed int (or a narrower type,
# promoted to int), "u" an unsigned type of 32 bits or more, "x" anything else (long, float, vectors, unknown)
_I_TYPES = {"char", "uchar", "short", "ushort", "int", "bool"}
_U_TYPES = {"uint", "ulong", "size_t", "uintptr_t"}
_FLOAT_TYPES = {"float", "double", "half"}
_VECTOR = re.compile(r"^(?:u?(?:char|short|int|long)|float|half|double)(?:2|3|4|8|16)$")
_OTHER_TYPES = {"void", "sampler_t", "image2d_t", "image1d_t", "image3d_t", "image2d_array_t", "image1d_buffer_t",
                "image1d_array_t", "event_t"}
_QUALIFIERS = {"const", "volatile", "restrict", "__local", "local", "__private", "private", "__global", "global",
               "__constant", "constant", "__read_only", "read_only", "__write_only", "write_only",
               "__read_write", "read_write", "unsigned", "signed"}
_ELEM_BYTES = {"char": 1, "uchar": 1, "short": 2, "ushort": 2, "int": 4, "uint": 4, "long": 8, "ulong": 8,
               "float": 4, "half": 2, "double": 8}
_VLOAD = re.compile(r"^(vload|vstore)(2|3|4|8|16)$")
_VHALF = re.compile(r"^(vloada?_half|vstorea?_half)(2|3|4|8|16)?(_rte|_rtz|_rtp|_rtn)?$")
_IMAGE_READ = {"read_imagef", "read_imageh", "read_imagei", "read_imageui"}
_IMAGE_WRITE = {"write_imagef", "write_imageh", "write_imagei", "write_imageui"}
_IDS = {"get_global_id", "get_local_id", "get_group_id", "get_global_size", "get_local_size", "get_num_groups",
        "get_global_offset"}
_PURE = _IDS | {"min", "max", "clamp", "abs", "mul24", "mad24", "floordiv_i", "floormod_i", "fmin", "fmax",
                "floor", "ceil", "trunc"}
# the helpers tuner.codegen.opencl emits, byte for byte (tests/test_bounds_lexing.py compares them): a file-scope
# definition naming a function the analysis models is refused unless it is one of these
HELPERS = (
    "inline int floordiv_i(int a, int b) { int q = a / b; return (q * b > a) ? q - 1 : q; }",
    "inline int floormod_i(int a, int b) { int r = a % b; return r < 0 ? r + b : r; }",
)
_CMP = {"<", "<=", ">", ">=", "==", "!=", "&&", "||"}
_CLAMPING = {"CLK_ADDRESS_CLAMP", "CLK_ADDRESS_CLAMP_TO_EDGE"}
_WRAPPING = {"CLK_ADDRESS_REPEAT", "CLK_ADDRESS_MIRRORED_REPEAT", "CLK_ADDRESS_NONE"}
_ASSIGN = {"=", "+=", "-=", "*=", "/=", "%=", "<<=", ">>=", "&=", "|=", "^="}
_PREC = {"||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6, "<": 7, "<=": 7, ">": 7, ">=": 7,
         "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "%": 10}
_FLIP = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


class BoundsError(Exception):
    """The analysis cannot follow the source: ``line`` and what it met there."""

    def __init__(self, line: int, what: str):
        super().__init__(what)
        self.line, self.what = line, what


# -- values: an int interval (lo, hi) within int32, a float interval ("f", lo, hi), or None (unknown) -----------
def _int(lo: int, hi: int):
    return (lo, hi) if I32MIN <= lo and hi <= I32MAX else None


def _is_int(v) -> bool:
    return v is not None and len(v) == 2


def _tdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _bin(op: str, a, b):
    if op in ("<", "<=", ">", ">=", "==", "!=", "&&", "||"):
        return (0, 1)
    if not (_is_int(a) and _is_int(b)):
        return None
    (al, ah), (bl, bh) = a, b
    if op == "+":
        return _int(al + bl, ah + bh)
    if op == "-":
        return _int(al - bh, ah - bl)
    if op == "*":
        c = (al * bl, al * bh, ah * bl, ah * bh)
        return _int(min(c), max(c))
    if op == "/":
        if bl <= 0 <= bh:
            return None
        c = (_tdiv(al, bl), _tdiv(al, bh), _tdiv(ah, bl), _tdiv(ah, bh))
        return _int(min(c), max(c))
    if op == "%":
        if bl <= 0 <= bh:
            return None
        small, m = min(abs(bl), abs(bh)), max(abs(bl), abs(bh))
        if al >= 0:
            if ah < small:
                return (al, ah)
            if bl == bh and al // m == ah // m:
                return (al % m, ah % m)
            return (0, min(ah, m - 1))
        if ah <= 0:
            return (max(al, 1 - m), 0)
        return (max(al, 1 - m), min(ah, m - 1))
    if op in ("<<", ">>"):
        if bl != bh or not 0 <= bl <= 31:
            return None
        return _int(al << bl, ah << bl) if op == "<<" else (al >> bl, ah >> bl)
    if op == "&":
        if al >= 0 and bl >= 0:
            return (0, min(ah, bh))
        if bl == bh and bl >= 0:
            return (0, bl)
        if al == ah and al >= 0:
            return (0, al)
        return None
    if op in ("|", "^"):
        if al >= 0 and bl >= 0:
            return (0, (1 << max(ah, bh).bit_length()) - 1)
        return None
    return None


def _union(a, b):
    if a is None or b is None or len(a) != len(b):
        return None
    if len(a) == 2:
        return (min(a[0], b[0]), max(a[1], b[1]))
    return ("f", min(a[1], b[1]), max(a[2], b[2]))


def _meet(iv, lo: int, hi: int):
    """An int interval narrowed to [lo, hi] (a point where they do not meet: that code never runs)."""
    if not _is_int(iv):
        return (lo, hi)
    lo2 = max(lo, iv[0])
    return (lo2, max(lo2, min(hi, iv[1])))


def _cast(v, base: str):
    """A value converted to scalar type ``base`` as C converts it."""
    if base in _INT_TYPES:
        rng = _INT_TYPES[base]
        if base == "bool":
            return (0, 1)
        if v is not None and len(v) == 3:  # float to integer: truncated; out of range or NaN: any value
            lo, hi = v[1], v[2]
            v = (math.trunc(lo), math.trunc(hi)) if math.isfinite(lo) and math.isfinite(hi) \
                and I32MIN <= math.trunc(lo) and math.trunc(hi) <= I32MAX else None
        if _is_int(v):
            if rng is not None:
                return v if rng[0] <= v[0] and v[1] <= rng[1] else rng
            return v if base not in _UNSIGNED or v[0] >= 0 else None
        return rng
    if base in _FLOAT_TYPES:
        if _is_int(v):
            v = ("f", float(v[0]), float(v[1])) if -(1 << 24) <= v[0] and v[1] <= 1 << 24 else None
        if v is not None and base == "half":
            ok = all(math.isfinite(x) and x == int(x) and abs(x) <= 2048 for x in v[1:])
            return v if ok else None
        return v
    return None


def _class(base: str) -> str:
    return "i" if base in _I_TYPES else "u" if base in _U_TYPES else "x"


def _combine(x: str, y: str) -> str:
    """The type of an arithmetic result of operands of types ``x`` and ``y`` (C's usual conversions)."""
    if x == y or {x, y} == {"i", "u"}:
        return "u" if "u" in (x, y) else x
    return "x"


def _in24(v) -> bool:
    return _is_int(v) and -(1 << 23) <= v[0] and v[1] <= (1 << 23) - 1


def _float_literal(t: str):
    """The values a float literal can have on the device: float32 (half with an ``h`` suffix) rounds it, an
    unsuffixed one may be a double or a float, a subnormal may be flushed to 0. None: past the type's range."""
    half = t[-1] in "hH"
    v = float(t.rstrip("fFhH"))
    bits, tiny, top = (11, 2.0 ** -14, 65504.0) if half else (24, 2.0 ** -126, 3.4028234663852886e38)
    if v == 0:
        return ("f", 0.0, 0.0)
    if not v <= top:
        return None
    if v < tiny:
        return ("f", 0.0, tiny)
    m, ex = math.frexp(v)
    if math.ldexp(m, bits).is_integer():
        return ("f", v, v)
    ulp = math.ldexp(1.0, ex - bits)
    return ("f", v - ulp, v + ulp)


def _float_of(v):
    """A float interval of an argument of fmin/fmax (unknown: every float)."""
    if v is not None and len(v) == 3:
        return v
    return ("f", -math.inf, math.inf)


# -- tokens -------------------------------------------------------------------------------------------------
def _tokens(source: str):
    """(kinds, texts, lines): a ``#pragma`` line (a directive is one at the start of a line) skipped, any other
    preprocessor directive refused. The list ends with 8 ("end", "") tokens."""
    bad = _LEXICAL.search(source)
    if bad is not None:
        at, what = source.count("\n", 0, bad.start()) + 1, bad.group()
        if what == "\r":
            raise BoundsError(at, "a carriage return not followed by a line feed")
        if what.startswith("\\"):
            raise BoundsError(at, "a backslash at the end of a line")
        raise BoundsError(at, "the trigraph sequence '??'")
    kinds, texts, lines = [], [], []
    line = 1
    for m in _TOKEN.finditer(source):
        kind = m.lastgroup
        if kind is None:
            continue
        if kind == "nl":
            line += 1
            continue
        if kind == "comment":
            line += m.group().count("\n")
            continue
        if kind == "dir":
            if m.group("dname") != "pragma" or m.group().endswith("\\"):
                raise BoundsError(line, f"the preprocessor directive #{m.group('dname')}")
            if "/*" in m.group():
                raise BoundsError(line, "a comment in a preprocessor directive")
            continue
        if kind == "dname":
            continue
        if kind == "bad":
            raise BoundsError(line, f"the character {m.group()!r}")
        if kind == "digraph":
            raise BoundsError(line, f"the digraph '{m.group()}'")
        kinds.append(kind)
        texts.append(m.group())
        lines.append(line)
    if len(kinds) > MAX_TOKENS:
        raise BoundsError(line, "more than 4,000,000 tokens")
    kinds.extend(["end"] * 8)
    texts.extend([""] * 8)
    lines.extend([line] * 8)
    return kinds, texts, lines


def _modelled(name: str) -> bool:
    """Whether the analysis gives ``name`` a meaning of its own (a function it models)."""
    return name in _PURE or name in _IMAGE_READ or name in _IMAGE_WRITE or _VLOAD.match(name) is not None \
        or _VHALF.match(name) is not None


@lru_cache(maxsize=1)
def _helper_tokens() -> tuple:
    out = []
    for h in HELPERS:
        kinds, texts, _ = _tokens(h)
        out.append(tuple(zip(kinds[:-8], texts[:-8])))
    return tuple(out)


def _int_literal(t: str):
    """The value of an integer literal token (decimal without a leading zero, or hex; a u/l suffix), at most 12
    characters; else None."""
    if not _INT_LITERAL.match(t):
        return None
    digits = t.rstrip("uUlL")
    if len(digits) > 12 or (len(digits) > 1 and digits[0] == "0" and digits[1] not in "xX"):
        return None
    return int(digits, 0)


def _type_word(text: str) -> bool:
    return text in _INT_TYPES or text in _FLOAT_TYPES or text in _OTHER_TYPES or text in _QUALIFIERS \
        or _VECTOR.match(text) is not None


class _Parser:
    """Recursive descent into tuples. Expressions: ("int", v) ("flt", v) ("var", name, line) ("bin", op, a, b)
    ("un", op, a) ("tern", c, a, b) ("call", name, args, line) ("idx", base, index, line) ("mem", base)
    ("cast", type, a) ("vec", type, items) ("asg", op, lhs, rhs, line) ("inc", a, line, "++" or "--"). Statements:
    ("block", items) ("decl", type, scalar, name, init, line, const) ("for", init, var, cond, step, body)
    ("if", cond, then, otherwise) ("expr", e) ("nop",)."""

    def __init__(self, toks, pos: int):
        self.kinds, self.texts, self.lines = toks
        self.p = pos
        self.depth = 0

    # (the token lists end with 8 "end" tokens, and nothing takes one: p + k stays inside for k < 8)
    def text(self, k: int = 0) -> str:
        return self.texts[self.p + k]

    def kind(self, k: int = 0) -> str:
        return self.kinds[self.p + k]

    def line(self) -> int:
        return self.lines[self.p]

    def take(self, want: str | None = None) -> str:
        p = self.p
        t = self.texts[p]
        if self.kinds[p] == "end":
            raise BoundsError(self.lines[p], "the source ends inside a kernel")
        if want is not None and t != want:
            raise BoundsError(self.lines[p], f"{want!r} expected, found {t!r}")
        self.p = p + 1
        return t

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise BoundsError(self.line(), f"nesting deeper than {MAX_DEPTH}")

    def type_ahead(self, k: int = 0) -> bool:
        return self.kind(k) == "id" and _type_word(self.text(k))

    def parse_type(self):
        """(base type, pointer depth, words) of qualifiers and a type name ('unsigned int' is uint)."""
        line, words = self.line(), []
        while self.type_ahead():
            words.append(self.take())
        stars = 0
        while self.text() == "*":
            self.take()
            stars += 1
            while self.text() in ("const", "restrict", "volatile"):
                self.take()
        base = [w for w in words if w not in _QUALIFIERS]
        if len(words) > 32:
            base = []
        elif "unsigned" in words:
            kind = base[0] if base else "int"
            base = [{"char": "uchar", "short": "ushort", "int": "uint", "long": "ulong"}.get(kind, "?" + kind)] \
                if len(base) <= 1 else []
        elif "signed" in words and not base:
            base = ["int"]
        if len(base) != 1 or base[0].startswith("?"):
            raise BoundsError(line, f"the type {' '.join(words) or self.text()!r}")
        return base[0], stars, words

    # expressions
    def expr(self):
        e = self.assign()
        if self.text() == ",":
            raise BoundsError(self.line(), "the comma operator")
        return e

    def assign(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise BoundsError(self.line(), f"nesting deeper than {MAX_DEPTH}")
        line = self.lines[self.p]
        e = self.ternary()
        if self.kinds[self.p] == "op" and self.texts[self.p] in _ASSIGN:
            op = self.take()
            e = ("asg", op, e, self.assign(), line)
        self.depth -= 1
        return e

    def ternary(self):
        c = self.binary(1)
        if self.texts[self.p] != "?":
            return c
        self.take("?")
        a = self.assign()
        self.take(":")
        return ("tern", c, a, self.assign())

    def binary(self, min_prec: int):
        a = self.unary()
        kinds, texts = self.kinds, self.texts
        while kinds[self.p] == "op":
            op = texts[self.p]
            prec = _PREC.get(op)
            if prec is None or prec < min_prec:
                break
            self.p += 1
            a = ("bin", op, a, self.binary(prec + 1))
        return a

    def unary(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise BoundsError(self.line(), f"nesting deeper than {MAX_DEPTH}")
        p = self.p
        t, line, is_op = self.texts[p], self.lines[p], self.kinds[p] == "op"
        if is_op and t in ("-", "+", "!", "~"):
            self.p = p + 1
            e = ("un", t, self.unary())
        elif is_op and t in ("++", "--"):
            self.p = p + 1
            e = ("inc", self.unary(), line, t)
        elif is_op and t in ("*", "&"):
            raise BoundsError(line, f"the pointer operator {t!r}")
        elif t == "sizeof":
            raise BoundsError(line, "sizeof")
        elif t == "(" and self.type_ahead(1):
            self.take("(")
            base, stars, _ = self.parse_type()
            self.take(")")
            if stars:
                raise BoundsError(line, "a cast to a pointer")
            if self.text() == "(" and not (base in _INT_TYPES or base in _FLOAT_TYPES):
                self.take("(")  # a vector literal (float4)(a, b, c, d)
                items = [self.assign()]
                while self.text() == ",":
                    self.take(",")
                    items.append(self.assign())
                self.take(")")
                e = ("vec", base, tuple(items))
            else:
                e = ("cast", base, self.unary())
        else:
            e = self.postfix()
        self.depth -= 1
        return e

    def postfix(self):
        p = self.p
        kind, line = self.kinds[p], self.lines[p]
        t = self.take()
        if kind == "num":
            if _INT_LITERAL.match(t):
                digits = t.rstrip("uUlL")
                if len(digits) > 1 and digits[0] == "0" and digits[1] not in "xX":
                    raise BoundsError(line, f"the octal number {t!r}")
                v = _int_literal(t)
                if v is None or v > 1 << 31:
                    raise BoundsError(line, f"the integer {t!r}, out of the int range")
                e = ("int", v)
                suffix = t[len(digits):].lower()
                if suffix:  # 1u is (uint)1, 1l (long)1, 1ul (ulong)1
                    e = ("cast", "ulong" if "u" in suffix and "l" in suffix else "uint" if "u" in suffix else "long", e)
            elif _FLOAT_LITERAL.match(t):
                e = ("flt", _float_literal(t))
            else:
                raise BoundsError(line, f"the number {t!r}")
        elif kind == "id":
            if self.texts[self.p] == "(":
                self.p += 1
                args = []
                if self.texts[self.p] != ")":
                    args.append(self.assign())
                    while self.texts[self.p] == ",":
                        self.p += 1
                        args.append(self.assign())
                self.take(")")
                e = ("call", t, tuple(args), line)
            else:
                e = ("var", t, line)
        elif t == "(":
            e = self.expr()
            self.take(")")
        else:
            raise BoundsError(line, f"{t!r} where an expression belongs")
        texts = self.texts
        while True:
            t = texts[self.p]
            if t == "[":
                line = self.line()
                self.take("[")
                i = self.expr()
                self.take("]")
                e = ("idx", e, i, line)
            elif t == ".":
                self.take(".")
                if self.kind() != "id":
                    raise BoundsError(self.line(), "a member name expected after '.'")
                self.take()
                e = ("mem", e)
            elif t in ("++", "--") and self.kinds[self.p] == "op":
                e = ("inc", e, self.line(), t)
                self.take()
            elif t == "->" and self.kinds[self.p] == "op":
                raise BoundsError(self.line(), "the operator '->'")
            else:
                return e

    # statements
    def statement(self):
        self.enter()
        t, kind, line = self.text(), self.kind(), self.line()
        if t == "{":
            self.take("{")
            items = []
            while self.text() != "}":
                items.append(self.statement())
            self.take("}")
            s = ("block", tuple(items))
        elif t == ";":
            self.take(";")
            s = ("nop",)
        elif kind == "id" and t == "if":
            self.take()
            self.take("(")
            c = self.expr()
            self.take(")")
            then = self.statement()
            other = None
            if self.text() == "else":
                self.take()
                other = self.statement()
            s = ("if", c, then, other)
        elif kind == "id" and t == "for":
            s = self.for_loop()
        elif kind == "id" and t in ("return", "break", "continue"):
            self.take()
            if self.text() != ";":
                raise BoundsError(line, f"{t} with a value")
            self.take(";")
            s = ("nop",)
        elif kind == "id" and t in ("while", "do", "switch", "goto", "case", "default", "typedef", "struct",
                                    "union", "enum", "__attribute__", "asm", "else"):
            raise BoundsError(line, f"the statement {t!r}")
        elif self.type_ahead():
            s = self.declaration()
            self.take(";")
        else:
            s = ("expr", self.expr())
            self.take(";")
        self.depth -= 1
        return s

    def declaration(self):
        line = self.line()
        base, stars, words = self.parse_type()
        if stars:
            raise BoundsError(line, "a pointer variable")
        if self.kind() != "id" or _type_word(self.text()):
            raise BoundsError(self.line(), "a variable name expected")
        name = self.take()
        array = False
        while self.text() == "[":
            self.take("[")
            self.expr()
            self.take("]")
            array = True
        init = None
        if self.text() == "=":
            self.take("=")
            if self.text() == "{":
                raise BoundsError(self.line(), "an initializer list")
            init = self.assign()
        if self.text() == ",":
            raise BoundsError(self.line(), "several variables in one declaration")
        scalar = not array and (base in _INT_TYPES or base in _FLOAT_TYPES)
        return ("decl", base, scalar, name, init, line, "const" in words)

    def for_loop(self):
        self.take("for")
        self.take("(")
        init = None if self.text() == ";" else (self.declaration() if self.type_ahead() else ("expr", self.expr()))
        self.take(";")
        cond = None if self.text() == ";" else self.expr()
        self.take(";")
        step = None if self.text() == ")" else self.expr()
        self.take(")")
        body = self.statement()
        var = None  # the form the compiler writes: for (int v = A; v < B; ++v) (or v++, v += 1, v <= B)
        if init is not None and init[0] == "decl" and init[1] in _INT_TYPES and init[2] and init[4] is not None:
            v = init[3]
            step_ok = step is not None and ((step[0] == "inc" and step[1][:2] == ("var", v) and step[3] == "++")
                                            or (step[0] == "asg" and step[1] == "+=" and step[2][:2] == ("var", v)
                                                and step[3] == ("int", 1)))
            cond_ok = cond is not None and cond[0] == "bin" and cond[1] in ("<", "<=") and cond[2][:2] == ("var", v)
            if step_ok and cond_ok:
                var = v
        return ("for", init, var, cond, step, body)


def _assigned(node, out: set) -> None:
    """Names assigned anywhere in ``node`` (a statement, an expression, or a tuple of them), but a canonical
    loop's variable in its own step."""
    if type(node) is not tuple or not node:
        return
    k = node[0]
    if type(k) is not str:  # a tuple of statements or of call arguments
        for x in node:
            _assigned(x, out)
        return
    if k == "for":
        _, init, var, cond, step, body = node
        _assigned(init, out)
        _assigned(cond, out)
        if var is None:
            _assigned(step, out)
        _assigned(body, out)
        return
    if k == "asg" and node[2][0] == "var":
        out.add(node[2][1])
    elif k == "inc" and node[1][0] == "var":
        out.add(node[1][1])
    for x in node[1:]:
        if type(x) is tuple:
            _assigned(x, out)


def _height(body) -> int:
    """The height of a syntax tree (a node is 1 higher than its highest child), found without recursion: every
    recursive walk of the tree after this is at most that deep."""
    best, stack = 0, [(body, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        node, h = pop()
        if h > best:
            best = h
            if best > MAX_HEIGHT:
                break
        h += 1
        for x in node[1:]:
            if type(x) is tuple and x:
                if type(x[0]) is str:
                    if len(x) > 1:
                        push((x, h))
                    elif h > best:
                        best = h
                else:  # a tuple of statements or arguments: each a child of this node
                    for y in x:
                        if type(y) is tuple and y:
                            push((y, h))
    return best


# -- the analysis ---------------------------------------------------------------------------------------------
class _Entry:
    """A variable in scope: ``iv`` its value (an interval) where this point of the code is; ``tag`` (a const
    ``int`` whose value is a work-item's position): ("get_global_id" | "get_group_id" | "get_local_id", dimension),
    else None; ``ty`` the type its declaration gives it (_class)."""
    __slots__ = ("name", "iv", "tag", "ty")

    def __init__(self, name: str, iv, tag=None, ty: str = "x"):
        self.name, self.iv, self.tag, self.ty = name, iv, tag, ty


_POSITIONS = ("get_global_id", "get_group_id", "get_local_id")


def _key_tag(key):
    """The position a linear form's atom is (an _Entry's tag, or a call of get_*_id of a constant dimension, cast
    to int or not), or None."""
    if type(key) is _Entry:
        return key.tag
    if key[0] == "var":
        return key[1].tag if key[1] is not None else None
    if key[0] == "cast" and key[1] == "int":
        return _key_tag(key[2])
    if key[0] == "call" and key[1] in _POSITIONS and len(key[2]) == 1 and key[2][0][0] == "int" \
            and 0 <= key[2][0][1] <= 2:
        return key[1], key[2][0][1]
    return None


class _Analysis:
    def __init__(self, params: list, samplers: dict, glob: tuple, local: tuple, assigned: set):
        self.params = {p["name"]: i for i, p in enumerate(params)}
        self.kinds = params
        self.samplers = samplers
        self.glob, self.local = glob, local
        self.assigned = assigned
        self.scopes: list = [{}]
        self.facts: list = []  # (resolved expression, lo, hi, linear form or None)
        self.ranges: list = [None] * len(params)
        self.pixels: list = [None] * len(params)
        self.writes: list = [0] * len(params)  # at most how many elements (pixels) are written; None: unknown
        self.mult = 1  # the times the loops around this point run their body (an upper bound; None: unknown)
        self.tagged: list = []  # (entry, its scope's depth): the variables in scope that are a work-item's position
        self.depth = 0
        self.recording = True
        self.types: dict = {}  # id(node) -> ctype (a node of the source tree: one place, one scope)

    def lookup(self, name: str):
        for s in reversed(self.scopes):
            e = s.get(name)
            if e is not None:
                return e
        return None

    def ctype(self, e) -> str:
        """The type of expression ``e`` as the analysis tells types apart (_class): "i", "u" or "x"."""
        t = self.types.get(id(e))
        if t is None:
            t = self.types[id(e)] = self._ctype(e)
        return t

    def _ctype(self, e) -> str:
        k = e[0]
        if k == "int":
            return "i" if e[1] <= I32MAX else "x"
        if k == "var":
            ent = self.lookup(e[1])
            return ent.ty if ent is not None else "x"
        if k == "bin":
            if e[1] in _CMP:
                return "i"
            if e[1] in ("<<", ">>"):
                return self.ctype(e[2])
            return _combine(self.ctype(e[2]), self.ctype(e[3]))
        if k == "un":
            return "i" if e[1] == "!" else self.ctype(e[2])
        if k == "tern":
            return _combine(self.ctype(e[2]), self.ctype(e[3]))
        if k == "cast":
            return _class(e[1])
        if k == "call":
            name, args = e[1], e[2]
            if name in _IDS or name == "abs":
                return "u"
            if name in ("floordiv_i", "floormod_i"):
                return "i"
            if name in ("min", "max", "clamp", "mul24", "mad24") and args:
                t = self.ctype(args[0])
                for a in args[1:]:
                    t = _combine(t, self.ctype(a))
                return t
            return "x"
        if k == "idx" and e[1][0] == "var":
            name = e[1][1]
            if name in self.params:
                p = self.kinds[self.params[name]]
                return _class(p["type"]) if p["kind"] == "buffer" else "x"
            ent = self.lookup(name)
            return ent.ty if ent is not None else "x"
        return "x"

    def signed(self, e, v):
        """``v``, the value of ``e``, or None where ``e`` is unsigned and ``v`` may be negative (it wraps)."""
        if v is not None and len(v) == 2 and v[0] < 0 and self.ctype(e) == "u":
            return None
        return v

    # purity, resolution and linear forms (for facts)
    def pure(self, e) -> bool:
        """Whether ``e`` has one value wherever it is seen in a branch: constants, variables never assigned, and
        pure functions of them (no memory read, no assignment)."""
        k = e[0]
        if k in ("int", "flt"):
            return True
        if k == "var":
            return self.lookup(e[1]) is not None and e[1] not in self.assigned
        if k == "bin":
            return self.pure(e[2]) and self.pure(e[3])
        if k in ("un", "cast"):
            return self.pure(e[2])
        if k == "tern":
            return self.pure(e[1]) and self.pure(e[2]) and self.pure(e[3])
        if k == "call":
            return e[1] in _PURE and all(self.pure(a) for a in e[2])
        return False

    def resolve(self, e):
        """A pure ``e`` with each variable bound to its entry (a later variable of the same name is another)."""
        k = e[0]
        if k == "var":
            return ("var", self.lookup(e[1]))
        if k == "bin":
            return ("bin", e[1], self.resolve(e[2]), self.resolve(e[3]))
        if k in ("un", "cast"):
            return (k, e[1], self.resolve(e[2]))
        if k == "tern":
            return ("tern", self.resolve(e[1]), self.resolve(e[2]), self.resolve(e[3]))
        if k == "call":
            return ("call", e[1], tuple(self.resolve(a) for a in e[2]))
        return e

    def same(self, e, r) -> bool:
        """Whether expression ``e``, as written here, is the resolved expression ``r``."""
        k = e[0]
        if k != r[0]:
            return False
        if k == "var":
            return self.lookup(e[1]) is r[1]
        if k == "bin":
            return e[1] == r[1] and self.same(e[2], r[2]) and self.same(e[3], r[3])
        if k in ("un", "cast"):
            return e[1] == r[1] and self.same(e[2], r[2])
        if k == "tern":
            return self.same(e[1], r[1]) and self.same(e[2], r[2]) and self.same(e[3], r[3])
        if k == "call":
            return e[1] == r[1] and len(e[2]) == len(r[2]) and all(self.same(a, b) for a, b in zip(e[2], r[2]))
        if k in ("int", "flt"):
            return e[1] == r[1]
        return False

    def linear(self, e):
        """([(atom key, atom, coefficient)], constant) of a pure integer expression: a sum of constants times
        variables or other (non-linear) pure subexpressions; None when ``e`` is not pure."""
        k = e[0]
        if k == "int":
            return ([], e[1]) if I32MIN <= e[1] <= I32MAX else None
        if k == "un" and e[1] in ("-", "+"):
            sub = self.linear(e[2])
            if sub is None:
                return None
            s = -1 if e[1] == "-" else 1
            return [(key, a, s * c) for key, a, c in sub[0]], s * sub[1]
        if k == "bin" and e[1] in ("+", "-"):
            a, b = self.linear(e[2]), self.linear(e[3])
            if a is None or b is None:
                return None
            s = 1 if e[1] == "+" else -1
            terms = list(a[0])
            for key, atom, c in b[0]:
                for i, (key2, atom2, c2) in enumerate(terms):
                    if key2 == key:
                        terms[i] = (key2, atom2, c2 + s * c)
                        break
                else:
                    terms.append((key, atom, s * c))
            const = a[1] + s * b[1]
            terms = [t for t in terms if t[2]]
            if abs(const) > BIG or any(abs(t[2]) > BIG for t in terms):
                return None
            return terms, const
        if k == "bin" and e[1] == "*":
            a, b = self.linear(e[2]), self.linear(e[3])
            if a is None or b is None:
                return None
            if a[0] and b[0]:
                return self.atom(e)
            if a[0]:
                a, b = b, a
            f = a[1]
            terms = [(key, atom, f * c) for key, atom, c in b[0] if f * c]
            if abs(f * b[1]) > BIG or any(abs(t[2]) > BIG for t in terms):
                return None
            return terms, f * b[1]
        return self.atom(e)

    def atom(self, e):
        if not self.pure(e):
            return None
        if e[0] == "var":
            ent = self.lookup(e[1])
            return [(ent, e, 1)], 0
        return [(self.resolve(e), e, 1)], 0

    def atom_value(self, key, atom):
        return key.iv if type(key) is _Entry else self.quiet(atom)

    # facts from conditions
    def atoms(self, c, truth: bool) -> list:
        """[(a, op, b)] comparisons that hold when ``c`` is ``truth`` (conjunctions only)."""
        k = c[0]
        if k == "bin" and c[1] == "&&" and truth:
            return self.atoms(c[2], True) + self.atoms(c[3], True)
        if k == "bin" and c[1] == "||" and not truth:
            return self.atoms(c[2], False) + self.atoms(c[3], False)
        if k == "un" and c[1] == "!":
            return self.atoms(c[2], not truth)
        if k == "bin" and c[1] in _FLIP:
            op = c[1] if truth else _FLIP[c[1]]
            return [(c[2], op, c[3])] if op != "!=" else []
        return []

    def assume(self, c, truth: bool):
        """Narrow by ``c`` being ``truth``: the undo records, or None when ``c`` cannot be ``truth`` here."""
        undo = []
        for a, op, b in self.atoms(c, truth):
            ia, ib = self.quiet_value(a), self.quiet_value(b)
            if (ia is not None and len(ia) == 3) or (ib is not None and len(ib) == 3):
                continue  # a float comparison narrows nothing
            ta, tb = self.ctype(a), self.ctype(b)
            if ta not in ("i", "u") or tb not in ("i", "u"):
                continue  # (long, unknown types: narrows nothing)
            if "u" in (ta, tb) and not (_is_int(ia) and _is_int(ib) and ia[0] >= 0 and ib[0] >= 0):
                continue  # an unsigned comparison: the same as the signed one only of values proven non-negative
            if op in (">", ">="):
                a, b, ia, ib, op = b, a, ib, ia, "<" if op == ">" else "<="
            gap = 1 if op == "<" else 0
            cons = []
            if op == "==":
                if ib is not None:
                    cons.append((a, ib[0], ib[1]))
                if ia is not None:
                    cons.append((b, ia[0], ia[1]))
            else:
                if ib is not None:
                    cons.append((a, I32MIN, ib[1] - gap))
                if ia is not None:
                    cons.append((b, ia[0] + gap, I32MAX))
            for e, lo, hi in cons:
                if not self.narrow(e, lo, hi, undo):
                    self.undo(undo)
                    return None
        return undo

    def narrow(self, e, lo: int, hi: int, undo: list) -> bool:
        cur = self.quiet_value(e)
        if _is_int(cur):
            lo, hi = max(lo, cur[0]), min(hi, cur[1])
        if lo > hi:
            return False
        if not self.pure(e):
            return True
        lin = self.linear(e) if _is_int(cur) else None  # (a value that may wrap: its terms tell nothing)
        self.facts.append((self.resolve(e), lo, hi, lin))
        undo.append(None)
        if lin is None:
            return True
        terms, const = lin
        for key, _, coef in terms:
            if type(key) is not _Entry or not _is_int(key.iv):
                continue
            rest = self.rest(terms, const, key)
            if rest is None:
                continue
            a, b = lo - rest[1], hi - rest[0]  # coef * v in [a, b]
            if coef > 0:
                vlo, vhi = -(-a // coef), b // coef
            else:
                vlo, vhi = -(-b // coef), a // coef
            old = key.iv
            vlo, vhi = max(vlo, old[0]), min(vhi, old[1])
            if vlo > vhi:
                return False
            undo.append((key, old))
            key.iv = (vlo, vhi)
        return True

    def rest(self, terms: list, const: int, skip):
        """The interval of ``const`` + the terms other than ``skip``; None when unknown or too large."""
        lo = hi = const
        for key, atom, c in terms:
            if key is skip:
                continue
            v = self.atom_value(key, atom)
            if not _is_int(v):
                return None
            p, q = c * v[0], c * v[1]
            lo, hi = lo + min(p, q), hi + max(p, q)
            if max(abs(p), abs(q), abs(lo), abs(hi)) > BIG:
                return None
        return lo, hi

    def undo(self, undo: list) -> None:
        for rec in reversed(undo):
            if rec is None:
                self.facts.pop()
            else:
                rec[0].iv = rec[1]

    # values
    def quiet(self, e):
        saved, self.recording = self.recording, False
        try:
            return self.eval(e)
        finally:
            self.recording = saved

    def quiet_value(self, e):
        saved, self.recording = self.recording, False
        try:
            return self.value(e)
        finally:
            self.recording = saved

    def value(self, e):
        """``eval(e)``, narrowed where ``e`` is linear in terms that facts bound together (an index
        ``gn * 250 + gm * 64 + tm`` under ``if (gm * 64 + tm < 250)``)."""
        return self.signed(e, self._value(e))

    def _value(self, e):
        v = self.eval(e)
        if not self.facts or (v is not None and len(v) == 3):
            return v
        lin = self.linear(e) if self.pure(e) else None
        if lin is None:
            return v
        terms, const = list(lin[0]), lin[1]
        lo = hi = const
        for _, flo, fhi, flin in reversed(self.facts):  # the latest fact on an expression is the tightest
            if flin is None or not flin[0] or not terms:
                continue
            k0, _, c0 = flin[0][0]
            mine = {key: c for key, _, c in terms}
            if k0 not in mine or mine[k0] % c0:
                continue
            alpha = mine[k0] // c0
            if any(mine.get(key) != alpha * c for key, _, c in flin[0]):
                continue
            drop = {key for key, _, _ in flin[0]}
            terms = [t for t in terms if t[0] not in drop]
            p, q = alpha * (flo - flin[1]), alpha * (fhi - flin[1])
            lo, hi = lo + min(p, q), hi + max(p, q)
            if max(abs(p), abs(q), abs(lo), abs(hi)) > BIG:
                return v
        if len(terms) == len(lin[0]):
            return v  # no fact applied
        r = self.rest(terms, 0, None)
        if r is None:
            return v
        lo, hi = lo + r[0], hi + r[1]
        if lo < I32MIN or hi > I32MAX:
            return v
        return _meet(v, lo, hi) if _is_int(v) else (lo, hi)

    def known(self, e, v):
        """``v`` narrowed by the facts about exactly ``e``."""
        for r, lo, hi, _ in self.facts:
            if r[0] == e[0] and self.same(e, r):
                v = _meet(v, lo, hi)
        return v

    def eval(self, e):
        self.depth += 1
        if self.depth > MAX_HEIGHT:
            raise BoundsError(0, "an expression nested too deeply")
        try:
            v = self._eval(e)
        finally:
            self.depth -= 1
        if self.facts and e[0] in ("var", "bin", "un", "cast", "call", "tern"):
            v = self.known(e, v)
        return self.signed(e, v)

    def _eval(self, e):
        k = e[0]
        if k == "int":
            return _int(e[1], e[1])
        if k == "flt":
            return e[1]
        if k == "var":
            if e[1] in self.params:
                raise BoundsError(e[2], f"parameter {e[1]!r} is used other than indexed, loaded, stored or "
                                        f"passed to an image function")
            ent = self.lookup(e[1])
            return ent.iv if ent is not None else None
        if k == "bin":
            if e[1] in ("&&", "||"):  # the right side runs only where the left allows it
                self.eval(e[2])
                undo = self.assume(e[2], e[1] == "&&")
                if undo is not None:
                    self.eval(e[3])
                    self.undo(undo)
                return (0, 1)
            chain, node = [], e  # a left-leaning chain (a + b + c ...) walked as a loop
            while node[0] == "bin" and node[1] not in ("&&", "||"):
                chain.append(node)
                node = node[2]
            v = self.eval(node)
            for b in reversed(chain):
                w = self.eval(b[3])
                if b[1] not in _CMP and ((_is_int(v) and v[0] < 0) or (_is_int(w) and w[0] < 0)) \
                        and self.ctype(b) == "u":
                    v = None  # a negative operand converted to an unsigned type
                else:
                    v = _bin(b[1], v, w)
                if self.facts and b is not e:
                    v = self.known(b, v)
                v = self.signed(b, v)
            return v
        if k == "un":
            a = self.eval(e[2])
            op = e[1]
            if op == "!":
                return (0, 1)
            if a is None or op == "+":
                return a
            if len(a) == 3:
                return ("f", -a[2], -a[1]) if op == "-" else None
            return _int(-a[1], -a[0]) if op == "-" else _int(-a[1] - 1, -a[0] - 1)
        if k == "tern":
            self.eval(e[1])
            out, live = None, False
            for branch, truth in ((e[2], True), (e[3], False)):
                undo = self.assume(e[1], truth)
                if undo is None:
                    continue
                v = self.eval(branch)
                self.undo(undo)
                out = _union(out, v) if live else v
                live = True
            return out
        if k == "cast":
            return _cast(self.eval(e[2]), e[1])
        if k == "vec":
            for x in e[2]:
                self.eval(x)
            return None
        if k == "mem":
            self.eval(e[1])
            return None
        if k == "idx":
            base = e[1]
            if base[0] == "var" and base[1] in self.params:
                self.access(self.params[base[1]], e[2], 1, None, e[3], 1)
            else:
                self.eval(base)
                self.eval(e[2])
            return None
        if k == "asg":
            lhs = e[2]
            if lhs[0] == "idx" and lhs[1][0] == "var" and lhs[1][1] in self.params:
                self.access(self.params[lhs[1][1]], lhs[2], 1, None, lhs[3], 1, True)
            elif lhs[0] == "var":
                if lhs[1] in self.params:
                    raise BoundsError(e[4], f"parameter {lhs[1]!r} is assigned")
            else:
                self.eval(lhs)
            self.eval(e[3])
            return None
        if k == "inc":
            x = e[1]
            if x[0] == "var":
                if x[1] in self.params:
                    raise BoundsError(e[2], f"parameter {x[1]!r} is incremented")
            elif x[0] == "idx" and x[1][0] == "var" and x[1][1] in self.params:
                self.access(self.params[x[1][1]], x[2], 1, None, x[3], 1, True)
            else:
                self.eval(x)
            return None
        if k == "call":
            return self.call(e)
        raise BoundsError(0, f"the expression {k}")

    def call(self, e):
        name, args, line = e[1], e[2], e[3]
        m = _VLOAD.match(name) or _VHALF.match(name)
        if m:
            store = m.group(1).startswith("vstore")
            n = int(m.group(2) or 1)
            step = 4 if n == 3 and "a_half" in m.group(1) else n
            if len(args) != (3 if store else 2):
                raise BoundsError(line, f"{name} with {len(args)} arguments")
            if store:
                self.eval(args[0])
            ptr, base = args[-1], None
            if ptr[0] == "bin" and ptr[1] == "+" and ptr[2][0] == "var" and ptr[2][1] in self.params:
                ptr, base = ptr[2], ptr[3]
            elif ptr[0] == "bin" and ptr[1] == "+" and ptr[3][0] == "var" and ptr[3][1] in self.params:
                ptr, base = ptr[3], ptr[2]
            if ptr[0] == "var" and ptr[1] in self.params:
                self.access(self.params[ptr[1]], args[-2], step, base, line, n, store)
            else:
                raise BoundsError(line, f"{name} of a pointer other than a kernel parameter")
            return None
        if name in _IMAGE_READ or name in _IMAGE_WRITE:
            return self.image(name, args, line)
        if name == "atomic_inc":  # atomic_inc(P + i): element i of an int buffer parameter, read and written
            if len(args) != 1:
                raise BoundsError(line, f"{name} with {len(args)} arguments")
            ptr = args[0]
            if not (ptr[0] == "bin" and ptr[1] == "+" and ptr[2][0] == "var" and ptr[2][1] in self.params) \
                    or self.kinds[self.params[ptr[2][1]]]["type"] != "int":
                raise BoundsError(line, f"{name} of a pointer other than an int buffer parameter plus an index")
            self.access(self.params[ptr[2][1]], ptr[3], 1, None, line, 1, True)
            return None
        for a in args:
            if a[0] == "var" and a[1] in self.params:
                raise BoundsError(line, f"parameter {a[1]!r} is passed to {name}()")
        vs = [self.eval(a) for a in args]
        if name in _IDS:
            if len(vs) != 1 or not _is_int(vs[0]) or vs[0][0] != vs[0][1] or not 0 <= vs[0][0] <= 2:
                raise BoundsError(line, f"{name} of a dimension other than 0, 1 or 2")
            d = vs[0][0]
            g, l_ = self.glob[d], self.local[d]
            return {"get_global_id": (0, g - 1), "get_local_id": (0, l_ - 1), "get_group_id": (0, g // l_ - 1),
                    "get_global_size": (g, g), "get_local_size": (l_, l_), "get_num_groups": (g // l_, g // l_),
                    "get_global_offset": (0, 0)}[name]
        if name in ("min", "max", "clamp", "mul24", "mad24") and self.ctype(e) == "u" \
                and any(_is_int(v) and v[0] < 0 for v in vs):
            return None  # a negative argument converted to an unsigned type
        if name in ("min", "max", "fmin", "fmax") and len(vs) == 2:
            a, b = vs
            if name[0] == "f" or (a is not None and len(a) == 3) or (b is not None and len(b) == 3):
                if _is_int(a) or _is_int(b):
                    return None
                a, b = _float_of(a), _float_of(b)
                f = min if name.endswith("min") else max
                return ("f", f(a[1], b[1]), f(a[2], b[2]))
            if any(v is None and self.ctype(x) != "i" for v, x in zip(vs, args)):
                return None  # an unknown value of a type wider than int, or unsigned
            a = a if a is not None else (I32MIN, I32MAX)
            b = b if b is not None else (I32MIN, I32MAX)
            f = min if name == "min" else max
            return (f(a[0], b[0]), f(a[1], b[1]))
        if name == "clamp" and len(vs) == 3:
            if any(v is not None and len(v) == 3 for v in vs):
                return None
            if any(v is None and self.ctype(x) != "i" for v, x in zip(vs, args)):
                return None
            x, lo, hi = (v if v is not None else (I32MIN, I32MAX) for v in vs)
            if lo[1] > hi[0]:
                return None  # (clamp of a lower bound above the upper one is undefined)
            return (min(max(x[0], lo[0]), hi[0]), min(max(x[1], lo[1]), hi[1]))
        if name == "abs" and len(vs) == 1 and _is_int(vs[0]):
            a = vs[0]
            return _int(0 if a[0] <= 0 <= a[1] else min(abs(a[0]), abs(a[1])), max(abs(a[0]), abs(a[1])))
        if name in ("floor", "ceil", "trunc") and len(vs) == 1 and vs[0] is not None and len(vs[0]) == 3:
            f = {"floor": math.floor, "ceil": math.ceil, "trunc": math.trunc}[name]
            a = vs[0]
            if not (math.isfinite(a[1]) and math.isfinite(a[2])):
                return ("f", -math.inf, math.inf)
            return ("f", float(f(a[1])), float(f(a[2])))
        if name == "mul24" and len(vs) == 2:  # (past 24-bit operands: implementation-defined)
            return _bin("*", vs[0], vs[1]) if _in24(vs[0]) and _in24(vs[1]) else None
        if name == "mad24" and len(vs) == 3:
            return _bin("+", _bin("*", vs[0], vs[1]), vs[2]) if _in24(vs[0]) and _in24(vs[1]) else None
        if name == "floordiv_i" and len(vs) == 2 and _is_int(vs[0]) and _is_int(vs[1]):
            a, b = vs
            if b[0] <= 0:  # (the helper floors for a positive divisor only)
                return None
            c = [x // y for x in a for y in b]
            return _int(min(c), max(c))
        if name == "floormod_i" and len(vs) == 2 and _is_int(vs[0]) and _is_int(vs[1]):
            a, b = vs
            if b[0] <= 0:
                return None
            return a if a[0] >= 0 and a[1] < b[0] else (0, b[1] - 1)
        return None

    def image(self, name: str, args: tuple, line: int):
        write = name in _IMAGE_WRITE
        if not args or args[0][0] != "var" or args[0][1] not in self.params:
            raise BoundsError(line, f"{name} of an image other than a kernel parameter")
        i = self.params[args[0][1]]
        if self.kinds[i]["kind"] != "image":
            raise BoundsError(line, f"{name} of the buffer parameter {args[0][1]!r}")
        rest, clamped = list(args[1:]), False
        if not write and len(rest) == 2:
            s = rest.pop(0)
            clamped = s[0] == "var" and self.samplers.get(s[1], False) and self.lookup(s[1]) is None
        if len(rest) != (2 if write else 1):
            raise BoundsError(line, f"{name} with {len(args)} arguments")
        coord = rest[0]
        for a in rest[1:]:
            self.eval(a)
        if coord[0] == "vec" and len(coord[2]) == 2:
            x, y = self.value(coord[2][0]), self.value(coord[2][1])
        else:
            x = y = self.value(coord)
        if clamped or not self.recording:
            return None
        if not (_is_int(x) and _is_int(y)):
            raise BoundsError(line, f"cannot bound the pixel {name} addresses in image {args[0][1]!r}")
        old = self.pixels[i]
        self.pixels[i] = (x, y) if old is None else (_union(old[0], x), _union(old[1], y))
        if write:
            self.count(i, 1, (x[1] - x[0] + 1) * (y[1] - y[0] + 1))
        return None

    def access(self, i: int, index, step: int, base, line: int, width: int, write: bool = False) -> None:
        """Parameter ``i`` addressed at elements ``step * index + base`` to ``... + width - 1`` (``write``: a
        store of ``width`` elements)."""
        if self.kinds[i]["kind"] != "buffer":
            raise BoundsError(line, f"the image parameter {self.kinds[i]['name']!r} is indexed as a buffer")
        v = self.value(index)
        b = self.value(base) if base is not None else (0, 0)
        if not self.recording:
            return
        if not (_is_int(v) and _is_int(b)):
            raise BoundsError(line, f"cannot bound the index of parameter {self.kinds[i]['name']!r}")
        lo, hi = step * v[0] + b[0], step * v[1] + b[1] + width - 1
        old = self.ranges[i]
        self.ranges[i] = (lo, hi) if old is None else (min(lo, old[0]), max(hi, old[1]))
        if write:
            self.count(i, width, hi - lo + 1)

    # how much a launch can write
    def position(self, lin):
        """The work-item position a linear form is: (kind, dimension) of a term alone (coefficient 1), or
        ("get_global_id", d) of get_group_id(d) * local size + get_local_id(d); None."""
        if lin is None or lin[1] != 0:
            return None
        terms = lin[0]
        if len(terms) == 1 and terms[0][2] == 1:
            return _key_tag(terms[0][0])
        if len(terms) == 2:
            (k1, _, c1), (k2, _, c2) = terms
            t1, t2 = _key_tag(k1), _key_tag(k2)
            if t1 is not None and t1[0] == "get_local_id":
                t1, t2, c1, c2 = t2, t1, c2, c1
            if t1 is not None and t2 is not None and t1[0] == "get_group_id" and t2 == ("get_local_id", t1[1]) \
                    and c2 == 1 and c1 == self.local[t1[1]]:
                return "get_global_id", t1[1]
        return None

    def reach(self):
        """An upper bound on the work-items that run this point of the code: per dimension, the launch's
        work-items, or fewer where a position (a variable that is one, or a condition in force on one, or on
        get_group_id * local size + get_local_id) is narrowed here; their product (None: past BIG)."""
        total = 1
        for d in range(3):
            g, l_ = self.glob[d], self.local[d]
            n = {"get_global_id": g, "get_group_id": g // l_, "get_local_id": l_}
            if g <= I32MAX:  # (a position of a larger launch wraps in an int: no narrowing)
                for ent, _ in self.tagged:
                    kind, dd = ent.tag
                    if dd == d and _is_int(ent.iv):
                        n[kind] = min(n[kind], ent.iv[1] - ent.iv[0] + 1)
                for _, lo, hi, lin in self.facts:
                    if lin is None or not lin[0] or len(lin[0]) > 2:
                        continue
                    terms = lin[0]
                    if len(terms) == 1:
                        t, c = _key_tag(terms[0][0]), terms[0][2]
                    else:
                        (k1, _, c1), (k2, _, c2) = terms
                        t1, t2 = _key_tag(k1), _key_tag(k2)
                        if t1 is not None and t1[0] == "get_local_id":
                            t1, t2, c1, c2 = t2, t1, c2, c1
                        t, c = None, c2
                        if t1 is not None and t2 is not None and t1[0] == "get_group_id" \
                                and t2 == ("get_local_id", t1[1]) and c1 == c2 * l_:
                            t = ("get_global_id", t1[1])
                    if t is not None and t[1] == d:  # c * position in [lo - const, hi - const]
                        n[t[0]] = min(n[t[0]], (hi - lo) // abs(c) + 1)
            total *= min(n["get_global_id"], n["get_group_id"] * n["get_local_id"])
            if total > BIG:
                return None
        return total

    def count(self, i: int, width: int, span: int) -> None:
        """A store of ``width`` elements (pixels) through parameter ``i`` here, inside ``span`` elements (pixels)
        of it: at most reach() x the loops' runs x ``width`` more written, and at most ``span`` distinct."""
        w, n = self.writes[i], self.reach()
        for f in (self.mult, width):
            if n is None or f is None:
                n = None
                break
            n *= f
            if n > BIG:
                n = None
        n = span if n is None or span < n else n
        self.writes[i] = None if w is None or n > BIG or w + n > BIG else w + n

    # statements
    def run(self, s) -> None:
        k = s[0]
        if k == "block":
            self.scopes.append({})
            for x in s[1]:
                self.run(x)
            self.pop_scope()
        elif k == "expr":
            self.eval(s[1])
        elif k == "decl":
            _, base, scalar, name, init, line, const = s
            if name in self.params:
                raise BoundsError(line, f"a variable shadows parameter {name!r}")
            v = self.value(init) if init is not None else None
            if scalar and init is not None and (const or name not in self.assigned):
                v = _cast(v, base)
            else:
                v = None
            # (a const int that is a work-item's position: read before the variable is in scope)
            tag = self.position(self.linear(init)) if base == "int" and _is_int(v) and self.pure(init) else None
            ent = self.scopes[-1][name] = _Entry(name, v, tag, _class(base))
            if tag is not None:
                self.tagged.append((ent, len(self.scopes)))
        elif k == "if":
            self.eval(s[1])
            for branch, truth in ((s[2], True), (s[3], False)):
                if branch is None:
                    continue
                undo = self.assume(s[1], truth)
                if undo is None:  # this branch never runs with this launch
                    continue
                self.scopes.append({})
                self.run(branch)
                self.pop_scope()
                self.undo(undo)
        elif k == "for":
            self.loop(s)
        elif k != "nop":
            raise BoundsError(0, f"the statement {k}")

    def loop(self, s) -> None:
        _, init, var, cond, step, body = s
        self.scopes.append({})
        if init is not None:
            self.run(init)
        if var is not None:
            ent = self.scopes[-1][var]
            bound = self.value(cond[3])
            if not (_is_int(ent.iv) and _is_int(bound)):
                ent.iv = None
            else:
                last = bound[1] - (1 if cond[1] == "<" else 0)
                if last < ent.iv[0]:  # the body never runs
                    self.pop_scope()
                    return
                ent.iv = (ent.iv[0], last)
        else:
            if init is not None and init[0] == "decl":
                self.scopes[-1][init[3]].iv = None
            if cond is not None:
                self.eval(cond)
        if step is not None:
            self.eval(step)
        saved = self.mult  # the body runs at most once per value of its variable (of a loop the compiler writes)
        trips = ent.iv[1] - ent.iv[0] + 1 if var is not None and ent.iv is not None else None
        self.mult = None if saved is None or trips is None or saved * trips > BIG else saved * trips
        self.scopes.append({})
        self.run(body)
        self.pop_scope()
        self.pop_scope()
        self.mult = saved

    def pop_scope(self) -> None:
        self.scopes.pop()
        depth, tagged = len(self.scopes), self.tagged
        while tagged and tagged[-1][1] > depth:
            tagged.pop()


class Source:
    """A kernel file parsed once: ``kernels`` (name -> (reqd_work_group_size or None, params, body, assigned
    names)) and ``samplers`` (name -> whether it clamps out-of-range coordinates)."""

    def __init__(self, text: str):
        self.kernels: dict = {}
        self.samplers: dict = {}
        self.done: dict = {}  # (kernel, global size, local size) -> what analyse found
        toks = _tokens(text)
        kinds, texts, lines = toks
        p = 0
        while kinds[p] != "end":
            t = texts[p]
            if t in ("__kernel", "kernel"):
                p = self._kernel(toks, p + 1)
            elif t in ("__constant", "constant") and texts[p + 1] == "sampler_t" and kinds[p + 2] == "id":
                q = p + 3
                while kinds[q] != "end" and texts[q] != ";":
                    q += 1
                words = set(texts[p + 3:q])
                named = next((x for k, x in zip(kinds[p:q], texts[p:q]) if k == "id" and _modelled(x)), None)
                if named is not None:  # (no helper is a sampler)
                    raise BoundsError(lines[p], f"a file-scope definition naming {named!r} that is not the "
                                                f"compiler's own helper")
                self.samplers[texts[p + 2]] = bool(words & _CLAMPING) and not words & _WRAPPING
                p = q + 1 if kinds[q] != "end" else q
            else:  # a helper function or a declaration, skipped to its end (it sees no kernel parameter)
                start, depth = p, 0
                while kinds[p] != "end":
                    x = texts[p]
                    p += 1
                    if x in ("{", "(", "["):
                        depth += 1
                    elif x in ("}", ")", "]"):
                        depth -= 1
                        if depth == 0 and x == "}":
                            break
                    elif x == ";" and depth == 0:
                        break
                item = tuple(zip(kinds[start:p], texts[start:p]))
                named = next((x for k, x in item if k == "id" and _modelled(x)), None)
                if named is not None and item not in _helper_tokens():
                    raise BoundsError(lines[start], f"a file-scope definition naming {named!r} that is not the "
                                                    f"compiler's own helper")

    def _kernel(self, toks, p: int) -> int:
        kinds, texts, lines = toks
        reqd = None
        while texts[p] == "__attribute__":
            q, depth = p + 1, 0
            while True:
                if kinds[q] == "end":
                    raise BoundsError(lines[q], "an unterminated __attribute__")
                depth += texts[q] == "("
                depth -= texts[q] == ")"
                q += 1
                if depth == 0:
                    break
            words = texts[p + 1:q]
            if "reqd_work_group_size" in words:
                i = words.index("reqd_work_group_size")
                nums = words[i + 2:i + 7:2]
                values = [_int_literal(x) for x in nums]
                if len(nums) != 3 or words[i + 1] != "(" or words[i + 7:i + 8] != [")"] or words[i + 3] != "," \
                        or words[i + 5] != "," or None in values:
                    raise BoundsError(lines[p], "reqd_work_group_size of three integers expected")
                reqd = tuple(values)
            p = q
        if texts[p] != "void" or kinds[p + 1] != "id" or texts[p + 2] != "(":  # (the last token is "end")
            raise BoundsError(lines[p], "__kernel void NAME( expected")
        name = texts[p + 1]
        if _modelled(name):
            raise BoundsError(lines[p], f"a kernel named {name!r}")
        parser = _Parser(toks, p + 3)
        params = []
        if parser.text() != ")":
            while True:
                line = parser.line()
                base, stars, words = parser.parse_type()
                if parser.kind() != "id":
                    raise BoundsError(line, "a parameter name expected")
                pname = parser.take()
                if base == "image2d_t" and not stars:
                    access = "write" if set(words) & {"__write_only", "write_only", "__read_write", "read_write"} \
                        else "read"
                    params.append({"name": pname, "kind": "image", "type": None, "access": access})
                elif stars == 1 and base in _ELEM_BYTES:
                    params.append({"name": pname, "kind": "buffer", "type": base,
                                   "access": "read" if "const" in words else "write"})
                else:
                    raise BoundsError(line, f"kernel parameter {pname!r} is neither a buffer nor an image2d_t")
                if any(q["name"] == pname for q in params[:-1]):
                    raise BoundsError(line, f"kernel parameter {pname!r} named twice")
                if parser.text() == ")":
                    break
                parser.take(",")
        parser.take(")")
        if parser.text() != "{":
            raise BoundsError(parser.line(), f"the body of kernel {name!r} expected")
        body = parser.statement()
        if _height(body) > MAX_HEIGHT:
            raise BoundsError(lines[p], f"the body of kernel {name!r} nests deeper than {MAX_HEIGHT}")
        if name in self.kernels:
            raise BoundsError(lines[p], f"kernel {name!r} is defined twice")
        assigned: set = set()
        _assigned(body, assigned)
        self.kernels[name] = (reqd, params, body, assigned)
        return parser.p

    def analyse(self, kernel: str, glob: tuple, local: tuple):
        """(ranges, pixels): per parameter, the (lo, hi) elements its code addresses (None: none), and the
        ((x lo, x hi), (y lo, y hi)) pixels of an image it writes or reads without a clamping sampler."""
        return self.analyse_writes(kernel, glob, local)[:2]

    def analyse_writes(self, kernel: str, glob: tuple, local: tuple):
        """(ranges, pixels, writes): :meth:`analyse`'s, and per parameter an upper bound on how many distinct
        elements (pixels of an image) the launch writes through it (0: none; None: no bound is known): the sum
        over its stores of the work-items that can reach the store (:meth:`_Analysis.reach`) times the runs of the
        loops around it times the elements it stores, or of the span it addresses where that is fewer."""
        key = (kernel, glob, local)
        if key not in self.done:
            reqd, params, body, assigned = self.kernels[kernel]
            a = _Analysis(params, self.samplers, glob, local, assigned)
            limit = sys.getrecursionlimit()
            sys.setrecursionlimit(max(limit, 4 * MAX_HEIGHT + 1000))  # (Python frames: no C stack)
            try:
                a.run(body)
            finally:
                sys.setrecursionlimit(limit)
            self.done[key] = (a.ranges, a.pixels, a.writes)
        return self.done[key]


@lru_cache(maxsize=64)
def parse_source(text: str):
    """The parsed ``text``, or the BoundsError it raised (kept: a source is parsed once per process)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * MAX_HEIGHT + 1000))  # (Python frames: no C stack)
    try:
        return Source(text)
    except BoundsError as e:
        return e
    finally:
        sys.setrecursionlimit(limit)


def check_call(text: str, source_name: str, call, where: str, args: list) -> tuple:
    """Check 11 for one call: its signature is what the source declares (names, kinds, element types, access,
    in order), its local size is the kernel's reqd_work_group_size, and every element and pixel the kernel
    addresses with this launch lies inside the argument bound to it. ``args``: per parameter, (element count,
    element bytes, physical shape) of its argument. An ArtifactError naming the call otherwise. Returns (written,
    counts): what it writes, per parameter, (bytes lo, bytes hi + 1) of a buffer, ((x lo, y lo), (x hi + 1,
    y hi + 1)) of an image, or None (read only, or not addressed); and at most how many elements (pixels) it
    writes there (None: no bound known; :meth:`Source.analyse_writes`)."""
    def fail(msg: str):
        raise ArtifactError(f"graph.json: {where}: {msg}; recompile the model")

    kernel = call.kernel
    src = parse_source(text)
    try:
        if isinstance(src, BoundsError):
            raise src
        if kernel not in src.kernels:
            raise BoundsError(0, f"no kernel {kernel!r} is defined")
        reqd, params, _, _ = src.kernels[kernel]
        if len(params) != len(call.signature):
            fail(f"kernels/{source_name} declares {len(params)} parameters for {kernel!r}, the signature "
                 f"{len(call.signature)}")
        for k, (p, s) in enumerate(zip(params, call.signature)):
            if (p["name"], p["kind"], p["type"], p["access"]) != (s.name, s.kind, s.type, s.access):
                fail(f"signature[{k}] ({s.access} {s.kind} {s.name!r} of {s.type}) is not what kernels/"
                     f"{source_name} declares ({p['access']} {p['kind']} {p['name']!r} of {p['type']})")
        if reqd is not None and tuple(call.local_size) != reqd:
            fail(f"local_size {list(call.local_size)} is not the reqd_work_group_size {list(reqd)} that kernels/"
                 f"{source_name} declares for {kernel!r}")
        ranges, pixels, counts = src.analyse_writes(kernel, tuple(call.global_size), tuple(call.local_size))
    except BoundsError as e:
        at = f", line {e.line}" if e.line else ""
        fail(f"cannot tell what kernel {kernel!r} (kernels/{source_name}{at}) addresses: {e.what}; the source is "
             f"not one the compiler generates")
    for k, p in enumerate(params):
        count, itemsize, phys = args[k]
        ref = call.args[k]
        if ranges[k] is not None:
            lo, hi = ranges[k]
            need = (hi + 1) * _ELEM_BYTES[p["type"]]
            if lo < 0 or need > count * itemsize:
                fail(f"with global_size {list(call.global_size)}, kernel {kernel!r} addresses {p['name']}[{lo}.."
                     f"{hi}] ({p['type']}), but argument {ref!r} holds {count * itemsize} bytes: the artifact was "
                     f"edited")
        if pixels[k] is not None:
            (xl, xh), (yl, yh) = pixels[k]
            h, w = phys[0], phys[1]
            if xl < 0 or yl < 0 or xh >= w or yh >= h:
                fail(f"with global_size {list(call.global_size)}, kernel {kernel!r} addresses pixels x {xl}..{xh}, "
                     f"y {yl}..{yh} of image {p['name']!r}, but argument {ref!r} is {w} x {h} pixels: the artifact "
                     f"was edited")
    written = []
    for k, p in enumerate(params):
        if p["access"] != "write":
            written.append(None)
        elif p["kind"] == "buffer":
            r = ranges[k]
            written.append(None if r is None else (r[0] * _ELEM_BYTES[p["type"]], (r[1] + 1) * _ELEM_BYTES[p["type"]]))
        else:
            px = pixels[k]
            written.append(None if px is None else ((px[0][0], px[1][0]), (px[0][1] + 1, px[1][1] + 1)))
    return written, list(counts)
