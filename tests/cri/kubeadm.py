"""The pod network of a kubeadm-like node, shared by tests/test_cri.py and bench/cri.py."""

from __future__ import annotations

import json
from typing import Any

# the sandbox ("pause") image: busybox-static whose process serves /www on port 80, so a
# hostPort has something to reach
SANDBOX_IMAGE = "localhost/pycni-pause:test"
SANDBOX_CMD = ["/bin/httpd", "-f", "-p", "80", "-h", "/www"]
CONFLIST = "/etc/cni/net.d/10-k8s.conflist"
NETWORK = "k8s-pod-network"
SUBNET4, SUBNET6 = "10.92.0.0/24", "fd92::/64"
BRIDGE = "cr0"


def kubeadm_conflist(subnet4: str = SUBNET4, subnet6: str = SUBNET6, bridge: str = BRIDGE,
                     extra: list[dict[str, Any]] | None = None) -> str:
    """bridge (isGateway, ipMasq, hairpinMode) + host-local v4 and v6, portmap, bandwidth."""
    return json.dumps({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [
            {"type": "bridge", "bridge": bridge, "isGateway": True, "ipMasq": True, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet4}], [{"subnet": subnet6}]],
                      "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
            {"type": "bandwidth", "capabilities": {"bandwidth": True}},
            *(extra or []),
        ],
    }, indent=2)
