"""Persistent tap devices, made with the tun driver's ioctls in the calling thread's netns.

/dev/net/tun attaches a new device to the network namespace of the thread that opens it, so
after ``netns.enter`` the tap is born inside the container. Stdlib only (fcntl).
"""

from __future__ import annotations

import fcntl
import os
import struct

from pycni.net.errors import kernel_errors
from pycni.spec.errors import INTERNAL, CNIError

TUNSETIFF = 0x400454CA
TUNSETPERSIST = 0x400454CB
TUNSETOWNER = 0x400454CC
TUNSETGROUP = 0x400454CE
IFF_TAP = 0x0002
IFF_MULTI_QUEUE = 0x0100
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000


def create_tap(name: str, *, multi_queue: bool = False, owner: int | None = None, group: int | None = None) -> None:
    """Create persistent tap ``name`` here; ``owner``/``group`` restrict who may attach to it."""
    flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | (IFF_MULTI_QUEUE if multi_queue else 0)
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise CNIError(INTERNAL, "failed to open /dev/net/tun", f"{e}; is the tun module loaded?") from None
    try:
        with kernel_errors(f"failed to create tap {name!r}"):
            fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), flags))
            if owner is not None:
                fcntl.ioctl(fd, TUNSETOWNER, owner)
            if group is not None:
                fcntl.ioctl(fd, TUNSETGROUP, group)
            fcntl.ioctl(fd, TUNSETPERSIST, 1)
    finally:
        os.close(fd)
