"""The one codec of what pycni keeps in etcd: every key and every value, written and read here.

The store (:mod:`pycni.cluster.ipam`), the agent (:mod:`pycni.cluster.node`) and the CLI build
and parse keys only through :class:`Keys`, and values only through the records below, so the
layout exists once. Key layout (prefix P, default ``/pycni``; a CIDR in a key has '/' as '-')::

    P/ipam/blocks/<network>/<cidr>            Block     {"cidr", "node", "allocations": {"<ord>": "<cid>/<if>"}, "next"}
    P/ipam/affinity/<node>/<network>/<cidr>   Affinity  {"cidr", "node", "network"}
    P/ipam/handles/<network>/<cid>/<ifname>   handle    {"network", "containerID", "ifname", "node", "ips", "blocks"}
    P/ipam/deleted/<network>/<cid>/<ifname>   Tombstone {"node", "deleted"} on a lease: a DEL was here (see ipam.py)
    P/nodes/<name>                            NodeInfo  {"name", "underlayIP", "underlayIPs", "vtepMAC"?, "vtepIP"?}
    P/endpoints/<node>/<network>/<cid>/<if>   WorkloadEndpoint (one per attachment; see the class)
    P/pods/<namespace>/<pod>                  PodMeta   {"labels": {...}, "ports": [{"name", "port", "protocol"}]}
    P/namespaces/<namespace>                  PodMeta   {"labels": {...}}
    P/policies/<namespace>/<name>             a NetworkPolicy manifest as JSON (pycni.cluster.policy.model)
    P/kube/leader                             the kube-controllers leader's identity, on its lease
    P/kube/policystatus/<namespace>/<name>    PolicyStatus: a NetworkPolicy of the API pycni refused (why)
    P/bgp/config                              BgpConfig {"asNumber", "nodeToNodeMesh", "routeReflectors"}
    P/bgp/peers/<name>                        BgpPeer   {"name", "peerIP", "asNumber", "node"} (node "": every node)
    P/bgp/nodes/<name>                        BgpNode   {"asNumber"}: the AS a node's agent runs with

Values are compact JSON (``separators=(",", ":")``) except a node's, which is ``json.dumps``'s
default spacing with sorted keys; both byte-identical to what earlier releases wrote, so a
running cluster keeps working. To add a record kind (workload endpoints, policies): a prefix
and key builder on :class:`Keys`, a branch in :meth:`Keys.parse`, and a record with
``to_json``/``from_json`` here.
"""

from __future__ import annotations

from pycni import ipaddr
from pycni import jsonlite as json
from pycni.ipranges import IPAddress, IPNetwork, address
from pycni.record import field, record

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

DEFAULT_PREFIX = "/pycni"
_COMPACT = (",", ":")


def cidr_key(net: IPNetwork) -> str:
    """A CIDR as one key segment ('/' -> '-')."""
    return str(net).replace("/", "-")


def key_cidr(text: str) -> IPNetwork:
    """The CIDR of a key segment made by :func:`cidr_key` (ValueError when it is not one)."""
    addr, _, plen = text.rpartition("-")
    return ipaddr.ip_network(f"{addr}/{plen}")


@record
class ParsedKey:
    """What a key names: ``kind`` is "block", "affinity", "handle", "tombstone", "node", "endpoint",
    "pod", "namespace", "policy", "bgpconfig", "bgppeer" or "bgpnode"; the other fields are those the
    kind has ('' / None otherwise)."""

    kind: str
    network: str = ""
    node: str = ""
    cidr: IPNetwork | None = None
    container_id: str = ""
    ifname: str = ""
    namespace: str = ""
    name: str = ""


class Keys:
    """The key layout under one prefix."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        self.prefix = prefix.rstrip("/")
        p = self.prefix
        self.root = f"{p}/"
        self.nodes = f"{p}/nodes/"
        self.blocks = f"{p}/ipam/blocks/"
        self.affinities = f"{p}/ipam/affinity/"
        self.handles = f"{p}/ipam/handles/"
        self.tombstones = f"{p}/ipam/deleted/"
        self.endpoints = f"{p}/endpoints/"
        self.pods = f"{p}/pods/"
        self.namespaces = f"{p}/namespaces/"
        self.policies = f"{p}/policies/"
        # pycni.cluster.kube's own records: read by no agent (outside what the engine watches)
        self.kube = f"{p}/kube/"
        self.kube_leader = f"{p}/kube/leader"
        self.policy_statuses = f"{p}/kube/policystatus/"
        self.bgp = f"{p}/bgp/"
        self.bgp_config = f"{p}/bgp/config"
        self.bgp_peers = f"{p}/bgp/peers/"
        self.bgp_nodes = f"{p}/bgp/nodes/"

    # -- builders --

    def blocks_of(self, network: str) -> str:
        return f"{self.blocks}{network}/"

    def handles_of(self, network: str) -> str:
        return f"{self.handles}{network}/"

    def affinities_of(self, node: str, network: str) -> str:
        return f"{self.affinities}{node}/{network}/"

    def block(self, network: str, cidr: IPNetwork) -> str:
        return f"{self.blocks}{network}/{cidr_key(cidr)}"

    def affinity(self, node: str, network: str, cidr: IPNetwork) -> str:
        return f"{self.affinities}{node}/{network}/{cidr_key(cidr)}"

    def handle(self, network: str, container_id: str, ifname: str) -> str:
        return f"{self.handles}{network}/{container_id}/{ifname}"

    def tombstone(self, network: str, container_id: str, ifname: str) -> str:
        return f"{self.tombstones}{network}/{container_id}/{ifname}"

    def node(self, name: str) -> str:
        return f"{self.nodes}{name}"

    def endpoints_of(self, node: str, network: str = "") -> str:
        return f"{self.endpoints}{node}/" + (f"{network}/" if network else "")

    def endpoint(self, node: str, network: str, container_id: str, ifname: str) -> str:
        return f"{self.endpoints}{node}/{network}/{container_id}/{ifname}"

    def pod(self, namespace: str, name: str) -> str:
        return f"{self.pods}{namespace}/{name}"

    def namespace(self, name: str) -> str:
        return f"{self.namespaces}{name}"

    def policy(self, namespace: str, name: str) -> str:
        return f"{self.policies}{namespace}/{name}"

    def policy_status(self, namespace: str, name: str) -> str:
        return f"{self.policy_statuses}{namespace}/{name}"
    def bgp_peer(self, name: str) -> str:
        return f"{self.bgp_peers}{name}"

    def bgp_node(self, name: str) -> str:
        return f"{self.bgp_nodes}{name}"

    # -- parser --

    def parse(self, key: str) -> ParsedKey | None:
        """What ``key`` names, None for a key outside the layout (or a malformed one)."""
        try:
            if key.startswith(self.nodes):
                name = key[len(self.nodes):]
                return ParsedKey("node", node=name) if name and "/" not in name else None
            if key.startswith(self.blocks):
                network, _, c = key[len(self.blocks):].partition("/")
                return ParsedKey("block", network=network, cidr=key_cidr(c)) if network and "/" not in c else None
            if key.startswith(self.affinities):
                parts = key[len(self.affinities):].split("/")
                if len(parts) != 3 or not all(parts):
                    return None
                return ParsedKey("affinity", node=parts[0], network=parts[1], cidr=key_cidr(parts[2]))
            for kind, head in (("handle", self.handles), ("tombstone", self.tombstones)):
                if key.startswith(head):
                    parts = key[len(head):].split("/")
                    if len(parts) != 3 or not all(parts):
                        return None
                    return ParsedKey(kind, network=parts[0], container_id=parts[1], ifname=parts[2])
            if key.startswith(self.endpoints):
                parts = key[len(self.endpoints):].split("/")
                if len(parts) != 4 or not all(parts):
                    return None
                return ParsedKey("endpoint", node=parts[0], network=parts[1], container_id=parts[2], ifname=parts[3])
            for kind, prefix in (("pod", self.pods), ("policy", self.policies)):
                if key.startswith(prefix):
                    parts = key[len(prefix):].split("/")
                    if len(parts) != 2 or not all(parts):
                        return None
                    return ParsedKey(kind, namespace=parts[0], name=parts[1])
            if key.startswith(self.namespaces):
                name = key[len(self.namespaces):]
                return ParsedKey("namespace", namespace=name) if name and "/" not in name else None
            if key == self.bgp_config:
                return ParsedKey("bgpconfig")
            for kind, prefix in (("bgppeer", self.bgp_peers), ("bgpnode", self.bgp_nodes)):
                if key.startswith(prefix):
                    name = key[len(prefix):]
                    return ParsedKey(kind, name=name) if name and "/" not in name else None
        except ValueError:
            return None
        return None


# ---- values -------------------------------------------------------------------------------------


@record
class Block:
    """One block as stored, with the mod revision it was read at (0: not in etcd yet)."""

    cidr: IPNetwork
    node: str
    allocations: dict[int, str] = field(default_factory=dict)
    next: int = 0
    mod_revision: int = 0

    @classmethod
    def from_json(cls, text: str, mod_revision: int) -> Block:
        d = json.loads(text)
        return cls(cidr=ipaddr.ip_network(d["cidr"]), node=d.get("node", ""),
                   allocations={int(k): v for k, v in d.get("allocations", {}).items()},
                   next=int(d.get("next", 0)), mod_revision=mod_revision)

    def to_json(self) -> str:
        return json.dumps({"cidr": str(self.cidr), "node": self.node,
                           "allocations": {str(k): v for k, v in sorted(self.allocations.items())},
                           "next": self.next}, separators=_COMPACT)

    def ip(self, ordinal: int) -> IPAddress:
        return address(self.cidr.version, int(self.cidr.network_address) + ordinal)

    def ordinal(self, ip: IPAddress) -> int:
        return int(ip) - int(self.cidr.network_address)


@record
class Affinity:
    """A node's claim on a block of a network."""

    cidr: IPNetwork
    node: str
    network: str

    def to_json(self) -> str:
        return json.dumps({"cidr": str(self.cidr), "node": self.node, "network": self.network},
                          separators=_COMPACT)

    @classmethod
    def from_kv(cls, keys: Keys, key: str, value: str) -> Affinity | None:
        """The affinity at ``key``: the value's fields, the key's where the value lacks them
        (None when neither names a block)."""
        parsed = keys.parse(key)
        obj: Any = {}
        try:
            obj = json.loads(value)
        except ValueError:
            pass
        if not isinstance(obj, dict):
            obj = {}
        try:
            cidr = ipaddr.ip_network(obj["cidr"]) if obj.get("cidr") else (parsed.cidr if parsed else None)
        except (ValueError, TypeError):
            cidr = parsed.cidr if parsed else None
        if cidr is None:
            return None
        return cls(cidr=cidr, node=str(obj.get("node") or (parsed.node if parsed else "")),
                   network=str(obj.get("network") or (parsed.network if parsed else "")))


def handle_json(network: str, container_id: str, ifname: str, node: str, ips: Sequence[str],
                blocks: Sequence[str]) -> str:
    """A handle's value: who holds which addresses, in which blocks (decode with :func:`handle_from_json`)."""
    return handle_to_json({"network": network, "containerID": container_id, "ifname": ifname, "node": node,
                           "ips": list(ips), "blocks": list(blocks)})


def handle_to_json(obj: dict[str, Any]) -> str:
    """A handle object (as :func:`handle_from_json` gives it, maybe changed) as its stored value."""
    return json.dumps(obj, separators=_COMPACT)


def handle_from_json(text: str) -> dict[str, Any]:
    """A handle as the JSON object it is stored as (keys as in :func:`handle_json`)."""
    obj: dict[str, Any] = json.loads(text)
    return obj


@record
class Tombstone:
    """What a DEL leaves for the attachment: where and when (the node's wall clock, for an operator
    reading etcd; no decision uses it — the ADD compares the tombstone's mod revision). See
    :mod:`pycni.cluster.ipam`."""

    node: str
    deleted: float

    def to_json(self) -> str:
        return json.dumps({"node": self.node, "deleted": round(self.deleted, 6)}, separators=_COMPACT)

    @classmethod
    def from_json(cls, text: str) -> Tombstone:
        try:
            obj = json.loads(text)
            return cls(node=str(obj.get("node", "")), deleted=float(obj.get("deleted", 0)))
        except (ValueError, TypeError, AttributeError):
            return cls(node="", deleted=float("inf"))  # unreadable: treat as a DEL just now (the safe side)


def handle_holder(text: str) -> tuple[str, list[str]] | None:
    """(node, addresses) of a handle's value, None when it is not one."""
    try:
        obj = json.loads(text)
        return str(obj["node"]), [str(ipaddr.ip_interface(t).ip) for t in obj.get("ips", ())]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


@record
class NodeInfo:
    """A registered node, as ``P/nodes/<name>`` says."""

    name: str
    underlay_ips: list[str] = field(default_factory=list)  # the first is "underlayIP"
    vtep_mac: str = ""
    policy: bool = False  # its agent enforces network policy ("policy": true; absent from older agents)

    def underlay(self, version: int) -> str:
        """Its underlay address of IP ``version``, '' when it registered none."""
        return next((ip for ip in self.underlay_ips if ipaddr.ip_address(ip).version == version), "")

    def vtep_link_local(self) -> str:
        """Its VTEP's IPv6 next hop: the EUI-64 link-local address of its VTEP MAC, which its vxlan
        device carries by itself — IPv6 over the IPv4 overlay with no address to hand out."""
        b = [int(x, 16) for x in self.vtep_mac.split(":")]
        eui = [b[0] ^ 0x02, b[1], b[2], 0xFF, 0xFE, b[3], b[4], b[5]]
        return str(ipaddr.IPv6Address(bytes([0xFE, 0x80] + [0] * 6 + eui)))

    def vtep_neighbours(self) -> dict[str, str]:
        """The neighbour entries a peer needs on our vxlan device: its VTEP addresses -> its MAC."""
        return {self.underlay(4): self.vtep_mac, self.vtep_link_local(): self.vtep_mac}

    def to_json(self) -> str:
        obj: dict[str, Any] = {"name": self.name, "underlayIP": self.underlay_ips[0],
                               "underlayIPs": self.underlay_ips}
        if self.vtep_mac:
            obj["vtepMAC"] = self.vtep_mac
            obj["vtepIP"] = self.underlay(4)
        if self.policy:
            obj["policy"] = True
        return json.dumps(dict(sorted(obj.items())))  # json.dumps(sort_keys=True), as ever

    @classmethod
    def from_json(cls, name: str, text: str) -> NodeInfo | None:
        try:
            obj = json.loads(text)
            ips = obj.get("underlayIPs") or [obj["underlayIP"]]
            for ip in ips:
                ipaddr.ip_address(ip)
            return cls(name=str(obj.get("name") or name), underlay_ips=[str(i) for i in ips],
                       vtep_mac=str(obj.get("vtepMAC") or ""), policy=obj.get("policy") is True)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


@record
class WorkloadEndpoint:
    """One attachment of a pod, as the plugin records it at ADD (Calico's WorkloadEndpoint): where
    it is, whose it is, its host-side interface and addresses. ``pod`` is K8S_POD_NAME, or the
    container ID for a workload outside Kubernetes (``orchestrator`` "cni", namespace
    "default"); ``profiles`` names the network; ``defaultPolicy`` is the network's ("allow" or
    "deny"). Labels and named ports live in the pod's :class:`PodMeta` (set before or after the
    ADD); ``labels`` here are those known at ADD, merged under them."""

    node: str
    network: str
    namespace: str
    pod: str
    container_id: str
    ifname: str
    interface_name: str
    mac: str = ""
    ip_networks: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    profiles: list[str] = field(default_factory=list)
    orchestrator: str = "cni"
    default_policy: str = "allow"
    pod_uid: str = ""  # K8S_POD_UID at ADD ("podUID", written only when known): a pod re-created
    # under the same name is another pod, whose predecessor's attachment kube-controllers may release

    def to_json(self) -> str:
        obj = {"node": self.node, "network": self.network, "namespace": self.namespace,
               "pod": self.pod, "orchestrator": self.orchestrator, "containerID": self.container_id,
               "ifname": self.ifname, "interfaceName": self.interface_name, "mac": self.mac,
               "ipNetworks": list(self.ip_networks), "labels": dict(self.labels),
               "profiles": list(self.profiles), "defaultPolicy": self.default_policy}
        if self.pod_uid:
            obj["podUID"] = self.pod_uid
        return json.dumps(obj, separators=_COMPACT)

    @classmethod
    def from_json(cls, text: str) -> WorkloadEndpoint | None:
        """The endpoint, None when ``text`` is not one."""
        try:
            d = json.loads(text)
            return cls(node=str(d["node"]), network=str(d["network"]), namespace=str(d["namespace"]),
                       pod=str(d["pod"]), container_id=str(d["containerID"]), ifname=str(d["ifname"]),
                       interface_name=str(d["interfaceName"]), mac=str(d.get("mac", "")),
                       ip_networks=[str(ipaddr.ip_interface(n)) for n in d.get("ipNetworks", ())],
                       labels={str(k): str(v) for k, v in (d.get("labels") or {}).items()},
                       profiles=[str(p) for p in d.get("profiles", ())],
                       orchestrator=str(d.get("orchestrator", "cni")),
                       default_policy=str(d.get("defaultPolicy", "allow")), pod_uid=str(d.get("podUID") or ""))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    @property
    def workload(self) -> str:
        return f"{self.namespace}/{self.pod}"


@record
class PodMeta:
    """What an operator (or a Kubernetes sync) keeps about a pod or a namespace: its labels, and a
    pod's named ports (name, port, protocol). ``source`` says who wrote it ("k8s": the mirror of
    ``pycni kube-controllers``, which owns such records and removes them with the API object;
    "" : an operator's verb) and ``uid`` the API object's UID (a pod re-created under the same
    name is another pod). Both are written only when set, so older records keep their bytes."""

    labels: dict[str, str] = field(default_factory=dict)
    ports: list[tuple[str, int, str]] = field(default_factory=list)
    uid: str = ""
    source: str = ""

    def to_json(self) -> str:
        obj: dict[str, Any] = {"labels": dict(sorted(self.labels.items()))}
        if self.ports:
            obj["ports"] = [{"name": n, "port": p, "protocol": proto} for n, p, proto in sorted(self.ports)]
        if self.uid:
            obj["uid"] = self.uid
        if self.source:
            obj["source"] = self.source
        return json.dumps(obj, separators=_COMPACT)

    @classmethod
    def from_json(cls, text: str) -> PodMeta:
        """The record; an unreadable one reads as empty (no labels, no ports)."""
        try:
            d = json.loads(text)
            labels = {str(k): str(v) for k, v in (d.get("labels") or {}).items()}
            ports = [(str(p["name"]), int(p["port"]), str(p.get("protocol", "TCP"))) for p in d.get("ports") or ()]
            return cls(labels=labels, ports=ports, uid=str(d.get("uid") or ""), source=str(d.get("source") or ""))
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls()


@record
class PolicyStatus:
    """Why pycni refused a NetworkPolicy the Kubernetes API accepted (``P/kube/policystatus/NS/NAME``,
    written by ``pycni kube-controllers``, removed once the object is valid or gone): the object's
    resourceVersion and UID, and the validation error. The policy itself is then absent from
    ``P/policies/``: what is enforced is what was there before it (nothing, for a new one)."""

    error: str
    resource_version: str = ""
    uid: str = ""

    def to_json(self) -> str:
        return json.dumps({"error": self.error, "resourceVersion": self.resource_version, "uid": self.uid},
                          separators=_COMPACT)

    @classmethod
    def from_json(cls, text: str) -> PolicyStatus:
        try:
            d = json.loads(text)
            return cls(error=str(d["error"]), resource_version=str(d.get("resourceVersion", "")),
                       uid=str(d.get("uid", "")))
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls(error="unreadable status record")


# ---- BGP (pycni.cluster.bgp) --------------------------------------------------------------------

DEFAULT_AS = 64512  # the first private AS number, Calico's default too


def _as_number(value: Any) -> int:
    """An AS number (1..4294967295, 4-byte ASes included); ValueError otherwise."""
    n = int(value)
    if isinstance(value, bool) or not 0 < n < 1 << 32:
        raise ValueError(f"AS number {value!r} out of range")
    return n


@record
class BgpConfig:
    """The cluster's BGP settings: the default AS of the nodes, the node-to-node mesh (on unless
    turned off) and the nodes that reflect routes when it is off."""

    as_number: int = DEFAULT_AS
    mesh: bool = True
    route_reflectors: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"asNumber": self.as_number, "nodeToNodeMesh": self.mesh,
                           "routeReflectors": list(self.route_reflectors)}, separators=_COMPACT)

    @classmethod
    def from_json(cls, text: str) -> BgpConfig:
        """The record; an unreadable one reads as the defaults."""
        try:
            d = json.loads(text)
            return cls(as_number=_as_number(d.get("asNumber", DEFAULT_AS)), mesh=bool(d.get("nodeToNodeMesh", True)),
                       route_reflectors=[str(n) for n in d.get("routeReflectors") or ()])
        except (ValueError, TypeError, AttributeError):
            return cls()


@record
class BgpPeer:
    """A BGP peer outside the cluster (a top-of-rack router): every node's (``node`` '') or one node's."""

    name: str
    peer_ip: str
    as_number: int
    node: str = ""

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "peerIP": self.peer_ip, "asNumber": self.as_number,
                           "node": self.node}, separators=_COMPACT)

    @classmethod
    def from_json(cls, name: str, text: str) -> BgpPeer | None:
        """The peer, None when ``text`` is not one."""
        try:
            d = json.loads(text)
            return cls(name=str(d.get("name") or name), peer_ip=str(ipaddr.ip_address(d["peerIP"])),
                       as_number=_as_number(d["asNumber"]), node=str(d.get("node") or ""))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def bgp_node_json(as_number: int) -> str:
    """A node's BGP record: the AS its agent runs with (its mesh peers need it)."""
    return json.dumps({"asNumber": as_number}, separators=_COMPACT)


def bgp_node_as(text: str) -> int:
    """The AS of a node's BGP record, 0 when unreadable."""
    try:
        return _as_number(json.loads(text)["asNumber"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return 0
