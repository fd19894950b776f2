"""pycni.ipaddr against the stdlib's ipaddress (CPython 3.11), value by value.

pycni.ipaddr replaces ipaddress on every path (it spares each one-shot plugin ~3.4 ms of imports),
so it must accept and refuse the same strings with the same messages (they reach CNI error
details), print the same text, and compare and hash equal to the stdlib's objects of the same
value in both directions. Each case runs the same call on both modules and compares the outcome:
the result (through str/repr/int/bool), or the exception's class name and message.
"""

# ruff: noqa: B023 - every lambda here is called at once, inside the loop iteration that made it

from __future__ import annotations

import ipaddress as std
import itertools
import pickle
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest

from pycni import ipaddr as our

SEED = 20261126


def _outcome(f: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", f()
    except Exception as e:  # noqa: BLE001 - the class and message are what is compared
        return "error", (type(e).__name__, str(e))


def _norm(value: Any) -> Any:
    """A comparable shape of a result: IP objects by class name and text, containers element-wise."""
    if isinstance(value, (list, tuple)):
        return [_norm(v) for v in value]
    if hasattr(value, "_version"):
        return (type(value).__name__, str(value), repr(value))
    return value


def same(ours: Callable[[], Any], theirs: Callable[[], Any], message: bool = True) -> Any:
    """Both calls give the same result or raise the same error (``message``: with the same text).

    Returns both results, or None if both raised.
    """
    a, b = _outcome(ours), _outcome(theirs)
    assert a[0] == b[0], (a, b)
    if a[0] == "error":
        assert a[1] == b[1] if message else a[1][0] == b[1][0], (a, b)
        return None
    assert _norm(a[1]) == _norm(b[1]), (a[1], b[1])
    return a[1], b[1]


# ---- the corpus --------------------------------------------------------------------------------

EDGE = ["0.0.0.0", "255.255.255.255", "127.0.0.1", "1.2.3.4", "10.0.0.1", "169.254.1.1", "224.0.0.1",
        "::", "::1", "1::", "::ffff:1.2.3.4", "::ffff:102:304", "::1.2.3.4", "fe80::1", "fe80::1%eth0",
        "fe80::%2", "ff02::1", "2001:db8::", "2001:db8:0:0:1:0:0:1", "2001:0:0:1:0:0:0:1", "1:0:0:2:0:0:3:4",
        "0:0:1:0:0:1:0:0", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8", "1:2:3:4:5:6::8",
        "FFFF:FFFF:FFFF:FFFF:FFFF:FFFF:FFFF:FFFF", "1:2:3:4:5:6:1.2.3.4", "::ffff:0:0",
        # refusals of every kind
        "", " ", "1.2.3", "1.2.3.4.5", "01.2.3.4", "1.2.3.04", "1.2.3.256", "1.2.3.1000", "1.2..4", "1.2.3.-4",
        "1.2.3.4 ", "١.2.3.4", "1.2.3.²", "a.b.c.d", "1.2.3.0x1", ":", "::1::", ":::", "1:2", ":1:2:3:4:5:6:7",
        "1:2:3:4:5:6:7:", "1:2:3:4:5:6:7:8:9", "1:2:3:4:5:6:7:8::", "::1:2:3:4:5:6:7:8", "12345::", "g::",
        "1::2::3", ":1::2", "1::2:", "::1.2.3", "::1.2.3.256", "::01.2.3.4", "1.2.3.4::", "fe80::1%", "fe80::1%a%b",
        "%eth0", "1.2.3.4%eth0", "::/", "1.2.3.4/", "1.2.3.4/24/8", "1:2:3:4:5:6:7:8:1.2.3.4",
        "1:2:3:4:5:6:7:1.2.3.4", "::ffff:1.2.3.4%z", "0x1.2.3.4", "+1.2.3.4", "1_0.2.3.4", "::_1"]
PREFIXES = ["", "/0", "/1", "/8", "/16", "/24", "/31", "/32", "/33", "/64", "/96", "/127", "/128", "/129", "/08",
            "/-1", "/ 8", "/x", "/255.255.255.0", "/255.255.0.0", "/0.0.0.255", "/0.255.255.255", "/255.0.255.0",
            "/255.255.255.255", "/0.0.0.0", "/1.2.3", "/ff00::", "/٣", "/24/"]


def _random_v4(rng: random.Random) -> str:
    return ".".join(str(rng.choice((0, 1, 10, 127, 255, rng.randrange(256)))) for _ in range(4))


def _random_v6(rng: random.Random) -> str:
    groups = [rng.choice((0, 0, 0, 1, 0xFFFF, rng.randrange(0x10000))) for _ in range(8)]
    if rng.random() < 0.2:
        v4 = _random_v4(rng)
        words = [f"{g:x}" for g in groups[:6]] + [v4]
    else:
        words = [rng.choice((f"{g:x}", f"{g:X}", f"{g:04x}")) for g in groups]
    text = ":".join(words)
    zero_runs = [i for i in range(len(words)) if words[i] in ("0", "0000")]
    if zero_runs and rng.random() < 0.7:  # compress one run of zero groups ourselves, not always the longest
        start = rng.choice(zero_runs)
        end = start
        while end + 1 < len(words) and words[end + 1] in ("0", "0000") and rng.random() < 0.8:
            end += 1
        text = ":".join(words[:start]) + "::" + ":".join(words[end + 1:])
    if rng.random() < 0.05:
        text += "%" + rng.choice(("eth0", "1", "x%y", ""))
    return text


def _mutate(rng: random.Random, text: str) -> str:
    alphabet = "0123456789abcdefABCDEFg:.%/ x-_"
    i = rng.randrange(len(text) + 1)
    op = rng.randrange(3)
    if op == 0:
        return text[:i] + rng.choice(alphabet) + text[i:]
    if op == 1:
        return text[:i] + text[i + 1:]
    return text[:i] + text[i:i + 3] + text[i:]


def corpus(n: int = 3000) -> list[str]:
    rng = random.Random(SEED)
    out = list(EDGE)
    for _ in range(n):
        text = _random_v4(rng) if rng.random() < 0.45 else _random_v6(rng)
        out.append(_mutate(rng, text) if rng.random() < 0.3 else text)
    return out


TEXTS = corpus()
INTS = [0, 1, 255, 2**32 - 1, 2**32, 2**48, 2**128 - 1, 2**128, -1, 0xFFFF << 32 | 0x01020304]
BYTES = [b"\x01\x02\x03\x04", b"\x00" * 16, b"\xff" * 16, b"\x01\x02\x03", b"\x01" * 5, b""]


def _address_attrs(a: Any, s: Any) -> None:
    for attr in ("version", "max_prefixlen", "packed", "compressed", "is_multicast", "is_loopback",
                 "is_link_local", "is_unspecified"):
        same(lambda: getattr(a, attr), lambda: getattr(s, attr))
    if "%" not in str(s):  # 3.11 itself cannot explode a scoped address (it re-parses str())
        same(lambda: a.exploded, lambda: s.exploded)
    if s.version == 6:
        same(lambda: a.ipv4_mapped, lambda: s.ipv4_mapped)
        same(lambda: a.scope_id, lambda: s.scope_id)
    assert int(a) == int(s)
    for fmt in ("", "s", ">50s", "b", "x", "X", "n", "#x", "_b", "#_X", "q", "#n"):
        same(lambda: format(a, fmt), lambda: format(s, fmt))
    for k in (1, -1, 255, 2**32, 2**128):
        same(lambda: a + k, lambda: s + k)
        same(lambda: a - k, lambda: s - k)
    same(lambda: a + 1.0, lambda: s + 1.0)


def _check_interop(a: Any, s: Any) -> None:
    """Equal both ways, same hash, pickled and back as the stdlib's (which drops a scope id)."""
    assert a == s and s == a and not (a != s) and not (s != a)
    assert hash(a) == hash(s)
    assert {a: 1}[s] == 1 and {s: 1}[a] == 1
    same(lambda: pickle.loads(pickle.dumps(a)), lambda: pickle.loads(pickle.dumps(s)))


# Each of ours beside the stdlib's: the factory, then the IPv4 and IPv6 classes.
ADDRESS_MAKERS = ((our.ip_address, std.ip_address), (our.IPv4Address, std.IPv4Address),
                  (our.IPv6Address, std.IPv6Address))
NETWORK_MAKERS = ((our.ip_network, std.ip_network), (our.IPv4Network, std.IPv4Network),
                  (our.IPv6Network, std.IPv6Network))
INTERFACE_MAKERS = ((our.ip_interface, std.ip_interface), (our.IPv4Interface, std.IPv4Interface),
                    (our.IPv6Interface, std.IPv6Interface))


def made_alike(makers: Sequence[tuple[Callable[..., Any], Callable[..., Any]]], args: tuple[Any, ...],
               attrs: Callable[[Any, Any], None]) -> int:
    """How many (ours, stdlib) pairs of ``makers`` make a value of ``args``: each call pair gives the
    same result or the same error (:func:`same`), and each value made is compared by ``attrs`` and
    :func:`_check_interop`."""
    made = 0
    for ours, theirs in makers:
        r = same(lambda: ours(*args), lambda: theirs(*args))
        if r is not None:
            made += 1
            attrs(*r)
            _check_interop(*r)
    return made


@pytest.mark.parametrize("chunk", range(4))
def test_addresses_parse_print_and_compare_as_the_stdlib(chunk: int) -> None:
    made = sum(made_alike(ADDRESS_MAKERS, (text,), _address_attrs) for text in TEXTS[chunk::4])
    assert made > 500


def test_addresses_from_ints_and_bytes() -> None:
    for value in [*INTS, *BYTES, 1.5, None, [1], our.IPv4Address("1.2.3.4"), std.IPv4Address("1.2.3.4"),
                  our.ip_interface("1.2.3.4/24")]:
        made_alike(ADDRESS_MAKERS, (value,), _address_attrs)


def _network_attrs(n: Any, s: Any) -> None:
    for attr in ("version", "max_prefixlen", "prefixlen", "network_address", "broadcast_address", "netmask",
                 "hostmask", "num_addresses", "with_prefixlen", "with_netmask", "with_hostmask", "compressed",
                 "is_multicast", "is_loopback", "is_link_local", "is_unspecified"):
        same(lambda: getattr(n, attr), lambda: getattr(s, attr))
    if "%" not in str(s):
        same(lambda: n.exploded, lambda: s.exploded)
    same(lambda: list(itertools.islice(n.hosts(), 5)), lambda: list(itertools.islice(s.hosts(), 5)))
    same(lambda: list(itertools.islice(n, 3)), lambda: list(itertools.islice(s, 3)))
    for i in (0, 1, 2, 255, 256, -1, -2, -256, -257):
        same(lambda: n[i], lambda: s[i])
    for kw in ({}, {"prefixlen_diff": 2}, {"new_prefix": 30}, {"new_prefix": 120}, {"prefixlen_diff": 0},
               {"prefixlen_diff": -1}, {"prefixlen_diff": 200}, {"new_prefix": 0},
               {"prefixlen_diff": 2, "new_prefix": 30}):
        same(lambda: list(itertools.islice(n.subnets(**kw), 4)), lambda: list(itertools.islice(s.subnets(**kw), 4)))
    for kw in ({}, {"prefixlen_diff": 3}, {"new_prefix": 8}, {"new_prefix": 100}, {"prefixlen_diff": 200},
               {"prefixlen_diff": 2, "new_prefix": 8}):
        same(lambda: n.supernet(**kw), lambda: s.supernet(**kw))


def _interface_attrs(i: Any, s: Any) -> None:
    _address_attrs(i, s)
    for attr in ("ip", "network", "netmask", "hostmask", "with_prefixlen", "with_netmask", "with_hostmask"):
        same(lambda: getattr(i, attr), lambda: getattr(s, attr))
    _check_interop(i.network, s.network)
    _check_interop(i.ip, s.ip)


def _with_prefixes(texts: Iterable[str]) -> list[str]:
    rng = random.Random(SEED + 1)
    out = []
    for t in texts:
        out.append(t + rng.choice(PREFIXES))
        if t in EDGE:
            out += [t + p for p in PREFIXES]
    return out


NET_TEXTS = _with_prefixes(TEXTS)


@pytest.mark.parametrize("chunk", range(4))
def test_networks_and_interfaces_as_the_stdlib(chunk: int) -> None:
    nets = ifaces = 0
    for text in NET_TEXTS[chunk::4]:
        for strict in (True, False):
            nets += made_alike(NETWORK_MAKERS, (text, strict), _network_attrs)
        ifaces += made_alike(INTERFACE_MAKERS, (text,), _interface_attrs)
    assert nets > 300 and ifaces > 300


def test_networks_from_tuples_ints_and_bytes() -> None:
    args: list[Any] = [*INTS, *BYTES, ("10.1.2.3", 24), ("10.1.2.0", "24"), ("10.1.2.0", "255.255.255.0"),
                       (167837696, 24), (b"\x0a\x01\x02\x00", 24), (our.IPv4Address("10.1.2.0"), 24),
                       ("10.1.2.0", 33), ("10.1.2.0", -1), ("10.1.2.0",), ("10.1.2.0", 24, 1), ("fd00::", 64),
                       ("fd00::1", 64), (2**100, 28), ("fd00::", "64"), ("fd00::", "ffff::"), ("fd00::", True),
                       our.ip_network("10.0.0.0/8"), std.ip_network("10.0.0.0/8"), our.ip_interface("10.1.2.3/8")]
    for arg in args:
        for strict in (True, False):
            made_alike(NETWORK_MAKERS, (arg, strict), _network_attrs)
        made_alike(INTERFACE_MAKERS, (arg,), _interface_attrs)


def _pairs(rng: random.Random, items: list[tuple[Any, Any]], n: int) -> Iterable[tuple[Any, Any, Any, Any]]:
    for _ in range(n):
        (a, sa), (b, sb) = rng.choice(items), rng.choice(items)
        yield a, sa, b, sb


def _objects(make: Callable[[Any], Any], theirs: Callable[[Any], Any], texts: Iterable[str]) -> list[tuple[Any, Any]]:
    out = []
    for t in texts:
        try:
            out.append((make(t), theirs(t)))
        except ValueError:
            pass
    return out


def test_ordering_containment_and_overlaps_as_the_stdlib() -> None:
    rng = random.Random(SEED + 2)
    small = ["10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "10.1.2.128/25", "0.0.0.0/0", "10.1.2.3/32", "11.0.0.0/8",
             "fd00::/8", "fd00::/64", "fd00::1/128", "::/0", "fe80::%eth0/64", "::ffff:0:0/96"]
    addrs = _objects(our.ip_address, std.ip_address, [t for t in TEXTS if len(t) < 20][:400]
                     + ["10.1.2.3", "10.1.2.200", "fd00::1", "fe80::1%eth0", "fe80::1"])
    nets = _objects(lambda t: our.ip_network(t, strict=False), lambda t: std.ip_network(t, strict=False),
                    small + NET_TEXTS[:600])
    ifaces = _objects(our.ip_interface, std.ip_interface, small + NET_TEXTS[:600])
    assert len(addrs) > 200 and len(nets) > 200 and len(ifaces) > 200
    ops: list[Callable[[Any, Any], Any]] = [lambda x, y: x == y, lambda x, y: x != y, lambda x, y: x < y,
                                            lambda x, y: x <= y, lambda x, y: x > y, lambda x, y: x >= y]
    for items in (addrs, nets, ifaces):
        for a, sa, b, sb in _pairs(rng, items, 3000):
            for op in ops:
                same(lambda: op(a, b), lambda: op(sa, sb))
                if "%" in str(sa) + str(sb):
                    continue  # 3.11's a <= b and b >= a differ on scope ids: mixing then picks one
                # ours against the stdlib's, both sides (Python may call the reflected operation, so
                # the two objects' order in a TypeError's text may differ)
                same(lambda: op(a, sb), lambda: op(sa, sb), message=False)
                same(lambda: op(sa, b), lambda: op(sa, sb), message=False)
        same(lambda: sorted(x for x, _ in items if x.version == 4),
             lambda: sorted(s for _, s in items if s.version == 4))
    mixed = addrs[:50] + nets[:50] + ifaces[:50]
    for a, sa, b, sb in _pairs(rng, mixed, 3000):
        for op in ops:
            same(lambda: op(a, b), lambda: op(sa, sb))
        if hasattr(sb, "network_address"):
            same(lambda: a in b, lambda: sa in sb)
    for a, sa, n, sn in _pairs(rng, addrs + ifaces + nets, 4000):
        if not hasattr(sn, "network_address"):
            continue
        same(lambda: a in n, lambda: sa in sn)
        same(lambda: sa in n, lambda: sa in sn)  # a stdlib address in our network
        if hasattr(sa, "_ip"):  # (3.11's `in` asks a network for `_ip`: only ours is duck-typed)
            same(lambda: a in sn, lambda: sa in sn)  # ours in the stdlib's
        if hasattr(sa, "network_address"):
            same(lambda: a.overlaps(n), lambda: sa.overlaps(sn))
            same(lambda: a.subnet_of(n), lambda: sa.subnet_of(sn))
            same(lambda: a.supernet_of(n), lambda: sa.supernet_of(sn))
            same(lambda: a.overlaps(sn), lambda: sa.overlaps(sn))
            if "%" not in str(sa) + str(sn):  # (scope ids: see the ordering above)
                same(lambda: a.subnet_of(sn), lambda: sa.subnet_of(sn))
        else:
            same(lambda: n.overlaps(a), lambda: sn.overlaps(sa))
            same(lambda: n.subnet_of(a), lambda: sn.subnet_of(sa))


def test_subnets_of_a_pool_walk_like_the_stdlib() -> None:
    for text in ("10.0.0.0/22", "10.0.0.0/31", "10.0.0.1/32", "fd00::/120", "fd00::/127", "fd00::1/128",
                 "fe80::%eth0/126", "0.0.0.0/0"):
        n, s = our.ip_network(text), std.ip_network(text)
        same(lambda: list(n.subnets(new_prefix=min(n.prefixlen + 2, n.max_prefixlen))),
             lambda: list(s.subnets(new_prefix=min(s.prefixlen + 2, s.max_prefixlen))))
        if n.num_addresses <= 1024:
            same(lambda: list(n.hosts()), lambda: list(s.hosts()))
            same(lambda: list(n), lambda: list(s))


def test_refusals_are_value_errors_of_the_named_classes() -> None:
    with pytest.raises(our.AddressValueError, match="Leading zeros"):
        our.IPv4Address("10.01.0.1")
    with pytest.raises(our.NetmaskValueError, match="not a valid netmask"):
        our.IPv4Network("10.0.0.0/33")
    with pytest.raises(ValueError, match="has host bits set"):
        our.ip_network("10.0.0.1/24")
    assert issubclass(our.AddressValueError, ValueError) and issubclass(our.NetmaskValueError, ValueError)
    with pytest.raises(TypeError):
        _ = our.ip_address("1.2.3.4") < our.ip_address("::1")
    with pytest.raises(TypeError):
        _ = our.ip_address("1.2.3.4") < our.ip_network("1.2.3.4/32")


def test_interfaces_are_addresses_as_in_the_stdlib() -> None:
    """isinstance relations pycni code relies on: an Interface is an Address of its family."""
    assert isinstance(our.ip_interface("10.1.2.3/24"), our.IPv4Address)
    assert isinstance(our.ip_interface("fd00::3/64"), our.IPv6Address)
    assert not isinstance(our.ip_network("10.0.0.0/8"), our.IPv4Address)
    assert str(our.ip_address("::ffff:1.2.3.4")) == "::ffff:102:304"  # 3.11's text, kept in results


def test_importing_it_loads_nothing_else() -> None:
    """The point of the module: `python -IS -c 'import pycni.ipaddr'` adds only pycni and pycni.ipaddr."""
    import subprocess
    import sys

    import pycni

    root = str(__import__("pathlib").Path(pycni.__file__).parent.parent)
    code = (f"import sys; before = set(sys.modules); sys.path.insert(0, {root!r}); import pycni.ipaddr; "
            "print(' '.join(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-IS", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["__future__", "pycni", "pycni.ipaddr"] or out.split() == ["pycni", "pycni.ipaddr"]
