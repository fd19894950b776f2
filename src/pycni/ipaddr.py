"""pycni's IP value types: the part of the stdlib's :mod:`ipaddress` that pycni uses, minus its imports.

Why: every one-shot plugin process handles IP values, and ``import ipaddress`` pulls functools,
collections, operator, keyword, reprlib, itertools and types — ~3.4 ms of CPU per process, a
tenth of a bridge ADD (issue 21). This module imports nothing, so a plugin pays only for its own
classes.

What: :class:`IPv4Address`, :class:`IPv6Address`, :class:`IPv4Network`, :class:`IPv6Network`,
:class:`IPv4Interface`, :class:`IPv6Interface`, :func:`ip_address`, :func:`ip_network` and
:func:`ip_interface`, with CPython 3.11's semantics for what pycni uses: the same strings accepted
and refused with the same messages (they reach CNI error details), the same ``str()``, the same
constructors (str, int, bytes, (address, prefix) tuples, ``strict``), arithmetic, ordering,
``in``, ``overlaps``/``subnet_of``/``subnets``/``supernet``/``hosts``, ``packed`` and the
``is_multicast``/``is_loopback``/``is_link_local``/``is_unspecified`` tests. Refusals are
:class:`AddressValueError`/:class:`NetmaskValueError` (ValueErrors), TypeError where 3.11 raises it.

Equality and hashing agree with the stdlib's objects of the same value in both directions (the
stdlib compares by duck typing on ``_ip``, ``_version``, ``_scope_id``, ``network_address``,
``netmask`` and ``network``; the hashes are computed as it computes them), so tests and callers
holding stdlib objects keep working. Not provided (pycni uses none of them): ``is_private``,
``is_global``, ``is_reserved``, ``is_site_local``, ``teredo``, ``sixtofour``, ``reverse_pointer``,
``address_exclude``, ``compare_networks``, ``collapse_addresses``, ``summarize_address_range``.
tests/test_ipaddr.py compares every operation here with the stdlib's over thousands of values.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: this module is on every plugin's start path
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any


class AddressValueError(ValueError):
    """An address (or its part of a network/interface string) is not valid."""


class NetmaskValueError(ValueError):
    """A prefix length or netmask is not valid."""


_V4_ONES = (1 << 32) - 1
_V6_ONES = (1 << 128) - 1
_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")


# ---- text <-> int ------------------------------------------------------------------------------

def _octet(text: str) -> int:
    if not text:
        raise ValueError("Empty octet not permitted")
    if not _DIGITS.issuperset(text):
        raise ValueError(f"Only decimal digits permitted in {text!r}")
    if len(text) > 3:
        raise ValueError(f"At most 3 characters permitted in {text!r}")
    if len(text) > 1 and text[0] == "0":
        raise ValueError(f"Leading zeros are not permitted in {text!r}")
    value = int(text)
    if value > 255:
        raise ValueError(f"Octet {value} (> 255) not permitted")
    return value


def _v4_int(text: str) -> int:
    """Dotted quad -> int; exactly four decimal octets, no leading zeros (3.11's rule)."""
    if not text:
        raise AddressValueError("Address cannot be empty")
    octets = text.split(".")
    if len(octets) != 4:
        raise AddressValueError(f"Expected 4 octets in {text!r}")
    value = 0
    try:
        for o in octets:
            value = (value << 8) | _octet(o)
    except ValueError as e:
        raise AddressValueError(f"{e} in {text!r}") from None
    return value


def _v4_str(value: int) -> str:
    return f"{value >> 24}.{(value >> 16) & 255}.{(value >> 8) & 255}.{value & 255}"


def _hextet(text: str) -> int:
    if not _HEX.issuperset(text):
        raise ValueError(f"Only hex digits permitted in {text!r}")
    if len(text) > 4:
        raise ValueError(f"At most 4 characters permitted in {text!r}")
    return int(text, 16)


def _v6_int(text: str) -> int:
    """Colon-hex (one ``::`` at most, an embedded dotted quad last) -> int, with 3.11's checks and messages."""
    if not text:
        raise AddressValueError("Address cannot be empty")
    parts = text.split(":")
    if len(parts) < 3:
        raise AddressValueError(f"At least 3 parts expected in {text!r}")
    if "." in parts[-1]:
        try:
            v4 = _v4_int(parts[-1])
        except AddressValueError as e:
            raise AddressValueError(f"{e} in {text!r}") from None
        parts[-1:] = [f"{v4 >> 16:x}", f"{v4 & 0xFFFF:x}"]
    if len(parts) > 9:
        raise AddressValueError(f"At most 8 colons permitted in {text!r}")
    gap = -1  # index of the empty part that ``::`` leaves in the middle
    for i in range(1, len(parts) - 1):
        if not parts[i]:
            if gap >= 0:
                raise AddressValueError(f"At most one '::' permitted in {text!r}")
            gap = i
    if gap >= 0:
        head, tail = parts[:gap], parts[gap + 1:]
        if not parts[0]:
            if len(head) > 1:
                raise AddressValueError(f"Leading ':' only permitted as part of '::' in {text!r}")
            head = []
        if not parts[-1]:
            if len(tail) > 1:
                raise AddressValueError(f"Trailing ':' only permitted as part of '::' in {text!r}")
            tail = []
        skipped = 8 - len(head) - len(tail)
        if skipped < 1:
            raise AddressValueError(f"Expected at most 7 other parts with '::' in {text!r}")
    else:
        if len(parts) != 8:
            raise AddressValueError(f"Exactly 8 parts expected without '::' in {text!r}")
        if not parts[0]:
            raise AddressValueError(f"Leading ':' only permitted as part of '::' in {text!r}")
        if not parts[-1]:
            raise AddressValueError(f"Trailing ':' only permitted as part of '::' in {text!r}")
        head, tail, skipped = parts, [], 0
    value = 0
    try:
        for p in head:
            value = (value << 16) | _hextet(p)
        value <<= 16 * skipped
        for p in tail:
            value = (value << 16) | _hextet(p)
    except ValueError as e:
        raise AddressValueError(f"{e} in {text!r}") from None
    return value


def _v6_str(value: int) -> str:
    """RFC 5952 shape as 3.11 prints it: the first longest run of two or more zero groups is ``::``."""
    groups = [f"{(value >> s) & 0xFFFF:x}" for s in range(112, -16, -16)]
    best, best_len, start, run = -1, 1, -1, 0
    for i, g in enumerate(groups):
        if g == "0":
            if run == 0:
                start = i
            run += 1
            if run > best_len:
                best, best_len = start, run
        else:
            run = 0
    if best < 0:
        return ":".join(groups)
    return ":".join(groups[:best]) + "::" + ":".join(groups[best + best_len:])


def _zero_bits_right(value: int, width: int) -> int:
    return width if value == 0 else min(width, (~value & (value - 1)).bit_length())


def _prefix_of_mask(value: int, width: int) -> int:
    """Prefix length of a contiguous netmask; ValueError if ones and zeroes mix."""
    zeros = _zero_bits_right(value, width)
    plen = width - zeros
    if value >> zeros != (1 << plen) - 1:
        raise ValueError("mixed netmask")
    return plen


def _split_prefix(address: object, width: int) -> tuple[Any, Any]:
    """Network/interface argument -> (address part, prefix part), as 3.11 splits it."""
    if isinstance(address, (bytes, int)):
        return address, width
    if isinstance(address, tuple):
        if len(address) > 1:
            addr, plen = address
            return addr, plen
        return address[0], width
    parts = str(address).split("/")
    if len(parts) > 2:
        raise AddressValueError(f"Only one '/' permitted in {address!r}")
    return (parts[0], parts[1]) if len(parts) == 2 else (parts[0], width)


def _bad_mask(arg: object) -> NetmaskValueError:
    return NetmaskValueError(f"{arg!r} is not a valid netmask")


def _digits_prefix(arg: str, width: int) -> int:
    if not (arg.isascii() and arg.isdigit()):
        raise _bad_mask(arg)
    plen = int(arg)
    if plen > width:
        raise _bad_mask(arg)
    return plen


# ---- what every value shares ---------------------------------------------------------------------

class _Value:
    """What addresses, networks and interfaces share: version, the orderings derived from
    ``__lt__`` and ``__eq__`` (the stdlib's functools.total_ordering), repr, and being immutable."""

    __slots__ = ()
    _version: int
    _max_prefixlen: int

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_prefixlen(self) -> int:
        return self._max_prefixlen

    @property
    def compressed(self) -> str:
        return str(self)

    def __lt__(self, other: object) -> bool:
        return NotImplemented  # each kind defines its own order; the others derive from it

    def __gt__(self, other: object) -> bool:
        less = type(self).__lt__(self, other)
        if less is NotImplemented:
            return NotImplemented
        return not less and self != other

    def __le__(self, other: object) -> bool:
        less = type(self).__lt__(self, other)
        if less is NotImplemented:
            return NotImplemented
        return less or self == other

    def __ge__(self, other: object) -> bool:
        less = type(self).__lt__(self, other)
        if less is NotImplemented:
            return NotImplemented
        return not less

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __copy__(self) -> Any:
        return self  # an immutable value, as a str: its copy is itself (record.deep_copy shares it)

    def __deepcopy__(self, memo: Any) -> Any:
        return self


# ---- addresses ---------------------------------------------------------------------------------

class _Address(_Value):
    """What IPv4Address and IPv6Address share (and their Interface subclasses inherit)."""

    __slots__ = ()
    _ip: int
    _ALL_ONES: int

    def _check_int(self, address: int) -> None:
        if address < 0:
            raise AddressValueError(f"{address} (< 0) is not permitted as an IPv{self._version} address")
        if address > self._ALL_ONES:
            raise AddressValueError(f"{address} (>= 2**{self._max_prefixlen}) is not permitted as an "
                                    f"IPv{self._version} address")

    def _check_packed(self, address: bytes) -> None:
        want = self._max_prefixlen // 8
        if len(address) != want:
            raise AddressValueError(f"{address!r} (len {len(address)} != {want}) is not permitted as an "
                                    f"IPv{self._version} address")

    def _int_or_text(self, address: object) -> int | str:
        """An int or packed bytes as the checked value; anything else as its text (no '/') to parse."""
        if isinstance(address, int):
            self._check_int(address)
            return address
        if isinstance(address, bytes):
            self._check_packed(address)
            return int.from_bytes(address, "big")
        text = str(address)
        if "/" in text:
            raise AddressValueError(f"Unexpected '/' in {address!r}")
        return text

    @property
    def packed(self) -> bytes:
        return self._ip.to_bytes(self._max_prefixlen // 8, "big")

    def __int__(self) -> int:
        return self._ip

    def __eq__(self, other: object) -> bool:
        try:
            return self._ip == other._ip and self._version == other._version  # type: ignore[attr-defined,no-any-return]
        except AttributeError:
            return NotImplemented

    def __hash__(self) -> int:
        return hash(hex(self._ip))

    def __lt__(self, other: object) -> bool:
        try:  # duck-typed as the stdlib's equality is, so ours and its addresses sort together
            oip, over = other._ip, other._version  # type: ignore[attr-defined]
        except AttributeError:
            return NotImplemented
        if self._version != over:
            raise TypeError(f"{self} and {other} are not of the same version")
        return self._ip < oip  # type: ignore[no-any-return]

    def __add__(self, other: int) -> Any:
        if not isinstance(other, int):
            return NotImplemented
        cls: Any = type(self)
        return cls(self._ip + other)

    def __sub__(self, other: int) -> Any:
        if not isinstance(other, int):
            return NotImplemented
        cls: Any = type(self)
        return cls(self._ip - other)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self._ip,)

    def __format__(self, fmt: str) -> str:
        """``s`` (default), and ``b``/``x``/``X``/``n`` with optional ``#`` and ``_``, as 3.11 formats."""
        if not fmt or fmt[-1] == "s":
            return format(str(self), fmt)
        alt = fmt.startswith("#")
        rest = fmt[1:] if alt else fmt
        group = rest.startswith("_")
        rest = rest[1:] if group else rest
        if rest not in ("x", "X", "b", "n"):
            return object.__format__(self, fmt)
        if rest == "n":
            rest = "b" if self._version == 4 else "x"
        width = self._max_prefixlen if rest == "b" else self._max_prefixlen // 4
        if group:
            width += width // 4 - 1
        if alt:
            width += 2
        return format(self._ip, f"{'#' if alt else ''}0{width}{'_' if group else ''}{rest}")


class IPv4Address(_Address):
    """An IPv4 address: from a dotted quad, an int, or 4 packed bytes."""

    __slots__ = ("_ip", "__weakref__")
    _version = 4
    _max_prefixlen = 32
    _ALL_ONES = _V4_ONES

    def __init__(self, address: object) -> None:
        value = self._int_or_text(address)
        self._ip = value if isinstance(value, int) else _v4_int(value)

    def __str__(self) -> str:
        return _v4_str(self._ip)

    @property
    def exploded(self) -> str:
        return str(self)

    @property
    def is_multicast(self) -> bool:
        return self._ip >> 28 == 0xE  # 224.0.0.0/4

    @property
    def is_loopback(self) -> bool:
        return self._ip >> 24 == 127  # 127.0.0.0/8

    @property
    def is_link_local(self) -> bool:
        return self._ip >> 16 == 0xA9FE  # 169.254.0.0/16

    @property
    def is_unspecified(self) -> bool:
        return self._ip == 0


class IPv6Address(_Address):
    """An IPv6 address: from colon-hex text (optionally ``%scope``), an int, or 16 packed bytes."""

    __slots__ = ("_ip", "_scope_id", "__weakref__")
    _version = 6
    _max_prefixlen = 128
    _ALL_ONES = _V6_ONES

    def __init__(self, address: object) -> None:
        self._scope_id: str | None = None
        value = self._int_or_text(address)
        if isinstance(value, int):
            self._ip = value
            return
        text, sep, scope = value.partition("%")
        if sep:
            if not scope or "%" in scope:
                raise AddressValueError(f'Invalid IPv6 address: "{str(address)!r}"')
            self._scope_id = scope
        self._ip = _v6_int(text)

    def __str__(self) -> str:
        text = _v6_str(self._ip)
        return f"{text}%{self._scope_id}" if self._scope_id else text

    def __eq__(self, other: object) -> bool:
        equal = _Address.__eq__(self, other)
        if equal is NotImplemented or not equal:
            return equal
        return self._scope_id == getattr(other, "_scope_id", None)

    def __hash__(self) -> int:
        return hash((self._ip, self._scope_id))

    @property
    def scope_id(self) -> str | None:
        return self._scope_id

    @property
    def exploded(self) -> str:
        text = f"{self._ip:032x}"
        return ":".join(text[i:i + 4] for i in range(0, 32, 4))

    @property
    def ipv4_mapped(self) -> IPv4Address | None:
        """The IPv4 address of ``::ffff:a.b.c.d``, else None."""
        return IPv4Address(self._ip & _V4_ONES) if self._ip >> 32 == 0xFFFF else None

    @property
    def is_multicast(self) -> bool:
        return self._ip >> 120 == 0xFF  # ff00::/8

    @property
    def is_loopback(self) -> bool:
        return self._ip == 1

    @property
    def is_link_local(self) -> bool:
        return self._ip >> 118 == 0x3FA  # fe80::/10

    @property
    def is_unspecified(self) -> bool:
        return self._ip == 0


# ---- networks ----------------------------------------------------------------------------------

class _cached:  # (lower case: a decorator, like the functools.cached_property it stands for)
    """A property computed once per instance and kept in its __dict__ (functools.cached_property's job)."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.name = fn, fn.__name__

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


class _Network(_Value):
    """What IPv4Network and IPv6Network share: an address with its host bits zero and a prefix length."""

    _ALL_ONES: int
    _address_class: type[IPv4Address] | type[IPv6Address]
    _masks: dict[object, tuple[Any, int]]
    network_address: Any
    netmask: Any
    _prefixlen: int

    def __init__(self, address: object, strict: bool = True) -> None:
        addr, mask = _split_prefix(address, self._max_prefixlen)
        self.network_address = self._address_class(addr)
        self.netmask, self._prefixlen = self._make_netmask(mask)
        ip, bits = self.network_address._ip, self.netmask._ip
        if ip & bits != ip:
            if strict:
                raise ValueError(f"{self} has host bits set")
            self.network_address = self._address_class(ip & bits)
        self._addr_arg = addr

    @classmethod
    def _make_netmask(cls, arg: object) -> tuple[Any, int]:
        hit = cls._masks.get(arg)
        if hit is None:
            if isinstance(arg, int):
                if not 0 <= arg <= cls._max_prefixlen:
                    raise _bad_mask(arg)
                plen = arg
            else:
                plen = cls._prefix_from_text(arg)
            hit = cls._masks[arg] = (cls._address_class(cls._ALL_ONES ^ (cls._ALL_ONES >> plen)), plen)
        return hit

    @classmethod
    def _prefix_from_text(cls, arg: Any) -> int:
        return _digits_prefix(arg, cls._max_prefixlen)

    @property
    def prefixlen(self) -> int:
        return self._prefixlen

    @_cached
    def hostmask(self) -> Any:
        return self._address_class(self.netmask._ip ^ self._ALL_ONES)

    @_cached
    def broadcast_address(self) -> Any:
        return self._address_class(self.network_address._ip | (self.netmask._ip ^ self._ALL_ONES))

    @property
    def num_addresses(self) -> int:
        return (self.netmask._ip ^ self._ALL_ONES) + 1

    @property
    def with_prefixlen(self) -> str:
        return f"{self.network_address}/{self._prefixlen}"

    @property
    def with_netmask(self) -> str:
        return f"{self.network_address}/{self.netmask}"

    @property
    def with_hostmask(self) -> str:
        return f"{self.network_address}/{self.hostmask}"

    @property
    def exploded(self) -> str:
        return f"{self.network_address.exploded}/{self._prefixlen}"

    def __str__(self) -> str:
        return f"{self.network_address}/{self._prefixlen}"

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self),)

    def __eq__(self, other: object) -> bool:
        try:
            return (self._version == other._version  # type: ignore[attr-defined]
                    and self.network_address == other.network_address  # type: ignore[attr-defined]
                    and self.netmask._ip == int(other.netmask))  # type: ignore[attr-defined]
        except AttributeError:
            return NotImplemented

    def __hash__(self) -> int:
        return hash(self.network_address._ip ^ self.netmask._ip)

    def __lt__(self, other: object) -> bool:
        try:  # duck-typed like equality (only networks have a network_address)
            onet, omask, over = other.network_address, other.netmask, other._version  # type: ignore[attr-defined]
        except AttributeError:
            return NotImplemented
        if self._version != over:
            raise TypeError(f"{self} and {other} are not of the same version")
        if self.network_address != onet:
            return self.network_address._ip < int(onet)  # type: ignore[no-any-return]
        return self.netmask._ip < int(omask)  # type: ignore[no-any-return]

    def __contains__(self, other: Any) -> bool:
        if self._version != other._version:
            return False
        try:
            ip = other._ip
        except AttributeError:
            if hasattr(other, "network_address"):
                return False  # a network is never "in" a network (subnet_of says that)
            raise
        return ip & self.netmask._ip == self.network_address._ip  # type: ignore[no-any-return]

    def overlaps(self, other: Any) -> bool:
        """Whether the two networks share any address."""
        return (self.network_address in other or self.broadcast_address in other
                or other.network_address in self or other.broadcast_address in self)

    @staticmethod
    def _is_subnet_of(a: Any, b: Any) -> bool:
        try:
            if a._version != b._version:
                raise TypeError(f"{a} and {b} are not of the same version")
            return (b.network_address <= a.network_address  # (3.11: a scoped address is <= nothing else)
                    and b.broadcast_address >= a.broadcast_address)
        except AttributeError:
            raise TypeError(f"Unable to test subnet containment between {a} and {b}") from None

    def subnet_of(self, other: Any) -> bool:
        return self._is_subnet_of(self, other)

    def supernet_of(self, other: Any) -> bool:
        return self._is_subnet_of(other, self)

    def __iter__(self) -> Iterator[Any]:
        cls = self._address_class
        first = self.network_address._ip
        for x in range(first, first + self.num_addresses):
            yield cls(x)

    def __getitem__(self, n: int) -> Any:
        first, last = self.network_address._ip, self.broadcast_address._ip
        if n >= 0:
            if first + n > last:
                raise IndexError("address out of range")
            return self._address_class(first + n)
        if last + n + 1 < first:
            raise IndexError("address out of range")
        return self._address_class(last + n + 1)

    def hosts(self) -> Any:
        """The usable host addresses (3.11: all of a /31 or /127, the one of a /32 or /128)."""
        if self._prefixlen == self._max_prefixlen:
            return [self._address_class(self._addr_arg)]
        if self._prefixlen == self._max_prefixlen - 1:
            return iter(self)
        return self._hosts()

    def _hosts(self) -> Iterator[Any]:
        cls = self._address_class
        for x in range(self.network_address._ip + 1, self.broadcast_address._ip):
            yield cls(x)

    def subnets(self, prefixlen_diff: int = 1, new_prefix: int | None = None) -> Iterator[Any]:
        """The networks ``prefixlen_diff`` bits longer (or of ``new_prefix``) that make up this one."""
        if self._prefixlen == self._max_prefixlen:
            yield self
            return
        if new_prefix is not None:
            if new_prefix < self._prefixlen:
                raise ValueError("new prefix must be longer")
            if prefixlen_diff != 1:
                raise ValueError("cannot set prefixlen_diff and new_prefix")
            prefixlen_diff = new_prefix - self._prefixlen
        if prefixlen_diff < 0:
            raise ValueError("prefix length diff must be > 0")
        plen = self._prefixlen + prefixlen_diff
        if plen > self._max_prefixlen:
            raise ValueError(f"prefix length diff {plen} is invalid for netblock {self}")
        start = self.network_address._ip
        step = self.num_addresses >> prefixlen_diff
        for x in range(start, start + self.num_addresses, step):
            yield type(self)((x, plen))

    def supernet(self, prefixlen_diff: int = 1, new_prefix: int | None = None) -> Any:
        """The network ``prefixlen_diff`` bits shorter (or of ``new_prefix``) holding this one."""
        if self._prefixlen == 0:
            return self
        if new_prefix is not None:
            if new_prefix > self._prefixlen:
                raise ValueError("new prefix must be shorter")
            if prefixlen_diff != 1:
                raise ValueError("cannot set prefixlen_diff and new_prefix")
            prefixlen_diff = self._prefixlen - new_prefix
        plen = self._prefixlen - prefixlen_diff
        if plen < 0:
            raise ValueError(f"current prefixlen is {self._prefixlen}, cannot have a prefixlen_diff of "
                             f"{prefixlen_diff}")
        return type(self)((self.network_address._ip & (self.netmask._ip << prefixlen_diff), plen))

    @property
    def is_multicast(self) -> bool:
        return bool(self.network_address.is_multicast and self.broadcast_address.is_multicast)

    @property
    def is_loopback(self) -> bool:
        return bool(self.network_address.is_loopback and self.broadcast_address.is_loopback)

    @property
    def is_link_local(self) -> bool:
        return bool(self.network_address.is_link_local and self.broadcast_address.is_link_local)

    @property
    def is_unspecified(self) -> bool:
        return bool(self.network_address.is_unspecified and self.broadcast_address.is_unspecified)


class IPv4Network(_Network):
    """An IPv4 network: 'a.b.c.d/n', 'a.b.c.d/netmask' or '/hostmask', (address, prefix), int or bytes."""

    _version = 4
    _max_prefixlen = 32
    _ALL_ONES = _V4_ONES
    _address_class = IPv4Address
    _masks: dict[object, tuple[Any, int]] = {}
    network_address: IPv4Address
    netmask: IPv4Address

    @classmethod
    def _prefix_from_text(cls, arg: Any) -> int:
        try:
            return _digits_prefix(arg, 32)
        except NetmaskValueError:
            pass
        try:
            value = _v4_int(arg)
        except AddressValueError:
            raise _bad_mask(arg) from None
        for candidate in (value, value ^ _V4_ONES):  # a netmask, else a hostmask
            try:
                return _prefix_of_mask(candidate, 32)
            except ValueError:
                pass
        raise _bad_mask(arg)


class IPv6Network(_Network):
    """An IPv6 network: 'x::/n', (address, prefix), int or bytes."""

    _version = 6
    _max_prefixlen = 128
    _ALL_ONES = _V6_ONES
    _address_class = IPv6Address
    _masks: dict[object, tuple[Any, int]] = {}
    network_address: IPv6Address
    netmask: IPv6Address

    def _hosts(self) -> Iterator[Any]:
        """IPv6 has no broadcast: every address but the Subnet-Router anycast one (the first)."""
        cls = self._address_class
        for x in range(self.network_address._ip + 1, self.broadcast_address._ip + 1):
            yield cls(x)


# ---- interfaces --------------------------------------------------------------------------------

class _Interface:
    """An address with the network it sits on (host bits kept): the Interface classes' shared part."""
    _ip: int
    _prefixlen: int
    _max_prefixlen: int
    _address_class: Any
    _network_class: Any
    network: Any
    netmask: Any

    def __init__(self, address: object) -> None:
        addr, mask = _split_prefix(address, self._max_prefixlen)
        self._address_class.__init__(self, addr)
        self.network = self._network_class((addr, mask), strict=False)
        self.netmask = self.network.netmask
        self._prefixlen = self.network._prefixlen

    @property
    def ip(self) -> Any:
        return self._address_class(self._ip)

    @property
    def hostmask(self) -> Any:
        return self.network.hostmask

    @property
    def with_prefixlen(self) -> str:
        return f"{self._bare()}/{self._prefixlen}"

    @property
    def with_netmask(self) -> str:
        return f"{self._bare()}/{self.netmask}"

    @property
    def with_hostmask(self) -> str:
        return f"{self._bare()}/{self.hostmask}"

    def _bare(self) -> str:
        return str(self._address_class(self._ip))

    def __str__(self) -> str:
        return f"{self._address_class.__str__(self)}/{self._prefixlen}"

    def __eq__(self, other: object) -> bool:
        equal = self._address_class.__eq__(self, other)
        if equal is NotImplemented or not equal:
            return equal  # type: ignore[no-any-return]
        try:
            return self.network == other.network  # type: ignore[attr-defined,no-any-return]
        except AttributeError:
            return False

    def __lt__(self, other: object) -> bool:
        less = self._address_class.__lt__(self, other)
        if less is NotImplemented:
            return NotImplemented  # type: ignore[no-any-return]
        try:
            return self.network < other.network or self.network == other.network and less  # type: ignore
        except AttributeError:
            return False

    def __hash__(self) -> int:
        return hash((self._ip, self._prefixlen, self.network.network_address._ip))

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self),)


class IPv4Interface(_Interface, IPv4Address):
    """An IPv4 address on its network ('10.1.2.3/24'); ``.ip`` and ``.network`` are the two halves."""

    _address_class = IPv4Address
    _network_class = IPv4Network
    network: IPv4Network
    netmask: IPv4Address

    @property
    def is_unspecified(self) -> bool:
        return False  # 3.11 compares the interface with 0.0.0.0, which has no network: never equal


class IPv6Interface(_Interface, IPv6Address):
    """An IPv6 address on its network ('fd00::3/64'); ``.ip`` and ``.network`` are the two halves."""

    _address_class = IPv6Address
    _network_class = IPv6Network
    network: IPv6Network
    netmask: IPv6Address

    @property
    def exploded(self) -> str:
        return f"{IPv6Address.exploded.fget(self)}/{self._prefixlen}"  # type: ignore[attr-defined]

    @property
    def is_unspecified(self) -> bool:
        return self._ip == 0 and self.network.is_unspecified

    @property
    def is_loopback(self) -> bool:
        return self._ip == 1 and self.network.is_loopback


# ---- the factories -----------------------------------------------------------------------------

def _first_of(classes: tuple[Any, Any], args: tuple[object, ...], what: str) -> Any:
    """The IPv4 class's value from ``args``, else the IPv6 one's, else the stdlib's ValueError."""
    for cls in classes:
        try:
            return cls(*args)
        except (AddressValueError, NetmaskValueError):
            pass
    raise ValueError(f"{args[0]!r} does not appear to be an IPv4 or IPv6 {what}")


def ip_address(address: object) -> IPv4Address | IPv6Address:
    """An IPv4Address or IPv6Address from text, an int (IPv4 below 2**32) or packed bytes."""
    return _first_of((IPv4Address, IPv6Address), (address,), "address")  # type: ignore[no-any-return]


def ip_network(address: object, strict: bool = True) -> IPv4Network | IPv6Network:
    """An IPv4Network or IPv6Network; with ``strict`` host bits are refused, else cleared."""
    return _first_of((IPv4Network, IPv6Network), (address, strict), "network")  # type: ignore[no-any-return]


def ip_interface(address: object) -> IPv4Interface | IPv6Interface:
    """An IPv4Interface or IPv6Interface: an address with its prefix, host bits kept."""
    return _first_of((IPv4Interface, IPv6Interface), (address,), "interface")  # type: ignore[no-any-return]
