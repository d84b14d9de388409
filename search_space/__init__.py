"""Declarative search spaces: one TOML file per template (``conv2d.toml``, ...), shipped as package data.

A file has four tables::

    template = "conv2d"
    [task]          # fixed per tuning task (chosen by the model or the user), validated like knobs
    dtype = ["float32", "float16"]
    input_scope = ["texture", "buffer"]
    [knobs]         # explored by the tuner inside one task
    tile_ow = [1, 2, 4, 8]
    [constraints]   # name = Python expression over knobs, workload variables, device.<capability>
    tile_fits = "tile_ow <= OW"

Loading validates everything and names the offending knob or constraint. ``space.bind(vars, device)``
gives the valid configs of one workload on one device: their count, enumeration and random samples.
"""
from __future__ import annotations

import ast
import math
import tomllib
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path

from tuner.errors import TunerError

HERE = Path(__file__).parent


def image_fits(layout: str, shape, device) -> bool:
    """Whether a logical tensor of ``shape`` stored as a texture with ``layout`` fits the device's image2d."""
    h, w, _ = _image_shape(layout, tuple(int(d) for d in shape))
    return w <= device.image2d_max_width and h <= device.image2d_max_height


@lru_cache(maxsize=4096)
def _image_shape(layout: str, shape: tuple) -> tuple:
    """The image's (height, width, 4) of a logical ``shape`` in ``layout``, once per pair: building a layout's
    IndexMap took most of a sampler's proposals (every constraint check of every random config built one)."""
    from tuner.ir.layouts import get_layout
    return tuple(get_layout(layout).physical_shape(shape))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


FUNCTIONS = {"ceil_div": ceil_div, "min": min, "max": max, "len": len, "all": all, "any": any}

# Bounds on what a constraint may compute: a file must not make `tuner space` (or a tuning run) hang or run out
# of memory on ``10 ** 10 ** 10`` or ``[0] * 10 ** 9``. ``**`` and ``*`` evaluate through the checks below.
MAX_EXPONENT = 64  # of an integer power
MAX_INT_BITS = 4096  # of an integer product or power
MAX_LENGTH = 10_000  # of a repeated string, list or tuple


class ConstraintLimit(ValueError):
    """A constraint computes something too large (see MAX_EXPONENT, MAX_INT_BITS, MAX_LENGTH)."""


def _is_int(v) -> bool:
    return isinstance(v, int)  # bool included: True ** 3, True * 'ab'


def _bounded_pow(a, b):
    if _is_int(b) and abs(b) > MAX_EXPONENT:
        raise ConstraintLimit(f"exponent {b} is out of range (at most {MAX_EXPONENT} in absolute value)")
    if _is_int(a) and _is_int(b) and b > 0 and abs(a) > 1 and a.bit_length() * b > MAX_INT_BITS:
        raise ConstraintLimit(f"{a} ** {b} has more than {MAX_INT_BITS} bits")
    return a ** b


def _bounded_mul(a, b):
    for seq, n in ((a, b), (b, a)):
        if isinstance(seq, (str, list, tuple)) and _is_int(n) and len(seq) * max(n, 0) > MAX_LENGTH:
            raise ConstraintLimit(f"repeating a {type(seq).__name__} {n} times makes more than {MAX_LENGTH} items")
    if _is_int(a) and _is_int(b) and a.bit_length() + b.bit_length() > MAX_INT_BITS:
        raise ConstraintLimit(f"a product of more than {MAX_INT_BITS} bits")
    return a * b


_BOUNDED = {ast.Pow: "__bounded_pow__", ast.Mult: "__bounded_mul__"}
EVAL_GLOBALS = {"__builtins__": {}, "__bounded_pow__": _bounded_pow, "__bounded_mul__": _bounded_mul}


class _Bound(ast.NodeTransformer):
    """``a ** b`` -> ``__bounded_pow__(a, b)``, ``a * b`` -> ``__bounded_mul__(a, b)``."""

    def visit_BinOp(self, node):
        self.generic_visit(node)
        fn = _BOUNDED.get(type(node.op))
        if fn is None:
            return node
        return ast.copy_location(ast.Call(ast.Name(fn, ast.Load()), [node.left, node.right], []), node)


def _why(e: Exception) -> str:
    return str(e) if isinstance(e, ConstraintLimit) else f"{type(e).__name__}: {e}"


def _evaluate(code, env: dict):
    return eval(code, EVAL_GLOBALS, env)
_NODES = (ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp, ast.Call, ast.Name,
          ast.Load, ast.Constant, ast.Attribute, ast.Subscript, ast.Tuple, ast.List, ast.And, ast.Or,
          ast.Not, ast.USub, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.Eq,
          ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Is, ast.IsNot)


@dataclass(frozen=True)
class Constraint:
    name: str
    text: str
    code: object
    knobs: frozenset  # the knobs it reads: checked as soon as all are chosen


@dataclass(frozen=True)
class SearchSpace:
    template: str
    task: dict  # knob -> choices, fixed per task
    knobs: dict  # knob -> choices, explored
    constraints: tuple
    path: str = ""
    var_names: frozenset = field(default=frozenset())

    @property
    def all_knobs(self) -> dict:
        return {**self.task, **self.knobs}

    @property
    def total(self) -> int:
        """Size of the unconstrained product of all choices."""
        return math.prod(len(c) for c in self.all_knobs.values())

    def bind(self, vars: dict, device, fixed: dict | None = None) -> "BoundSpace":
        """The space of one workload (``vars`` from the template's ``space_vars``) on one device, with some
        knobs (``fixed``, e.g. the task's dtype and scopes) held at one value."""
        fixed = dict(fixed or {})
        missing = self.var_names - set(vars)
        if missing:
            raise TunerError(f"{self.path}: workload variables {sorted(missing)} not given")
        choices = {}
        for name, options in self.all_knobs.items():
            if name in fixed:
                if not is_choice(fixed[name], options):
                    raise TunerError(f"{name}={fixed[name]!r} is not a choice of knob {name!r} in {self.path} "
                                     f"(choices: {options})")
                options = [fixed.pop(name)]
            choices[name] = list(options)
        if fixed:
            raise TunerError(f"unknown knobs {sorted(fixed)} for template {self.template}; knobs: "
                             f"{', '.join(self.all_knobs)}")
        fits = lambda layout, shape: image_fits(layout, shape, device)  # noqa: E731
        return BoundSpace(self, choices, {**FUNCTIONS, **vars, "device": device, "image_fits": fits})


def is_choice(value, options) -> bool:
    """``value in options`` with the type too: JSON's ``true`` is not the knob value 1, nor ``4.0`` the 4."""
    return any(value == o and type(value) is type(o) for o in options)


class BoundSpace:
    """The valid configs of one workload on one device. Constraints are checked during a depth-first walk
    over the knobs in file order, each as soon as the knobs it reads are chosen."""

    def __init__(self, space: SearchSpace, choices: dict, env: dict):
        self.space, self.choices, self.env = space, choices, env
        order = list(choices)
        self._at: dict = {k: [] for k in order}  # knob -> constraints complete once it is chosen
        for c in space.constraints:
            last = max((order.index(k) for k in c.knobs), default=0)
            self._at[order[last]].append(c)

    def _ok(self, constraints, env) -> Constraint | None:
        for c in constraints:
            try:
                if not _evaluate(c.code, env):
                    return c
            except Exception as e:  # noqa: BLE001 - report which constraint broke, not a traceback
                raise TunerError(f"{self.space.path}: constraint {c.name!r} ({c.text}) failed to evaluate: "
                                 f"{_why(e)}") from None
        return None

    def violations(self, values: dict) -> list:
        """The constraints a complete assignment breaks, as ``"name: expression"`` strings."""
        unknown = set(values) - set(self.choices)
        if unknown:
            raise TunerError(f"unknown knobs {sorted(unknown)}; knobs of {self.space.template}: "
                             f"{', '.join(self.choices)}")
        out = []
        for name, options in self.choices.items():
            if name not in values:
                out.append(f"{name}: missing")
            elif not is_choice(values[name], options):
                out.append(f"{name}: {values[name]!r} not in {options}")
        if out:
            return out
        env = {**self.env, **values}
        return [f"{c.name}: {c.text}" for c in self.space.constraints if self._ok((c,), env) is not None]

    def check(self, values: dict) -> None:
        bad = self.violations(values)
        if bad:
            raise TunerError(f"config not valid for this workload and device ({self.space.template}): "
                             + "; ".join(bad))

    def _walk(self, order_fn, limit=None):
        names = list(self.choices)
        env = dict(self.env)
        values: dict = {}

        def rec(i):
            if i == len(names):
                yield dict(values)
                return
            name = names[i]
            for v in order_fn(self.choices[name]):
                values[name] = env[name] = v
                if self._ok(self._at[name], env) is None:
                    yield from rec(i + 1)
            values.pop(name, None)
            env.pop(name, None)
        return rec(0)

    def configs(self):
        """Every valid assignment (task knobs and knobs), in file order."""
        return self._walk(lambda c: c)

    def size(self) -> int:
        """How many valid configs: a depth-first count, memoized on the chosen knobs later constraints read."""
        return self._count()

    def exists(self) -> bool:
        """Whether there is a valid config: the count of ``size`` stopped at the first one."""
        return self._count(enough=1) > 0

    def _count(self, enough: int | None = None) -> int:
        """Valid configs, counted depth-first and memoized on the chosen knobs later constraints read; with
        ``enough``, each branch stops counting once it has that many (so does the total)."""
        names = list(self.choices)
        later = [set().union(*(c.knobs for n in names[i:] for c in self._at[n])) for i in range(len(names) + 1)]
        env, memo = dict(self.env), {}

        def count(i):
            if i == len(names):
                return 1
            key = (i, *(env[k] for k in names[:i] if k in later[i]))
            if key not in memo:
                total = 0
                for v in self.choices[names[i]]:
                    env[names[i]] = v
                    if self._ok(self._at[names[i]], env) is None:
                        total += count(i + 1)
                        if enough is not None and total >= enough:
                            break
                env.pop(names[i])
                memo[key] = total
            return memo[key]
        return count(0)

    def sample(self, rng) -> dict:
        """One valid assignment drawn at random (random choice order, backtracking on constraints)."""
        for values in self._walk(lambda c: [c[i] for i in rng.permutation(len(c))]):
            return values
        raise TunerError(f"search space of {self.space.template} has no valid config for this workload "
                         f"and device; constraints: {', '.join(c.name for c in self.space.constraints)}")


def _check_expression(path: str, name: str, text, knob_names: set, var_names: set, device_attrs: set):
    where = f"{path}: constraint {name!r}"
    if not isinstance(text, str):
        raise TunerError(f"{where}: must be a string holding an expression, got {text!r}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise TunerError(f"{where}: invalid expression {text!r}: {e.msg}") from None
    used = set()
    for node in ast.walk(tree):
        if not isinstance(node, _NODES):
            raise TunerError(f"{where}: {type(node).__name__} is not allowed in {text!r}")
        if isinstance(node, ast.Attribute):
            if not (isinstance(node.value, ast.Name) and node.value.id == "device"):
                raise TunerError(f"{where}: only device.<capability> attributes are allowed in {text!r}")
            if node.attr not in device_attrs:
                raise TunerError(f"{where}: unknown device capability {node.attr!r}; known: "
                                 f"{', '.join(sorted(device_attrs))}")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS
                                               or isinstance(node.func, ast.Name) and node.func.id == "image_fits"):
            raise TunerError(f"{where}: only calls to {', '.join([*FUNCTIONS, 'image_fits'])} are allowed")
        if isinstance(node, ast.Name) and node.id not in ("device", "image_fits", *FUNCTIONS):
            if node.id not in knob_names | var_names:
                raise TunerError(f"{where}: unknown name {node.id!r} in {text!r}; knobs: "
                                 f"{', '.join(sorted(knob_names))}; workload: {', '.join(sorted(var_names))}")
            used.add(node.id)
    for node in ast.walk(tree):  # a part reading no name (e.g. 10 ** 10 ** 10) is evaluated now, bounded
        if isinstance(node, ast.BinOp) and not any(isinstance(n, ast.Name) for n in ast.walk(node)):
            try:
                _evaluate(compile(_bounded(ast.Expression(node)), f"<{name}>", "eval"), {})
            except Exception as e:  # noqa: BLE001 - a ZeroDivisionError, TypeError or a limit: name the part
                raise TunerError(f"{where}: {ast.unparse(node)!r} in {text!r} cannot be evaluated: {_why(e)}") from None
    return compile(_bounded(tree), f"<{name}>", "eval"), frozenset(used & knob_names)


def _bounded(tree):
    import copy
    return ast.fix_missing_locations(_Bound().visit(copy.deepcopy(tree)))


def parse_space(data: dict, path: str, config_fields: set | None = None, var_names: set | None = None,
                device_attrs: set | None = None) -> SearchSpace:
    """Validate a parsed TOML document. ``config_fields``: the template config's fields (every knob must be
    one, and every field a knob); ``var_names``: the workload variables constraints may read."""
    from tuner.target import DeviceInfo
    device_attrs = device_attrs or {f.name for f in fields(DeviceInfo)}
    unknown = set(data) - {"template", "doc", "task", "knobs", "constraints"}
    if unknown:
        raise TunerError(f"{path}: unknown top-level keys {sorted(unknown)}; expected template, doc, task, knobs, "
                         f"constraints")
    if not isinstance(data.get("template"), str):
        raise TunerError(f"{path}: `template = \"<name>\"` is required")
    tables = {}
    for table in ("task", "knobs"):
        tables[table] = {}
        for name, choices in (data.get(table) or {}).items():
            if not isinstance(choices, list) or not choices:
                raise TunerError(f"{path}: knob {name!r} must list its choices, e.g. {name} = [1, 2, 4]; "
                                 f"got {choices!r}")
            kinds = {type(c) for c in choices}
            if len(kinds) != 1 or kinds.pop() not in (int, bool, str, float):
                raise TunerError(f"{path}: knob {name!r}: choices must be numbers, booleans or strings of one "
                                 f"type; got {choices!r}")
            if len(set(choices)) != len(choices):
                raise TunerError(f"{path}: knob {name!r} lists a choice twice: {choices!r}")
            tables[table][name] = choices
    both = set(tables["task"]) & set(tables["knobs"])
    if both:
        raise TunerError(f"{path}: knobs {sorted(both)} are in both [task] and [knobs]")
    knob_names = set(tables["task"]) | set(tables["knobs"])
    if config_fields is not None:
        extra, absent = knob_names - config_fields - {"dtype"}, config_fields - knob_names
        if extra:
            raise TunerError(f"{path}: knob {sorted(extra)[0]!r} is not a config field of template "
                             f"{data['template']} (fields: {', '.join(sorted(config_fields))})")
        if absent:
            raise TunerError(f"{path}: config field {sorted(absent)[0]!r} has no knob; list its choices")
    var_names = set(var_names or ())
    constraints = []
    for name, text in (data.get("constraints") or {}).items():
        code, knobs = _check_expression(path, name, text, knob_names, var_names, device_attrs)
        constraints.append(Constraint(name, text, code, knobs))
    return SearchSpace(data["template"], tables["task"], tables["knobs"], tuple(constraints), path,
                       frozenset(var_names))


def load_space(name_or_path: str, config_fields: set | None = None, var_names: set | None = None,
               template=None, is_path: bool = False) -> SearchSpace:
    """Load ``search_space/<name>.toml`` (or a path to a TOML file; with ``is_path``, any path). ``template``: the
    name, or names, the file's ``template = "..."`` must say (another template's file is refused, naming it)."""
    import stat
    path = Path(name_or_path)
    if path.suffix != ".toml" and not is_path:
        path = HERE / f"{name_or_path}.toml"
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        known = ", ".join(p.stem for p in sorted(HERE.glob("*.toml")))
        what = "the file does not exist" if is_path or path.suffix == ".toml" else f"no file {path}"
        raise TunerError(f"no search space {name_or_path!r}: {what}; shipped spaces: {known}") from None
    except OSError as e:
        raise TunerError(f"search space {str(path)!r} cannot be read: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        from tuner.files import file_kind
        raise TunerError(f"search space {str(path)!r} is {file_kind(mode)}, not a regular file; give a TOML file")
    space = _load(str(path), frozenset(config_fields or ()) or None, frozenset(var_names or ()))
    expected = [template] if isinstance(template, str) else sorted(template or ())
    if expected and space.template not in expected:
        raise TunerError(f"{path}: template = {space.template!r}, but it was given as the search space of "
                         f"{' or '.join(map(repr, expected))}; a space file names the template it is for: write "
                         f"template = {expected[0]!r} if its knobs are that template's")
    return space


@lru_cache(maxsize=None)
def _load(path: str, config_fields, var_names) -> SearchSpace:
    try:
        data = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as e:
        raise TunerError(f"{path}: not valid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TunerError(f"{path}: cannot be read as a TOML file ({e})") from None
    return parse_space(data, path, set(config_fields) if config_fields else None, set(var_names))
