"""Names pycni gives what it creates: derived by hashing, as the Go reference derives them
(chains, ifb devices), or random (temporary and host-side interfaces).

Its own module so that a plugin needing one name (bandwidth's ifb on a DEL) imports nothing
else: :mod:`pycni.net.masq` pulls in iptables and nftables, :mod:`hashlib` OpenSSL's bindings.
Stdlib only.
"""

from __future__ import annotations

import os


def sha512_hex(data: bytes) -> str:
    """SHA-512 of ``data`` in hex, from the builtin module when there is one: hashlib would load
    OpenSSL's bindings first (~2–10 ms a one-shot call, for one digest)."""
    try:
        from _sha512 import sha512  # CPython < 3.12
    except ImportError:
        try:
            from _sha2 import sha512  # type: ignore[import-not-found,no-redef]  # CPython >= 3.12
        except ImportError:
            from hashlib import sha512  # type: ignore[assignment]
    return sha512(data).hexdigest()  # type: ignore[no-any-return]


def hash_with_prefix(length: int, prefix: str, to_hash: str) -> str:
    """``prefix`` + hex SHA-512 of ``to_hash``, cut to ``length`` (Go: MustFormatHashWithPrefix)."""
    return (prefix + sha512_hex(to_hash.encode()))[:length]


def random_ifname(prefix: str) -> str:
    """``prefix`` (at most 7 characters) + 8 random hex digits: within the kernel's 15.

    From os.urandom: :mod:`secrets` or :mod:`random` would cost a one-shot plugin 1-12 ms of
    imports for four bytes.
    """
    return prefix + os.urandom(4).hex()
