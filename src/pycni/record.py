"""``@record``: the part of ``@dataclass`` pycni uses, without importing :mod:`dataclasses`.

Why: ``import dataclasses`` pulls in :mod:`inspect` (and with it ``ast``, ``dis``, ``tokenize``…),
about 20 ms, and every decorated class costs another ~0.5 ms of generated-code ``exec``. A
one-shot plugin process pays that on every CNI call, for classes that only need an
``__init__``, a ``__repr__`` and an ``__eq__``. This decorator builds those from the class's
annotations with plain closures — no ``exec``, no ``inspect`` — in a few microseconds.

Supported: fields with and without defaults, ``field(default=, default_factory=, compare=,
repr=)``, ``frozen=True`` (assignment raises, instances hash by their compared fields),
inheritance from another record, and ``ClassVar`` annotations (skipped). Type checkers see it
as a dataclass through :pep:`681` ``dataclass_transform``.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot process ~4 ms
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar, dataclass_transform

    T = TypeVar("T")
else:
    def dataclass_transform(**_kw):  # type: ignore[no-untyped-def]
        return lambda fn: fn


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class FrozenInstanceError(AttributeError):
    """Assignment to a field of a frozen record (the dataclasses exception's counterpart)."""


class Field:
    """One field's settings, as :func:`field` returns them (and as stored in ``__record_fields__``)."""

    __slots__ = ("name", "default", "default_factory", "compare", "repr")

    def __init__(self, default: Any = MISSING, default_factory: Any = MISSING, compare: bool = True,
                 repr: bool = True) -> None:  # noqa: A002 - the dataclasses keyword
        if default is not MISSING and default_factory is not MISSING:
            raise ValueError("cannot specify both default and default_factory")
        self.name = ""
        self.default = default
        self.default_factory = default_factory
        self.compare = compare
        self.repr = repr

    @property
    def required(self) -> bool:
        return self.default is MISSING and self.default_factory is MISSING


def field(*, default: Any = MISSING, default_factory: Any = MISSING, compare: bool = True,
          repr: bool = True) -> Any:  # noqa: A002 - the dataclasses keyword
    """Per-field settings, as :func:`dataclasses.field` (the subset pycni uses)."""
    return Field(default, default_factory, compare, repr)


def fields(obj: Any) -> tuple[Field, ...]:
    """The fields of a record class or instance, in declaration order."""
    return tuple(obj.__record_fields__)


def _is_classvar(annotation: Any) -> bool:
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar"))


def _collect(cls: type) -> list[Field]:
    """Inherited fields first (a redefinition keeps its place), then the class's own."""
    by_name: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        for f in base.__dict__.get("__record_fields__", ()):
            by_name[f.name] = f
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if _is_classvar(annotation):
            continue
        value = cls.__dict__.get(name, MISSING)
        f = value if isinstance(value, Field) else Field(default=value)
        f.name = name
        if isinstance(value, Field):  # leave the plain default as the class attribute, like dataclasses
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        if isinstance(f.default, list | dict | set):
            raise ValueError(f"mutable default {type(f.default).__name__} for field {name!r} of {cls.__name__}: "
                             "use field(default_factory=...)")
        by_name[name] = f  # a redefined inherited field keeps its place, as in dataclasses
    seen_default = False
    for f in by_name.values():
        if f.required and seen_default:
            raise TypeError(f"non-default argument {f.name!r} follows default argument in {cls.__name__}")
        seen_default = seen_default or not f.required
    return list(by_name.values())


def _make_init(cls: type, specs: list[Field], frozen: bool) -> Callable[..., None]:
    names = tuple(f.name for f in specs)
    index = {n: i for i, n in enumerate(names)}
    setter = object.__setattr__ if frozen else None
    qualname = cls.__qualname__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(names):
            raise TypeError(f"{qualname}() takes {len(names)} positional arguments but {len(args)} were given")
        values: list[Any] = list(args) + [MISSING] * (len(names) - len(args))
        for key, value in kwargs.items():
            i = index.get(key)
            if i is None:
                raise TypeError(f"{qualname}() got an unexpected keyword argument {key!r}")
            if i < len(args):
                raise TypeError(f"{qualname}() got multiple values for argument {key!r}")
            values[i] = value
        for f, value in zip(specs, values, strict=True):
            if value is MISSING:
                if f.default is not MISSING:
                    value = f.default
                elif f.default_factory is not MISSING:
                    value = f.default_factory()
                else:
                    raise TypeError(f"{qualname}() missing required argument: {f.name!r}")
            if setter is not None:
                setter(self, f.name, value)
            else:
                setattr(self, f.name, value)
        post = getattr(self, "__post_init__", None)
        if post is not None:
            post()

    __init__.__qualname__ = f"{qualname}.__init__"
    return __init__


@dataclass_transform(field_specifiers=(field, Field))
def record(cls: Any = None, /, *, frozen: bool = False) -> Any:
    """Class decorator: ``__init__``, ``__repr__``, ``__eq__`` (and, frozen, ``__hash__``) from annotations."""

    def wrap(klass: type[T]) -> type[T]:
        specs = _collect(klass)
        k: Any = klass  # assigned dunders below; Any keeps type checkers out of the way
        shown = tuple(f.name for f in specs if f.repr)
        compared = tuple(f.name for f in specs if f.compare)
        k.__record_fields__ = tuple(specs)
        k.__match_args__ = tuple(f.name for f in specs)  # type: ignore[misc]
        if "__init__" not in klass.__dict__:
            k.__init__ = _make_init(klass, specs, frozen)
        if "__repr__" not in klass.__dict__:
            def __repr__(self: Any) -> str:
                inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in shown)
                return f"{type(self).__qualname__}({inner})"
            k.__repr__ = __repr__
        own_hash = klass.__dict__.get("__hash__", None) is not None
        if "__eq__" not in klass.__dict__:
            def __eq__(self: Any, other: Any) -> Any:
                if other.__class__ is not self.__class__:
                    return NotImplemented
                return all(getattr(self, n) == getattr(other, n) for n in compared)
            k.__eq__ = __eq__
        if frozen:
            def __setattr__(self: Any, name: str, value: Any) -> None:
                raise FrozenInstanceError(f"cannot assign to field {name!r}")

            def __delattr__(self: Any, name: str) -> None:
                raise FrozenInstanceError(f"cannot delete field {name!r}")

            def __hash__(self: Any) -> int:
                return hash(tuple(getattr(self, n) for n in compared))
            k.__setattr__ = __setattr__
            k.__delattr__ = __delattr__
            if not own_hash:
                k.__hash__ = __hash__
        elif not own_hash:
            k.__hash__ = None  # mutable and comparable: unhashable, as dataclasses
        return klass

    return wrap if cls is None else wrap(cls)


_SHARED = (str, int, float, bool, bytes, type(None))


def deep_copy(value: Any, memo: dict[int, Any] | None = None) -> Any:
    """What :func:`copy.deepcopy` makes of records and what they hold, without importing copy.

    Why: ``copy`` (with weakref) costs a one-shot call ~1.6 ms, and bandwidth's and tuning's ADD
    copy their previous result. Records are copied attribute by attribute (their whole instance
    dict, as deepcopy does), lists, tuples, dicts and sets item by item; an object reached twice
    is copied once (``memo``, as deepcopy keeps sharing); str, numbers, bytes and None are
    shared, and a type with ``__deepcopy__`` (pycni.ipaddr's immutable values) decides for
    itself. Anything else goes to :func:`copy.deepcopy`.
    """
    if isinstance(value, _SHARED):
        return value
    if memo is None:
        memo = {}
    key = id(value)
    if key in memo:
        return memo[key]
    cls: Any = type(value)
    out: Any
    if cls is list:
        out = memo[key] = []
        out.extend(deep_copy(v, memo) for v in value)
    elif cls is dict:
        out = memo[key] = {}
        for k, v in value.items():
            out[deep_copy(k, memo)] = deep_copy(v, memo)
    elif cls is tuple or cls is set or cls is frozenset:
        out = memo[key] = cls(deep_copy(v, memo) for v in value)
    elif getattr(cls, "__deepcopy__", None) is not None:
        out = memo[key] = value.__deepcopy__(memo)
    elif getattr(cls, "__record_fields__", None) is not None and not hasattr(cls, "__slots__"):
        out = memo[key] = cls.__new__(cls)
        for name, v in vars(value).items():
            object.__setattr__(out, name, deep_copy(v, memo))
    else:
        import copy

        out = memo[key] = copy.deepcopy(value)
    return out


__all__ = ["record", "field", "fields", "Field", "MISSING", "FrozenInstanceError", "deep_copy"]
