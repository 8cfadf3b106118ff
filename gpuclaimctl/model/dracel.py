"""A documented subset of the CEL that DeviceClass selectors are written in,
evaluated the way kube-scheduler evaluates them (docs/dra.md "CEL subset").

kube-scheduler compiles each `spec.selectors[].cel.expression` of a
DeviceClass in the environment of k8s.io/dynamic-resource-allocation/cel
(compile.go) and evaluates it once per device with one variable, `device`:

- `device.driver`: the driver of the device's ResourceSlice;
- `device.attributes[domain][name]` (or `.name`): the device's attributes,
  each qualified name split at its first "/", a bare name put in the
  driver's domain; an unknown domain is an empty map, an unknown name in a
  known domain a runtime error ("no such key");
- `device.capacity[domain][name]`: the device's capacities, as quantities;
- `device.allowMultipleAllocations`.

What this evaluator takes (anything else is `Unsupported` at compile time,
naming the expression, never a guess): string, int and bool literals;
`semver("…")` / `semver("…", true)` and `quantity("…")` literals; list
literals; `&&`, `||`, `!`, parentheses; `==`, `!=`, `<`, `<=`, `>`, `>=`;
`in` (a list, or a domain's attribute map); `has(device.attributes[d].name)`;
the semver methods `compareTo`, `isGreaterThan`, `isLessThan`, `major`,
`minor`, `patch` and `isSemver()`; the quantity methods `compareTo`,
`isGreaterThan`, `isLessThan` and `isQuantity()`; the string methods
`startsWith`, `endsWith`, `contains`, `lowerAscii`, `upperAscii`.

Semantics follow cel-go as Kubernetes configures it: `&&` and `||` absorb
an error when the other side decides the result (`false && error` is
false, `true || error` is true); equality of values of different types is
false, except that a semver compared with anything else is an error (its
`Equal` answers "no such overload"); `<` and friends need two ints, two
strings or two bools. A runtime error is returned as `EvalError`: the
scheduler's allocator fails the node on it too.

Why not a CEL package: the well-known Python ones (cel-python, the CEL
Python runtime) implement the CEL language but none of Kubernetes' own
libraries (semver, quantity) nor the DRA environment's "unknown domain is
an empty map", so they would not evaluate selectors as the scheduler does
without the same amount of code on top; a small subset that refuses the
rest clearly cannot count a device silently wrong.

Pure: no client, no clock, no globals.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Union

from gpuclaimctl.model.celvalues import Quantity, Semver, normalize_semver, parse_quantity_exact, parse_semver


@dataclass(frozen=True)
class BadValue:
    """An attribute the scheduler cannot turn into a CEL value (a version
    that is not semver, no value at all): evaluating any selector on its
    device is an error, as `DeviceMatches` converts every attribute first."""

    message: str


Value = Union[int, bool, str, Semver, Quantity, tuple[Any, ...]]


@dataclass(frozen=True)
class CelDevice:
    """The `device` variable: driver, attributes and capacity by (domain,
    name) with bare names already put in the driver's domain."""

    driver: str
    attributes: Mapping[tuple[str, str], Value | BadValue]
    capacity: Mapping[tuple[str, str], Quantity]
    allow_multiple_allocations: bool = False


def qualify(name: str, driver: str) -> tuple[str, str]:
    """`parseQualifiedName`: (domain, id), the driver's domain for a bare name."""
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


# -- results ------------------------------------------------------------------


class Unsupported(Exception):
    """The expression uses CEL this subset does not evaluate."""


@dataclass(frozen=True)
class EvalError:
    """A runtime error, as cel-go would raise it on this device; or, with
    `unsupported`, a construct found outside the subset only once the
    values' types were known."""

    message: str
    unsupported: bool = False


class _Domains:
    """device.attributes or device.capacity: domain -> {name: value}; an
    unknown domain is an empty map (newStringInterfaceMapWithDefault)."""

    __slots__ = ("by_domain", "what")

    def __init__(self, by_domain: Mapping[str, Mapping[str, Any]], what: str) -> None:
        self.by_domain = by_domain
        self.what = what


class _Map:
    """One domain's attributes or capacities: a plain CEL map."""

    __slots__ = ("items",)

    def __init__(self, items: Mapping[str, Any]) -> None:
        self.items = items


_Val = Any  # Value | _Domains | _Map | EvalError

# -- lexer --------------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>(?:0[xX][0-9a-fA-F]+|[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)[uU]?)
  | (?P<str>[rR]?(?:'''|\"\"\"|'|"))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|<=|>=|&&|\|\||[<>!()\[\].,?:+\-*/%{}])
""", re.VERBOSE)

_RESERVED = frozenset({"as", "break", "const", "continue", "else", "for", "function", "if", "import",
                       "let", "loop", "package", "namespace", "return", "var", "void", "while", "null"})
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "`": "`", "?": "?", "a": "\a", "b": "\b", "f": "\f",
            "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


@dataclass(frozen=True)
class _Tok:
    kind: str  # num, str, ident, op, end
    text: str
    value: Any = None


def _lex(expr: str) -> list[_Tok]:
    out: list[_Tok] = []
    i = 0
    while i < len(expr):
        m = _TOKEN.match(expr, i)
        if m is None:
            raise Unsupported(f"unexpected character {expr[i]!r} at offset {i}")
        kind = m.lastgroup or ""
        text = m.group()
        if kind == "ws":
            i = m.end()
            continue
        if kind == "str":
            raw = text[0] in "rR"
            quote = text[1:] if raw else text
            if len(quote) == 3:
                raise Unsupported("triple-quoted strings")
            value, i = _read_string(expr, m.end(), quote, raw)
            out.append(_Tok("str", expr[m.start():i], value))
            continue
        if kind == "num":
            if text[-1] in "uU":
                raise Unsupported(f"unsigned integer literal {text}")
            if text[:2] in ("0x", "0X"):
                number = int(text, 16)
            elif "." in text or "e" in text or "E" in text:
                raise Unsupported(f"floating-point literal {text}")
            else:
                number = int(text)
            out.append(_Tok("num", text, number))
        elif kind == "ident" and text in _RESERVED:
            raise Unsupported(f"{text!r}")
        else:
            out.append(_Tok(kind, text))
        i = m.end()
    out.append(_Tok("end", ""))
    return out


def _read_string(expr: str, i: int, quote: str, raw: bool) -> tuple[str, int]:
    chars: list[str] = []
    while i < len(expr):
        c = expr[i]
        if c == quote:
            return "".join(chars), i + 1
        if c == "\n":
            break
        if c == "\\" and not raw:
            if i + 1 >= len(expr):
                break
            e = expr[i + 1]
            if e in _ESCAPES:
                chars.append(_ESCAPES[e])
                i += 2
                continue
            width = {"x": 2, "X": 2, "u": 4, "U": 8}.get(e)
            if width is not None:
                digits = expr[i + 2:i + 2 + width]
                if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                    raise Unsupported(f"bad escape in string literal at offset {i}")
                chars.append(chr(int(digits, 16)))
                i += 2 + width
                continue
            if e in "0123":
                digits = expr[i + 1:i + 4]
                if len(digits) != 3 or not all(d in "01234567" for d in digits):
                    raise Unsupported(f"bad escape in string literal at offset {i}")
                chars.append(chr(int(digits, 8)))
                i += 4
                continue
            raise Unsupported(f"bad escape in string literal at offset {i}")
        chars.append(c)
        i += 1
    raise Unsupported("unterminated string literal")


# -- parser: text -> closures -------------------------------------------------

_Eval = Callable[[CelDevice], _Val]
_RELATIONS = ("==", "!=", "<", "<=", ">", ">=")


class _Parser:
    """Recursive descent over CEL's grammar (cel-spec langdef): conditional
    < || < && < relations < addition < multiplication < unary < member.
    Each rule returns a closure over the device; unsupported constructs
    raise Unsupported as soon as they are parsed."""

    def __init__(self, expr: str) -> None:
        self.toks = _lex(expr)
        self.pos = 0

    def peek(self, *texts: str) -> bool:
        t = self.toks[self.pos]
        return t.kind in ("op", "ident") and t.text in texts

    def take(self) -> _Tok:
        t = self.toks[self.pos]
        self.pos += 1
        return t

    def expect(self, text: str) -> None:
        t = self.take()
        if t.text != text or t.kind not in ("op", "ident"):
            raise Unsupported(f"expected {text!r}, found {t.text or 'the end'!r}")

    def parse(self) -> _Eval:
        node = self.expr()
        if self.toks[self.pos].kind != "end":
            raise Unsupported(f"unexpected {self.toks[self.pos].text!r}")
        return node

    def expr(self) -> _Eval:
        node = self.or_()
        if self.peek("?"):
            raise Unsupported("the conditional operator ?:")
        return node

    def or_(self) -> _Eval:
        node = self.and_()
        while self.peek("||"):
            self.take()
            node = _or(node, self.and_())
        return node

    def and_(self) -> _Eval:
        node = self.relation()
        while self.peek("&&"):
            self.take()
            node = _and(node, self.relation())
        return node

    def relation(self) -> _Eval:
        node = self.addition()
        while self.peek(*_RELATIONS, "in"):
            op = self.take().text
            start = self.pos
            right = self.addition()
            spelled = [t.text for t in self.toks[start:self.pos]]
            if op == "in" and spelled in (["device", ".", "attributes"], ["device", ".", "capacity"]):
                raise Unsupported(f"'in' on device.{spelled[2]} itself (use has(device.{spelled[2]}[domain].name))")
            node = _relation(op, node, right)
        return node

    def addition(self) -> _Eval:
        node = self.unary()
        if self.peek("+", "-", "*", "/", "%"):
            raise Unsupported(f"arithmetic ({self.toks[self.pos].text})")
        return node

    def unary(self) -> _Eval:
        if self.peek("!"):
            self.take()
            return _not(self.unary())
        if self.peek("-"):
            self.take()
            t = self.take()
            if t.kind != "num":
                raise Unsupported("negation of anything but an integer literal")
            value = -t.value
            return lambda d: value
        return self.member()

    def member(self) -> _Eval:
        node, path, _ = self.member_parts()
        if path == ("device",):
            raise Unsupported("device used as a value")
        return node

    def member_parts(self) -> tuple[_Eval, tuple[str, ...] | None, tuple[tuple[str, ...] | None, str] | None]:
        """The member expression, its path from `device` where it has one
        (("device", "attributes", "[]") for device.attributes[...]), and,
        when its last step selects a field, that step's (target path, name):
        what has() needs to know."""
        node, path = self.primary()
        last: tuple[tuple[str, ...] | None, str] | None = None
        while True:
            if self.peek("."):
                self.take()
                t = self.take()
                if t.kind != "ident":
                    raise Unsupported(f"field name expected after '.', found {t.text!r}")
                if self.peek("("):
                    node, path, last = self.method(node, t.text), None, None
                    continue
                last = (path, t.text)
                if path == ("device",):
                    getter = _DEVICE_FIELDS.get(t.text)
                    if getter is None:
                        raise Unsupported(f"device.{t.text} (a device has driver, attributes, capacity and "
                                          "allowMultipleAllocations)")
                    node, path = getter, ("device", t.text)
                else:
                    node, path = _field(node, t.text), (path + (t.text,) if path is not None else None)
            elif self.peek("["):
                self.take()
                key = self.expr()
                self.expect("]")
                node, path, last = _index(node, key), (path + ("[]",) if path is not None else None), None
            elif self.peek("?"):
                raise Unsupported("optional field selection or the conditional operator")
            else:
                return node, path, last

    def method(self, target: _Eval, name: str) -> _Eval:
        impl = _METHODS.get(name)
        if impl is None:
            raise Unsupported(f"the function {name}()")
        args = self.args()
        arity, fn = impl
        if len(args) != arity:
            raise Unsupported(f"{name}() with {len(args)} arguments")
        return _call(fn, [target, *args])

    def args(self) -> list[_Eval]:
        self.expect("(")
        out: list[_Eval] = []
        if not self.peek(")"):
            out.append(self.expr())
            while self.peek(","):
                self.take()
                out.append(self.expr())
        self.expect(")")
        return out

    def primary(self) -> tuple[_Eval, tuple[str, ...] | None]:
        t = self.take()
        if t.kind == "num":
            value = t.value
            if value > 2**63 - 1:
                raise Unsupported(f"integer literal {t.text} beyond int64")
            return (lambda d: value), None
        if t.kind == "str":
            s = t.value
            return (lambda d: s), None
        if t.kind == "op" and t.text == "(":
            node = self.expr()
            self.expect(")")
            return node, None
        if t.kind == "op" and t.text == "[":
            items: list[_Eval] = []
            if not self.peek("]"):
                items.append(self.expr())
                while self.peek(","):
                    self.take()
                    items.append(self.expr())
            self.expect("]")
            return _list(items), None
        if t.kind == "ident":
            if t.text in ("true", "false"):
                b = t.text == "true"
                return (lambda d: b), None
            if t.text == "device":
                return (lambda d: d), ("device",)
            if t.text == "has" and self.peek("("):
                return self.has(), None
            if self.peek("("):
                fn = _FUNCTIONS.get(t.text)
                if fn is None:
                    raise Unsupported(f"the function {t.text}()")
                args = self.args()
                arities, impl = fn
                if len(args) not in arities:
                    raise Unsupported(f"{t.text}() with {len(args)} arguments")
                return _call(impl, args), None
            raise Unsupported(f"the variable {t.text!r} (only device is declared)")
        raise Unsupported(f"unexpected {t.text or 'end of expression'!r}")

    def has(self) -> _Eval:
        """has(device.attributes[d].name): is the name in that domain's map.
        Only on a domain's map: what has() says of the outer maps, whose
        unknown keys read as empty maps, is not this subset's to guess."""
        self.expect("(")
        node, path, last = self.member_parts()
        self.expect(")")
        if last is None or last[0] not in (("device", "attributes", "[]"), ("device", "capacity", "[]")):
            raise Unsupported("has() of anything but device.attributes[domain].name or "
                              "device.capacity[domain].name")
        target = _target_of(node)
        return _has(target, last[1])


# -- evaluation helpers ---------------------------------------------------------


def _is_err(v: _Val) -> bool:
    return isinstance(v, EvalError)


def _type_name(v: _Val) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, str):
        return "string"
    if isinstance(v, Semver):
        return "kubernetes.Semver"
    if isinstance(v, Quantity):
        return "kubernetes.Quantity"
    if isinstance(v, tuple):
        return "list"
    if isinstance(v, (_Map, _Domains)):
        return "map"
    return type(v).__name__


def _no_overload(op: str, *vals: _Val) -> EvalError:
    return EvalError(f"no such overload: {op}({', '.join(_type_name(v) for v in vals)})")


def _and(a: _Eval, b: _Eval) -> _Eval:
    def run(d: CelDevice) -> _Val:
        x, y = a(d), b(d)
        if x is False or y is False:
            return False
        if x is True and y is True:
            return True
        for v in (x, y):
            if _is_err(v):
                return v
        return _no_overload("_&&_", x, y)
    return run


def _or(a: _Eval, b: _Eval) -> _Eval:
    def run(d: CelDevice) -> _Val:
        x, y = a(d), b(d)
        if x is True or y is True:
            return True
        if x is False and y is False:
            return False
        for v in (x, y):
            if _is_err(v):
                return v
        return _no_overload("_||_", x, y)
    return run


def _not(a: _Eval) -> _Eval:
    def run(d: CelDevice) -> _Val:
        x = a(d)
        if isinstance(x, bool):
            return not x
        return x if _is_err(x) else _no_overload("!_", x)
    return run


def _equal(x: _Val, y: _Val) -> _Val:
    """cel-go's `types.Equal`: x.Equal(y)."""
    if isinstance(x, Semver):
        return x == y if isinstance(y, Semver) else _no_overload("_==_", x, y)
    if isinstance(x, bool) or isinstance(y, bool):
        return isinstance(x, bool) and isinstance(y, bool) and x == y
    if isinstance(x, int):
        return isinstance(y, int) and x == y
    if isinstance(x, (str, Quantity)):
        return type(x) is type(y) and x == y
    if isinstance(x, tuple):
        if not isinstance(y, tuple):
            return False
        if len(x) != len(y):
            return False
        for a, b in zip(x, y):
            e = _equal(a, b)
            if e is not True:
                return e
        return True
    if isinstance(x, _Map):
        if not isinstance(y, _Map):
            return False
        if x.items.keys() != y.items.keys():
            return False
        for k, v in x.items.items():
            e = _equal(v, y.items[k])
            if e is not True:
                return e
        return True
    return _no_overload("_==_", x, y)


def _compare(op: str, x: _Val, y: _Val) -> _Val:
    same = (isinstance(x, bool) and isinstance(y, bool)) or (
        type(x) is int and type(y) is int) or (isinstance(x, str) and isinstance(y, str))
    if not same:
        return _no_overload(f"_{op}_", x, y)
    if op == "<":
        return bool(x < y)
    if op == "<=":
        return bool(x <= y)
    if op == ">":
        return bool(x > y)
    return bool(x >= y)


def _relation(op: str, a: _Eval, b: _Eval) -> _Eval:
    def run(d: CelDevice) -> _Val:
        x, y = a(d), b(d)
        if _is_err(x):
            return x
        if _is_err(y):
            return y
        if op == "==":
            return _equal(x, y)
        if op == "!=":
            e = _equal(x, y)
            return e if _is_err(e) else not e
        if op == "in":
            return _in(x, y)
        return _compare(op, x, y)
    return run


def _in(x: _Val, y: _Val) -> _Val:
    if isinstance(y, tuple):
        err: EvalError | None = None
        for item in y:
            e = _equal(x, item)
            if e is True:
                return True
            if _is_err(e):
                err = e
        return err if err is not None else False
    if isinstance(y, _Map):
        if not isinstance(x, str):
            return _no_overload("@in", x, y)
        return x in y.items
    if isinstance(y, _Domains):
        raise Unsupported(f"'in' on device.{y.what} itself (use has(device.{y.what}[domain].name))")
    return _no_overload("@in", x, y)


def _list(items: list[_Eval]) -> _Eval:
    def run(d: CelDevice) -> _Val:
        vals = tuple(i(d) for i in items)
        for v in vals:
            if _is_err(v):
                return v
        return vals
    return run


def _lookup(target: _Val, key: _Val) -> _Val:
    if _is_err(target):
        return target
    if _is_err(key):
        return key
    if isinstance(target, _Domains):
        if not isinstance(key, str):
            return _no_overload("_[_]", target, key)
        return _Map(target.by_domain.get(key, {}))
    if isinstance(target, _Map):
        if not isinstance(key, str):
            return _no_overload("_[_]", target, key)
        if key not in target.items:
            return EvalError(f"no such key: {key}")
        value = target.items[key]
        return EvalError(value.message) if isinstance(value, BadValue) else value
    if isinstance(target, tuple):
        if type(key) is not int:
            return _no_overload("_[_]", target, key)
        if not 0 <= key < len(target):
            return EvalError(f"index out of bounds: {key}")
        return target[key]
    return _no_overload("_[_]", target, key)


def _index(target: _Eval, key: _Eval) -> _Eval:
    return lambda d: _lookup(target(d), key(d))


class _FieldSel:
    """target.name; keeps its target for has()."""

    __slots__ = ("target", "name")

    def __init__(self, target: _Eval, name: str) -> None:
        self.target = target
        self.name = name

    def __call__(self, d: CelDevice) -> _Val:
        t = self.target(d)
        if isinstance(t, (_Domains, _Map)) or _is_err(t):
            return _lookup(t, self.name)
        return EvalError(f"type '{_type_name(t)}' does not support field selection")


def _field(target: _Eval, name: str) -> _Eval:
    return _FieldSel(target, name)


def _target_of(node: _Eval) -> _Eval:
    assert isinstance(node, _FieldSel)
    return node.target


def _has(target: _Eval, name: str) -> _Eval:
    def run(d: CelDevice) -> _Val:
        t = target(d)
        if _is_err(t):
            return t
        if isinstance(t, _Map):
            return name in t.items
        return _no_overload("has", t)
    return run


def _domains(d: CelDevice, which: str) -> _Domains:
    source = d.attributes if which == "attributes" else d.capacity
    by: dict[str, dict[str, Any]] = {}
    for (domain, ident), value in source.items():
        by.setdefault(domain, {})[ident] = value
    return _Domains(by, which)


_DEVICE_FIELDS: dict[str, _Eval] = {
    "driver": lambda d: d.driver,
    "allowMultipleAllocations": lambda d: d.allow_multiple_allocations,
    "attributes": lambda d: _domains(d, "attributes"),
    "capacity": lambda d: _domains(d, "capacity"),
}


def _call(fn: Callable[..., _Val], args: list[_Eval]) -> _Eval:
    def run(d: CelDevice) -> _Val:
        vals = [a(d) for a in args]
        for v in vals:
            if _is_err(v):
                return v
        return fn(*vals)
    return run


# -- library functions ----------------------------------------------------------


def _semver_fn(text: _Val, normalize: _Val = False) -> _Val:
    if not isinstance(text, str) or not isinstance(normalize, bool):
        return _no_overload("semver", text, normalize)
    try:
        return parse_semver(normalize_semver(text) if normalize else text)
    except ValueError as e:
        return EvalError(str(e))


def _is_semver_fn(text: _Val, normalize: _Val = False) -> _Val:
    if not isinstance(text, str) or not isinstance(normalize, bool):
        return _no_overload("isSemver", text, normalize)
    return isinstance(_semver_fn(text, normalize), Semver)


def _quantity_fn(text: _Val) -> _Val:
    if not isinstance(text, str):
        return _no_overload("quantity", text)
    try:
        return parse_quantity_exact(text)
    except ValueError as e:
        return EvalError(str(e))


def _is_quantity_fn(text: _Val) -> _Val:
    if not isinstance(text, str):
        return _no_overload("isQuantity", text)
    return isinstance(_quantity_fn(text), Quantity)


def _ordered(name: str, pick: Callable[[int], _Val]) -> Callable[[_Val, _Val], _Val]:
    def fn(x: _Val, y: _Val) -> _Val:
        if isinstance(x, Semver) and isinstance(y, Semver):
            return pick(x.compare(y))
        if isinstance(x, Quantity) and isinstance(y, Quantity):
            return pick(x.compare(y))
        return _no_overload(name, x, y)
    return fn


def _semver_part(name: str, get: Callable[[Semver], int]) -> Callable[[_Val], _Val]:
    def fn(x: _Val) -> _Val:
        return get(x) if isinstance(x, Semver) else _no_overload(name, x)
    return fn


def _string2(name: str, op: Callable[[str, str], bool]) -> Callable[[_Val, _Val], _Val]:
    def fn(x: _Val, y: _Val) -> _Val:
        if isinstance(x, str) and isinstance(y, str):
            return op(x, y)
        return _no_overload(name, x, y)
    return fn


def _ascii(name: str, op: Callable[[str], str]) -> Callable[[_Val], _Val]:
    def fn(x: _Val) -> _Val:
        return op(x) if isinstance(x, str) else _no_overload(name, x)
    return fn


_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")

_FUNCTIONS: dict[str, tuple[tuple[int, ...], Callable[..., _Val]]] = {
    "semver": ((1, 2), _semver_fn),
    "isSemver": ((1, 2), _is_semver_fn),
    "quantity": ((1,), _quantity_fn),
    "isQuantity": ((1,), _is_quantity_fn),
}

# name -> (arguments besides the receiver, implementation taking the receiver first)
_METHODS: dict[str, tuple[int, Callable[..., _Val]]] = {
    "compareTo": (1, _ordered("compareTo", lambda c: c)),
    "isGreaterThan": (1, _ordered("isGreaterThan", lambda c: c > 0)),
    "isLessThan": (1, _ordered("isLessThan", lambda c: c < 0)),
    "major": (0, _semver_part("major", lambda s: s.major)),
    "minor": (0, _semver_part("minor", lambda s: s.minor)),
    "patch": (0, _semver_part("patch", lambda s: s.patch)),
    "startsWith": (1, _string2("startsWith", str.startswith)),
    "endsWith": (1, _string2("endsWith", str.endswith)),
    "contains": (1, _string2("contains", lambda a, b: b in a)),
    "lowerAscii": (0, _ascii("lowerAscii", lambda s: s.translate(_LOWER))),
    "upperAscii": (0, _ascii("upperAscii", lambda s: s.translate(_UPPER))),
}


# -- the compiled selector --------------------------------------------------------


@dataclass(frozen=True)
class Selector:
    """One compiled CEL selector, or why it cannot be evaluated here
    (`unsupported`, naming the expression)."""

    expression: str
    unsupported: str = ""
    _run: _Eval | None = None

    @property
    def supported(self) -> bool:
        return not self.unsupported

    def matches(self, device: CelDevice) -> bool | EvalError:
        """True or False as cel-go would answer for this device, or the
        EvalError it would raise. Never called on an unsupported selector."""
        if self._run is None:
            raise Unsupported(self.unsupported)
        for value in device.attributes.values():
            if isinstance(value, BadValue):
                return EvalError(value.message)  # DeviceMatches converts every attribute first
        try:
            result = self._run(device)
        except Unsupported as e:  # a construct only known to be outside the subset once typed
            return EvalError(f"CEL expression {self.expression!r} is outside gpuclaimctl's subset: {e}",
                             unsupported=True)
        if isinstance(result, bool) or isinstance(result, EvalError):
            return result
        return EvalError(f"CEL result of type {_type_name(result)} could not be converted to bool")


def compile_selector(expression: str) -> Selector:
    """The selector, compiled once (a DeviceClass is parsed when it changes,
    not per device)."""
    try:
        run = _Parser(expression).parse()
    except Unsupported as e:
        return Selector(expression, f"CEL expression {expression!r} is outside gpuclaimctl's subset: {e}")
    except RecursionError:
        return Selector(expression, f"CEL expression {expression!r} is nested too deeply")
    return Selector(expression, "", run)
