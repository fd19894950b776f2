"""The ``pycni kube-controllers`` verb (registered by :mod:`pycni.cli`)."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any


def add_parser(sub: Any) -> None:
    from pycni.cluster.kube.controller import DEFAULT_GRACE, DEFAULT_RESYNC
    from pycni.cluster.kube.leader import DEFAULT_TTL
    from pycni.cluster.settings import add_etcd_arguments

    text = "mirror Kubernetes pods, namespaces and NetworkPolicies into etcd (foreground; SIGTERM stops it)"
    sp = sub.add_parser("kube-controllers", help=text, description=text + ". See docs/kubernetes.md.")
    sp.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG", ""),
                    help="kubeconfig file (default $KUBECONFIG; none: the pod's service account)")
    add_etcd_arguments(sp)
    sp.add_argument("--resync", type=float, default=DEFAULT_RESYNC,
                    help=f"seconds between full reconciles of etcd against the API (default {DEFAULT_RESYNC:g})")
    sp.add_argument("--gc-grace", type=float, default=DEFAULT_GRACE,
                    help="seconds a pod or node must be gone from the API before its addresses are released "
                         f"(default {DEFAULT_GRACE:g})")
    sp.add_argument("--lease-ttl", type=int, default=DEFAULT_TTL,
                    help=f"leader lease in seconds: how long a dead leader blocks a standby (default {DEFAULT_TTL})")
    sp.add_argument("--identity", default="", help="this replica's name in the leader key (default host/pid)")
    sp.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                    help="how much to log on stderr (default: %(default)s)")
    from pycni.metrics import add_argument as add_metrics_argument

    add_metrics_argument(sp)
    sp.set_defaults(fn=main)


def main(opts: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT; a configuration that cannot work is one line and code 7."""
    import logging
    import signal

    from pycni.cluster.kube.client import KubeClient, KubeError
    from pycni.cluster.kube.controller import Controller
    from pycni.cluster.settings import etcd_settings_from_args
    from pycni.spec.errors import invalid_config

    logging.basicConfig(level=opts.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    etcd = etcd_settings_from_args(opts)
    if opts.resync <= 0 or opts.gc_grace < 0 or opts.lease_ttl < 2:
        raise invalid_config("invalid kube-controllers timing", "--resync > 0, --gc-grace >= 0, --lease-ttl >= 2")
    try:
        kube = KubeClient(opts.kubeconfig)
    except ImportError:
        raise invalid_config("pycni kube-controllers needs the kubernetes client library",
                             "install it with: pip install 'pycni[kube]'") from None
    except KubeError as e:
        raise invalid_config("cannot reach the Kubernetes API", str(e)) from None
    ctl = Controller(kube, etcd, resync=opts.resync, grace=opts.gc_grace, lease_ttl=opts.lease_ttl,
                     identity=opts.identity)
    if opts.metrics_address is not None:
        from pycni import metrics
        from pycni.cluster.metrics import KubeMetrics

        reg = metrics.registry()
        KubeMetrics(ctl, reg)
        try:
            metrics.serve(opts.metrics_address, reg)
        except OSError as e:
            raise invalid_config(f"cannot serve metrics on {opts.metrics_address[0]}:{opts.metrics_address[1]}",
                                 e.strerror or str(e)) from None

    def stop(_sig: int, _frame: Any) -> None:
        ctl.stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        return ctl.run()
    finally:
        kube.close()
        ctl.kv.close()
