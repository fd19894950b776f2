"""pycni.record: the dataclass subset the one-shot start path uses instead of dataclasses."""

from __future__ import annotations

import sys
from typing import ClassVar

import pytest

from pycni.record import MISSING, FrozenInstanceError, field, fields, record


@record
class Point:
    x: int
    y: int = 0
    tags: list[str] = field(default_factory=list)
    note: str = field(default="", compare=False, repr=False)


@record(frozen=True)
class Key:
    name: str
    port: int = 80


@record
class Counted:
    LIMIT: ClassVar[int] = 3
    total: int = 0


@record
class Base:
    a: int
    b: str = "b"


@record
class Child(Base):
    c: float = 1.0


def test_init_positional_and_keyword() -> None:
    p = Point(1, 2, ["t"], "n")
    assert (p.x, p.y, p.tags, p.note) == (1, 2, ["t"], "n")
    q = Point(y=5, x=4)
    assert (q.x, q.y, q.tags, q.note) == (4, 5, [], "")
    r = Point(7, note="k")
    assert (r.x, r.y, r.note) == (7, 0, "k")


def test_defaults_stay_class_attributes_and_factories_give_fresh_objects() -> None:
    assert Point.y == 0 and Point.note == ""
    assert not hasattr(Point, "tags")  # a default_factory field has no class attribute, as in dataclasses
    a, b = Point(1), Point(1)
    a.tags.append("x")
    assert b.tags == [] and a.tags is not b.tags


def test_missing_argument_raises_type_error() -> None:
    with pytest.raises(TypeError, match="missing required argument: 'x'"):
        Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'name'"):
        Key(port=1)  # type: ignore[call-arg]


def test_unknown_keyword_raises_type_error() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        Point(1, z=3)  # type: ignore[call-arg]


def test_too_many_positional_arguments_raise_type_error() -> None:
    with pytest.raises(TypeError, match="takes 4 positional arguments but 5 were given"):
        Point(1, 2, [], "n", "extra")  # type: ignore[call-arg]


def test_duplicate_argument_raises_type_error() -> None:
    with pytest.raises(TypeError, match="multiple values for argument 'x'"):
        Point(1, x=2)  # type: ignore[misc]
    with pytest.raises(TypeError, match="multiple values for argument 'y'"):
        Point(1, 2, y=3)  # type: ignore[misc]


def test_repr_shows_fields_in_order_and_skips_repr_false() -> None:
    assert repr(Point(1, 2, ["t"], "hidden")) == "Point(x=1, y=2, tags=['t'])"
    assert repr(Key("k")) == "Key(name='k', port=80)"
    assert repr(Child(1)) == "Child(a=1, b='b', c=1.0)"


def test_eq_compares_fields_except_compare_false() -> None:
    assert Point(1, 2, ["t"], "one") == Point(1, 2, ["t"], "two")
    assert Point(1, 2) != Point(1, 3)
    assert Point(1, tags=["a"]) != Point(1, tags=["b"])


def test_eq_across_classes_is_not_implemented() -> None:
    @record
    class Other:
        x: int
        y: int = 0
        tags: list[str] = field(default_factory=list)

    p, o = Point(1), Other(1)
    assert p.__eq__(o) is NotImplemented
    assert p != o and o != p
    assert Base(1) != Child(1, "b")  # not even for a subclass with equal shared fields
    assert Point(1) != (1, 0, [])


def test_frozen_assignment_and_deletion_raise() -> None:
    k = Key("a")
    with pytest.raises(FrozenInstanceError):
        k.name = "b"  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        k.other = 1  # type: ignore[attr-defined]
    with pytest.raises(FrozenInstanceError):
        del k.port
    assert isinstance(FrozenInstanceError("x"), AttributeError)
    assert k.name == "a"


def test_frozen_records_hash_by_their_fields() -> None:
    assert hash(Key("a", 1)) == hash(Key("a", 1))
    assert {Key("a", 1), Key("a", 1), Key("b")} == {Key("a", 1), Key("b")}
    assert Key("a", 1) in {Key("a", 1): True}


def test_frozen_hash_ignores_compare_false_fields() -> None:
    @record(frozen=True)
    class Tagged:
        key: str
        note: str = field(default="", compare=False)

    assert Tagged("k", "one") == Tagged("k", "two")
    assert hash(Tagged("k", "one")) == hash(Tagged("k", "two"))


def test_mutable_records_are_unhashable() -> None:
    assert Point.__hash__ is None
    with pytest.raises(TypeError):
        hash(Point(1))


def test_own_hash_is_kept() -> None:
    @record
    class ById:
        ident: int

        def __hash__(self) -> int:
            return self.ident

    assert hash(ById(7)) == 7


def test_own_dunders_are_kept() -> None:
    @record
    class Custom:
        x: int = 0

        def __repr__(self) -> str:
            return "custom"

        def __eq__(self, other: object) -> bool:
            return True

    assert repr(Custom()) == "custom"
    assert Custom(1) == Custom(2)


def test_inheritance_puts_base_fields_first() -> None:
    c = Child(1, "x", 2.5)
    assert (c.a, c.b, c.c) == (1, "x", 2.5)
    assert [f.name for f in fields(Child)] == ["a", "b", "c"]
    assert [f.name for f in fields(Base)] == ["a", "b"]
    assert Child(1).b == "b" and Child(1).c == 1.0
    assert Child.__match_args__ == ("a", "b", "c")  # type: ignore[attr-defined]


def test_redefined_field_takes_the_new_default() -> None:
    @record
    class Redefined(Base):
        c: float = 1.0
        b: str = "child"

    assert Redefined(1).b == "child" and Base(1).b == "b"
    assert {f.name for f in fields(Redefined)} == {"a", "b", "c"}


def test_redefined_field_keeps_its_inherited_position() -> None:
    @record
    class Redefined(Base):
        c: float = 1.0
        b: str = "child"

    assert [f.name for f in fields(Redefined)] == ["a", "b", "c"]
    assert Redefined(1, "x", 2.0).b == "x"


def test_fields_of_class_and_instance() -> None:
    fs = fields(Point)
    assert [f.name for f in fs] == ["x", "y", "tags", "note"]
    assert fields(Point(1)) == fs
    assert fs[0].required and not fs[1].required and not fs[2].required
    assert fs[1].default == 0 and fs[2].default_factory is list and fs[2].default is MISSING
    assert fs[3].compare is False and fs[3].repr is False


def test_classvar_is_not_a_field() -> None:
    assert [f.name for f in fields(Counted)] == ["total"]
    assert Counted.LIMIT == 3
    with pytest.raises(TypeError):
        Counted(1, 2)  # type: ignore[call-arg]


def test_non_default_after_default_raises_at_class_creation() -> None:
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
        @record
        class Bad:
            a: int = 0
            b: int  # type: ignore[misc]

    with pytest.raises(TypeError, match="non-default argument 'c'"):
        @record
        class BadChild(Base):
            c: int  # type: ignore[misc]


def test_default_and_default_factory_are_exclusive() -> None:
    with pytest.raises(ValueError):
        field(default=1, default_factory=list)


def test_post_init_runs_after_fields_are_set() -> None:
    @record
    class WithPost:
        x: int
        doubled: int = 0

        def __post_init__(self) -> None:
            self.doubled = self.x * 2

    assert WithPost(3).doubled == 6


def test_importing_record_does_not_import_dataclasses_or_typing() -> None:
    import subprocess

    script = ("import sys; import pycni.record; "
              "print(' '.join(m for m in ('dataclasses', 'inspect', 'typing') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path[:0] = {sys.path!r}; {script}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


def test_mutable_plain_default_is_refused() -> None:
    with pytest.raises(ValueError, match="default_factory"):
        @record
        class Shared:
            items: list[int] = []  # noqa: RUF012 - the mistake under test


def test_deep_copy_is_deepcopy_for_a_result_without_the_copy_module() -> None:
    """Result.copy (bandwidth's and tuning's ADD) goes through record.deep_copy: what
    copy.deepcopy makes (equal, independent, sharing kept), without importing copy."""
    import copy
    import subprocess

    from pycni import ipaddr
    from pycni.record import deep_copy
    from pycni.spec.types import Result

    raw = ('{"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "mac": "0a:58:0a:00:00:02", '
           '"sandbox": "/run/netns/x"}], "ips": [{"address": "10.0.0.2/24", "gateway": "10.0.0.1", '
           '"interface": 0}, {"address": "fd00::2/64", "interface": 0}], "routes": [{"dst": "0.0.0.0/0", '
           '"gw": "10.0.0.1"}], "dns": {"nameservers": ["10.0.0.53"], "search": ["a.example"]}}')
    original = Result.from_json(raw)
    mine, theirs = original.copy(), copy.deepcopy(original)
    assert mine == theirs == original and mine is not original
    assert mine.to_json() == original.to_json()
    mine.interfaces[0].mac = "0a:58:0a:00:00:09"
    mine.ips.append(mine.ips[0])
    mine.dns.nameservers.append("10.0.0.54")
    assert original.interfaces[0].mac == "0a:58:0a:00:00:02" and len(original.ips) == 2
    assert original.dns.nameservers == ["10.0.0.53"]
    # IP values are immutable: shared, not copied
    assert mine.ips[0].address is original.ips[0].address
    assert copy.deepcopy(ipaddr.ip_network("10.0.0.0/24")) == ipaddr.ip_network("10.0.0.0/24")
    # an object reached twice is copied once, as deepcopy keeps it
    box = Point(1, tags=["a"])
    pair = deep_copy([box, box, {"k": (box, 2)}])
    assert pair[0] is pair[1] is pair[2]["k"][0] and pair[0] is not box and pair[0] == box
    # and the copy module stays unimported on that path
    code = ("import sys; from pycni.spec.types import Result; "
            f"Result.from_json({raw!r}).copy(); print('copy' in sys.modules)")
    out = subprocess.run([sys.executable, "-IS", "-c", f"import sys; sys.path[:0] = {sys.path!r}; {code}"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
