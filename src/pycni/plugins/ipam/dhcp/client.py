"""A DHCPv4 client that works on an interface with no address yet. Stdlib only.

It talks through an AF_PACKET socket bound to the interface, as the Go reference does: frames
carry their own IPv4/UDP headers, so sending needs neither an address nor a route, and replies
are seen whether the server broadcasts them or unicasts them to the offered address. Renewals
and releases go straight to the server's MAC address learned from its ACK.

Create a :class:`Transport` while the calling thread is inside the container's namespace
(``pycni.net.netns.enter``); the socket stays bound to that namespace.
"""

from __future__ import annotations

import errno
import fcntl
import random
import socket
import struct
import time

from pycni import ipaddr
from pycni.plugins.ipam.dhcp import message as M
from pycni.record import field, record

ETH_P_IP = 0x0800
PACKET_OUTGOING = 4
BROADCAST_MAC = b"\xff" * 6
BROADCAST_IP = ipaddr.IPv4Address("255.255.255.255")
ZERO_IP = ipaddr.IPv4Address(0)
CLIENT_PORT = 68
SERVER_PORT = 67
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


class DHCPTimeout(Exception):
    """No (usable) answer from a server before the deadline."""


class DHCPNak(Exception):
    """The server refused the request (DHCPNAK)."""


@record
class ClientOptions:
    """What the client says about itself and asks for, fixed for a lease's life."""

    client_id: bytes
    provide: dict[int, bytes] = field(default_factory=dict)
    request: list[int] = field(default_factory=list)
    broadcast: bool = False

    def base_options(self, msg_type: int) -> dict[int, bytes]:
        opts = {M.OPT_MESSAGE_TYPE: bytes((msg_type,)), M.OPT_CLIENT_ID: self.client_id}
        opts.update(self.provide)  # a provided dhcp-client-identifier overrides ours, as in the reference
        return opts


@record
class Binding:
    """A server's ACK and where it came from: enough to renew or release the lease."""

    ack: M.Message
    server_ip: ipaddr.IPv4Address
    server_mac: bytes
    client_mac: bytes

    @property
    def address(self) -> ipaddr.IPv4Address:
        return self.ack.yiaddr


def set_link_up(ifname: str) -> None:
    """Bring the interface up if it is down (the reference does the same before DISCOVER)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", ifname.encode(), 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        if not flags & IFF_UP:
            fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", ifname.encode(), flags | IFF_UP))


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _ip_udp(payload: bytes, src: ipaddr.IPv4Address, dst: ipaddr.IPv4Address) -> bytes:
    udp_len = 8 + len(payload)
    pseudo = src.packed + dst.packed + struct.pack("!BBH", 0, socket.IPPROTO_UDP, udp_len)
    udp = struct.pack("!HHHH", CLIENT_PORT, SERVER_PORT, udp_len, 0) + payload
    csum = _checksum(pseudo + udp) or 0xFFFF
    udp = udp[:6] + struct.pack("!H", csum) + udp[8:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0x10, 20 + udp_len, 0, 0, 64, socket.IPPROTO_UDP, 0,
                     src.packed, dst.packed)
    ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
    return ip + udp


# Classic BPF run by the kernel on each frame (offsets from the IP header, as for a SOCK_DGRAM
# packet socket): keep unfragmented UDP to port 68, so a busy interface does not wake us for
# every packet. Python checks again anyway; without the filter we are only slower.
_BPF_UDP_TO_68 = [
    (0x30, 0, 0, 9),           # ldb [9]            IP protocol
    (0x15, 0, 6, 17),          # jeq #17 (UDP)      else drop
    (0x28, 0, 0, 6),           # ldh [6]            flags + fragment offset
    (0x45, 4, 0, 0x1FFF),      # jset #0x1fff       fragment: drop
    (0xB1, 0, 0, 0),           # ldxb 4*([0]&0xf)   IP header length
    (0x48, 0, 0, 2),           # ldh [x+2]          UDP destination port
    (0x15, 0, 1, CLIENT_PORT),  # jeq #68            else drop
    (0x06, 0, 0, 0xFFFF),      # ret #65535         accept
    (0x06, 0, 0, 0),           # ret #0             drop
]
SO_ATTACH_FILTER = 26


def _attach_client_port_filter(sock: socket.socket) -> None:
    import ctypes

    prog = b"".join(struct.pack("HBBI", *ins) for ins in _BPF_UDP_TO_68)
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = struct.pack("HL", len(_BPF_UDP_TO_68), ctypes.addressof(buf))
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    except OSError:
        pass


class Transport:
    """A packet socket on one interface of the calling thread's namespace."""

    def __init__(self, ifname: str) -> None:
        self.ifname = ifname
        try:
            socket.if_nametoindex(ifname)
        except OSError:  # Python raises it without an errno; callers tell "gone" by ENODEV
            raise OSError(errno.ENODEV, f"no interface {ifname!r}") from None
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_IP))
        try:
            _attach_client_port_filter(self.sock)
            self.sock.bind((ifname, ETH_P_IP))
            self.mac: bytes = self.sock.getsockname()[4][:6]
        except OSError:
            self.sock.close()
            raise

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, msg: M.Message, src: ipaddr.IPv4Address = ZERO_IP, dst: ipaddr.IPv4Address = BROADCAST_IP,
             dst_mac: bytes = BROADCAST_MAC) -> None:
        self.sock.sendto(_ip_udp(msg.encode(), src, dst), (self.ifname, ETH_P_IP, 0, 0, dst_mac))

    def receive(self, xid: int, deadline: float) -> tuple[M.Message, bytes, ipaddr.IPv4Address] | None:
        """The next server reply for ``xid`` before ``deadline``: (message, source MAC, source IP)."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                data, addr = self.sock.recvfrom(65535)
            except TimeoutError:
                return None
            if addr[2] == PACKET_OUTGOING or len(data) < 28 or data[0] >> 4 != 4 or data[9] != socket.IPPROTO_UDP:
                continue
            ihl = (data[0] & 0x0F) * 4
            if len(data) < ihl + 8:
                continue
            sport, dport, ulen = struct.unpack_from("!HHH", data, ihl)
            if dport != CLIENT_PORT or sport != SERVER_PORT:
                continue
            try:
                msg = M.Message.decode(data[ihl + 8:ihl + max(ulen, 8)])
            except M.MessageError:
                continue
            if msg.op != M.BOOTREPLY or msg.xid != xid or msg.chaddr[:6] != self.mac:
                continue
            return msg, bytes(addr[4][:6]), ipaddr.IPv4Address(data[12:16])


def _new_xid() -> int:
    return random.SystemRandom().getrandbits(32)


def _request_list(opts: ClientOptions) -> dict[int, bytes]:
    return {M.OPT_PARAM_REQUEST_LIST: bytes(opts.request)} if opts.request else {}


def _exchange(t: Transport, msg: M.Message, wanted: set[int], deadline: float,
              send: dict[str, object]) -> tuple[M.Message, bytes, ipaddr.IPv4Address]:
    """Send ``msg`` and retransmit (1 s, 2 s, 4 s ...) until a reply of a ``wanted`` type."""
    interval = 1.0
    while True:
        now = time.monotonic()
        if now >= deadline:
            raise DHCPTimeout(f"no DHCP{'/'.join(M.TYPE_NAMES[w] for w in sorted(wanted))} on {t.ifname}")
        t.send(msg, **send)  # type: ignore[arg-type]
        wait_until = min(deadline, now + interval)
        interval = min(interval * 2, 8.0)
        while True:
            got = t.receive(msg.xid, wait_until)
            if got is None:
                break
            reply = got[0]
            if reply.message_type == M.NAK:
                raise DHCPNak(reply.server_message or "server sent DHCPNAK")
            if reply.message_type in wanted:
                return got


def acquire(t: Transport, opts: ClientOptions, timeout: float,
            requested: ipaddr.IPv4Address | None = None) -> Binding:
    """INIT state: DISCOVER -> OFFER -> REQUEST -> ACK, all broadcast, within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    flags = M.FLAG_BROADCAST if opts.broadcast else 0
    discover = M.Message(xid=_new_xid(), flags=flags, chaddr=t.mac,
                         options={**opts.base_options(M.DISCOVER), **_request_list(opts)})
    if requested is not None:
        discover.options[M.OPT_REQUESTED_IP] = requested.packed
    offer, _, src_ip = _exchange(t, discover, {M.OFFER}, deadline, {})
    server_id = offer.server_id or src_ip
    request = M.Message(xid=discover.xid, flags=flags, chaddr=t.mac,
                        options={**opts.base_options(M.REQUEST), M.OPT_REQUESTED_IP: offer.yiaddr.packed,
                                 M.OPT_SERVER_ID: server_id.packed, **_request_list(opts)})
    ack, mac, src_ip = _exchange(t, request, {M.ACK}, deadline, {})
    return Binding(ack=ack, server_ip=ack.server_id or server_id, server_mac=mac, client_mac=t.mac)


def renew(t: Transport, opts: ClientOptions, binding: Binding, timeout: float, rebind: bool = False) -> Binding:
    """RENEWING (unicast to the server) or REBINDING (broadcast) REQUEST for the address held."""
    deadline = time.monotonic() + timeout
    msg = M.Message(xid=_new_xid(), chaddr=t.mac, ciaddr=binding.address,
                    flags=M.FLAG_BROADCAST if opts.broadcast else 0,
                    options={**opts.base_options(M.REQUEST), **_request_list(opts)})
    send: dict[str, object] = {"src": binding.address}
    if not rebind:
        send.update(dst=binding.server_ip, dst_mac=binding.server_mac)
    ack, mac, src_ip = _exchange(t, msg, {M.ACK}, deadline, send)
    return Binding(ack=ack, server_ip=ack.server_id or src_ip, server_mac=mac, client_mac=t.mac)


def _release_message(opts: ClientOptions, binding: Binding) -> M.Message:
    return M.Message(xid=_new_xid(), chaddr=binding.client_mac, ciaddr=binding.address,
                     options={**opts.base_options(M.RELEASE), M.OPT_SERVER_ID: binding.server_ip.packed})


def release(t: Transport, opts: ClientOptions, binding: Binding) -> None:
    """DHCPRELEASE to the server that granted the lease (no answer is expected)."""
    t.send(_release_message(opts, binding), src=binding.address, dst=binding.server_ip, dst_mac=binding.server_mac)


def release_routed(opts: ClientOptions, binding: Binding) -> None:
    """DHCPRELEASE through the calling thread's own routing, for when the container's interface
    is already gone (runtimes and bridge delete the link before IPAM DEL). The server finds the
    lease by client id, hardware address and ciaddr, not by where the packet came from."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(_release_message(opts, binding).encode(), (str(binding.server_ip), SERVER_PORT))

