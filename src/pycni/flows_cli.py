"""``pycni flows``: the recent connections of this node's pods, as its agent logged them.

    pycni flows [-n NS] [--pod NS/POD] [--verdict allowed|denied] [--follow] [-o wide|json|yaml] [--socket PATH]

Asks the agent on its flows socket (docs/flows.md) and prints a table (TIME SOURCE DESTINATION
PORT PROTO DIRECTION VERDICT POLICY) through :mod:`pycni.output`; ``--follow`` keeps printing
new flows until interrupted. Exit 0 when answered, 1 with one ``pycni:`` line naming the socket
when no agent answers there (or it refuses the request), 2 for a usage error.
"""

from __future__ import annotations

import sys
import time

TYPE_CHECKING = False  # `pycni` builds every parser at start: keep this module's import cheap
if TYPE_CHECKING:
    import argparse
    from typing import Any

COLUMNS = (("TIME", "when"), ("SOURCE", "source"), ("DESTINATION", "destination"), ("PORT", "port"),
           ("PROTO", "proto"), ("DIRECTION", "direction"), ("VERDICT", "verdict"), ("POLICY", "decided_by"))
WIDTHS = (23, 26, 26, 5, 6, 9, 7, 10)  # --follow's fixed columns (a table cannot wait for its widest cell)
WIDE = (("SRC-ADDR", "src_addr"), ("SPORT", "sport"), ("DST-ADDR", "dst_addr"), ("ENDPOINT", "endpoint"))
WIDE_WIDTHS = (15, 5, 15, 20)


def _pod(text: str) -> str:
    import argparse

    ns, sep, pod = text.partition("/")
    if not (sep and ns and pod) or "/" in pod:
        raise argparse.ArgumentTypeError(f"{text!r} is not NS/POD")
    return text


def _namespace(text: str) -> str:
    import argparse

    if not text or "/" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a namespace name")
    return text


def add_parser(sub: Any) -> None:
    """Register ``flows`` on the ``pycni`` sub-parsers."""
    from pycni.cluster.flows import DEFAULT_SOCKET
    from pycni.output import add_output_argument

    text = "recent connections of this node's pods: who, to which port, allowed or denied, and by which policy"
    sp = sub.add_parser("flows", help=text, description=text + ". Asks the node agent (`pycni node`) on its "
                        "flows socket; see docs/flows.md.")
    sp.add_argument("-n", "--namespace", type=_namespace, default=None, metavar="NS",
                    help="only flows with a pod of namespace NS at either end")
    sp.add_argument("--pod", type=_pod, default=None, metavar="NS/POD", help="only flows from or to pod NS/POD")
    sp.add_argument("--verdict", choices=("allowed", "denied"), default="",
                    help="only the flows policy allowed, or only those it denied")
    sp.add_argument("-f", "--follow", action="store_true",
                    help="after the recent flows, print each new one as it comes, until interrupted")
    sp.add_argument("--socket", default=DEFAULT_SOCKET, metavar="PATH",
                    help=f"the agent's flows socket (its --flows-socket; default {DEFAULT_SOCKET})")
    add_output_argument(sp, "flows")
    sp.set_defaults(fn=cmd_flows)


def _row(flow: dict[str, Any]) -> dict[str, Any]:
    """A flow as the table shows it: the time in UTC to the millisecond, ICMP's type/code as its
    port, the policy or else the reason under POLICY."""
    stamp = float(flow.get("time") or 0)
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp)) + f".{int(stamp * 1000) % 1000:03d}Z"
    port = flow.get("port")
    if port is None and flow.get("icmp_type") is not None:
        port = f"{flow['icmp_type']}/{flow.get('icmp_code') or 0}"
    return {**flow, "when": when, "port": port, "decided_by": flow.get("policy") or flow.get("reason")}


def cmd_flows(args: argparse.Namespace) -> int:
    from pycni.cluster.flows.model import QueryError
    from pycni.cluster.flows.server import NoAgent, query
    from pycni.output import emit, emit_stream

    request = {"namespace": args.namespace or "", "pod": args.pod or "", "verdict": args.verdict, "follow": args.follow}
    structured = args.output in ("json", "yaml")
    try:
        flows = query(args.socket, request)
        if args.follow:
            emit_stream(args.output, (f if structured else _row(f) for f in flows), COLUMNS, WIDTHS,
                        WIDE, WIDE_WIDTHS)
        else:
            got = list(flows)
            emit(args.output, got if structured else [_row(f) for f in got], COLUMNS, WIDE)
    except NoAgent as e:
        sys.stderr.write(f"pycni: {e}\n")
        return 1
    except QueryError as e:
        sys.stderr.write(f"pycni: the flows agent on {args.socket} refused the request: {e}\n")
        return 1
    except BrokenPipeError:  # `pycni flows --follow | head`: the reader is done
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
