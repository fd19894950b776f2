"""``pycni bgp``: the cluster's BGP settings and peers in etcd, and the sessions of a node's BIRD.

    pycni bgp config [--as-number N] [--mesh on|off] [--route-reflectors NODE[,NODE...]] [-o json]
    pycni bgp peer add NAME --peer-ip IP --as-number N [--node NODE]
    pycni bgp peer list [-o wide|json|yaml]
    pycni bgp peer delete NAME
    pycni bgp status [--node NODE] [--bgp-state-dir DIR] [-o wide|json|yaml]

The etcd verbs take the etcd flags of ``pycni node``; ``status`` asks the node's BIRD over its
control socket (run it on the node). Every agent in bgp mode follows a change at once.
"""

from __future__ import annotations

import re
import sys

from pycni.cluster.model import BgpConfig, BgpPeer, Keys
from pycni.spec.errors import TRY_AGAIN, CNIError, invalid_config

TYPE_CHECKING = False  # `pycni` builds every parser at start: keep this module's import cheap
if TYPE_CHECKING:
    import argparse
    from typing import Any

_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,62})$")


def add_parsers(sub: Any) -> None:
    """Register ``bgp`` and its actions on the ``pycni`` sub-parsers."""
    from pycni.cluster.bgp.agent import add_state_dir_argument
    from pycni.cluster.settings import add_etcd_arguments
    from pycni.output import add_output_argument

    bgp = sub.add_parser("bgp", help="BGP mode: settings, external peers, session status (docs/cluster.md)")
    bsub = bgp.add_subparsers(dest="bgp_verb", metavar="ACTION")
    bsub.required = True
    sp = bsub.add_parser("config", help="show or change the cluster's BGP settings (AS, mesh, route reflectors)")
    sp.add_argument("--as-number", type=int, help="the nodes' AS (default 64512; a node's --as-number wins)")
    sp.add_argument("--mesh", choices=("on", "off"), help="the node-to-node full mesh (default on)")
    sp.add_argument("--route-reflectors", metavar="NODE[,NODE...]",
                    help="with the mesh off, these nodes reflect routes and the others peer only with them "
                         "('' for none)")
    add_output_argument(sp, "settings")
    add_etcd_arguments(sp)
    sp.set_defaults(fn=_mapped(cmd_config))

    peer = bsub.add_parser("peer", help="BGP peers outside the cluster (top-of-rack routers)")
    psub = peer.add_subparsers(dest="peer_verb", metavar="ACTION")
    psub.required = True
    sp = psub.add_parser("add", help="add (or change) a peer: every node's, or one node's with --node")
    sp.add_argument("name", metavar="NAME", help="the peer's name (its key in etcd)")
    sp.add_argument("--peer-ip", required=True, help="the router's address")
    sp.add_argument("--as-number", type=int, required=True, help="the router's AS")
    sp.add_argument("--node", default="", help="only this node peers with it (default: every node)")
    add_etcd_arguments(sp)
    sp.set_defaults(fn=_mapped(cmd_peer_add))
    sp = psub.add_parser("list", help="the peers (columns NAME PEER-IP AS NODE)")
    add_output_argument(sp, "peers")
    add_etcd_arguments(sp)
    sp.set_defaults(fn=_mapped(cmd_peer_list))
    sp = psub.add_parser("delete", help="remove a peer: every node closes its session")
    sp.add_argument("name", metavar="NAME", help="the peer to delete (`pycni bgp peer list` names them)")
    add_etcd_arguments(sp)
    sp.set_defaults(fn=_mapped(cmd_peer_delete))

    sp = bsub.add_parser("status", help="this node's BGP sessions as its BIRD reports them "
                         "(peer, address, AS, state, since, routes imported/exported)")
    sp.add_argument("--node", default="", help="the node whose BIRD to ask (default: the host name)")
    add_state_dir_argument(sp)
    add_output_argument(sp, "sessions")
    sp.set_defaults(fn=cmd_status)


def _client(opts: argparse.Namespace) -> tuple[Any, Keys]:
    from pycni.cluster.settings import cli_client

    return cli_client(opts)


def _mapped(fn: Any) -> Any:
    from pycni.cluster.settings import etcd_errors_mapped

    return etcd_errors_mapped(fn)


def _check_as(n: int, flag: str = "--as-number") -> int:
    if not 0 < n < 1 << 32:
        raise invalid_config(f"invalid {flag} {n}", "an AS number is 1..4294967295")
    return n


def _check_name(text: str, what: str) -> str:
    if not _NAME.match(text):
        raise invalid_config(f"invalid {what} {text!r}", "letters, digits, '.', '_' and '-', up to 63, "
                             "starting with a letter or digit")
    return text


def cmd_config(opts: argparse.Namespace) -> int:
    """Show the settings; with any flag, change those and show the result."""
    from pycni.cluster.kv import if_absent, if_mod, op_put
    from pycni.output import emit

    changes: dict[str, Any] = {}
    if opts.as_number is not None:
        changes["as_number"] = _check_as(opts.as_number)
    if opts.mesh is not None:
        changes["mesh"] = opts.mesh == "on"
    if opts.route_reflectors is not None:
        changes["route_reflectors"] = [_check_name(n.strip(), "node name in --route-reflectors")
                                       for n in opts.route_reflectors.split(",") if n.strip()]
    kv, keys = _client(opts)
    with kv:
        for _ in range(8):
            cur = kv.get(keys.bgp_config)
            cfg = BgpConfig.from_json(cur.value) if cur is not None else BgpConfig()
            if not changes:
                break
            for k, v in changes.items():
                setattr(cfg, k, v)
            cond = if_mod(keys.bgp_config, cur.mod_revision) if cur is not None else if_absent(keys.bgp_config)
            if kv.txn([cond], [op_put(keys.bgp_config, cfg.to_json())]).succeeded:
                break
        else:
            raise CNIError(TRY_AGAIN, "pycni bgp config: the settings kept changing under this update; try again")
    if not cfg.mesh and not cfg.route_reflectors:
        sys.stderr.write("pycni: note: the mesh is off and no node reflects routes: nodes exchange no routes "
                         "(nodes of one AS then reach each other only by a default route from the routers)\n")
    emit(opts.output, [{"asNumber": cfg.as_number, "nodeToNodeMesh": cfg.mesh,
                        "routeReflectors": cfg.route_reflectors}],
         [("AS", "asNumber"), ("MESH", "nodeToNodeMesh"), ("ROUTE-REFLECTORS", "routeReflectors")])
    return 0


def cmd_peer_add(opts: argparse.Namespace) -> int:
    from pycni import ipaddr

    name = _check_name(opts.name, "peer name")
    try:
        ip = str(ipaddr.ip_address(opts.peer_ip))
    except ValueError:
        raise invalid_config(f"invalid --peer-ip {opts.peer_ip!r}", "give the router's IP address") from None
    node = _check_name(opts.node, "--node") if opts.node else ""
    peer = BgpPeer(name=name, peer_ip=ip, as_number=_check_as(opts.as_number), node=node)
    kv, keys = _client(opts)
    with kv:
        old = kv.get(keys.bgp_peer(name))
        kv.put(keys.bgp_peer(name), peer.to_json())
    print(f"bgp peer {name}: {'changed' if old is not None else 'added'} ({ip} AS {peer.as_number}, "
          f"{'node ' + node if node else 'every node'})")
    return 0


def _peers(kv: Any, keys: Keys) -> list[BgpPeer]:
    kvs, _ = kv.get_prefix(keys.bgp_peers)
    out = [BgpPeer.from_json(k.key[len(keys.bgp_peers):], k.value) for k in kvs]
    return sorted((p for p in out if p is not None), key=lambda p: p.name)


def cmd_peer_list(opts: argparse.Namespace) -> int:
    from pycni.output import emit

    kv, keys = _client(opts)
    with kv:
        peers = _peers(kv, keys)
    emit(opts.output, [{"name": p.name, "peerIP": p.peer_ip, "asNumber": p.as_number, "node": p.node or "(all)"}
                       for p in peers],
         [("NAME", "name"), ("PEER-IP", "peerIP"), ("AS", "asNumber"), ("NODE", "node")])
    return 0


def cmd_peer_delete(opts: argparse.Namespace) -> int:
    name = _check_name(opts.name, "peer name")
    kv, keys = _client(opts)
    with kv:
        gone = kv.delete(keys.bgp_peer(name))
    if not gone:
        sys.stderr.write(f"pycni: bgp peer {name} does not exist (`pycni bgp peer list` lists them)\n")
        return 1
    print(f"bgp peer {name}: deleted")
    return 0


def cmd_status(opts: argparse.Namespace) -> int:
    """Ask the node's BIRD; exit 3 when a session is not Established, 1 when BIRD does not answer."""
    import socket

    from pycni.cluster.bgp.agent import state_dir
    from pycni.cluster.bgp.bird import Bird, BirdError
    from pycni.output import emit

    node = opts.node or socket.gethostname()
    bird = Bird(state_dir(opts.bgp_state_dir, node))
    try:
        peers = bird.status()
    except BirdError as e:
        raise CNIError(TRY_AGAIN, f"pycni bgp status: BIRD of node {node} does not answer",
                       f"{e} (is `pycni node --mode bgp` running there, with this --bgp-state-dir?)") from None
    emit(opts.output, [p.as_dict() for p in peers],
         [("PEER", "name"), ("KIND", "kind"), ("ADDRESS", "address"), ("AS", "asNumber"), ("STATE", "state"),
          ("SINCE", "since"), ("IMPORTED", "routesImported"), ("EXPORTED", "routesExported")],
         [("PROTOCOL", "protocol"), ("INFO", "info")])
    return 0 if all(p.state == "Established" for p in peers) else 3
