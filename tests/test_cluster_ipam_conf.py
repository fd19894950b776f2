"""cluster-ipam's config parsing (no etcd): everything is checked before any etcd call."""

from __future__ import annotations

import os
from typing import Any

import pytest

from pycni.plugins.ipam.cluster_ipam import parse_conf_dict
from pycni.spec.errors import CNIError


def conf(**ipam: Any) -> dict[str, Any]:
    section = {"type": "cluster-ipam", "etcdEndpoints": ["http://10.0.0.1:2379"],
               "ranges": [[{"subnet": "10.90.0.0/16"}], [{"subnet": "fd90::/64"}]]}
    section.update(ipam)
    return {"cniVersion": "1.1.0", "name": "net", "ipam": section}


def test_defaults() -> None:
    cfg = parse_conf_dict(conf())
    c = cfg.cluster
    assert c.etcd.prefix == "/pycni" and c.block_sizes == (26, 122) and c.node == os.uname().nodename
    assert c.etcd.timeout == 8 and not c.strict_affinity and len(cfg.range_sets) == 2


@pytest.mark.parametrize(("ipam", "sizes"), [({"blockSize": 24}, (24, 122)), ({"blockSize": 120}, (26, 120)),
                                             ({"blockSize": 28, "blockSizeV6": 124}, (28, 124))])
def test_block_sizes(ipam: dict[str, Any], sizes: tuple[int, int]) -> None:
    assert parse_conf_dict(conf(**ipam)).cluster.block_sizes == sizes


@pytest.mark.parametrize(("ipam", "cni_args", "needle"), [
    ({"blockSize": 120, "blockSizeV6": 124}, "", "blockSize"),
    ({"blockSize": 19}, "", "blockSize"),
    ({"blockSizeV6": 100}, "", "blockSizeV6"),
    ({"etcdPrefix": "pycni"}, "", "etcdPrefix"),
    ({"nodeName": "a/b"}, "", "nodeName"),
    ({"etcdKey": "/k.pem"}, "", "etcdKey"),
    ({"etcdTimeout": 301}, "", "etcdTimeout"),
    ({"etcdEndpoints": "http://10.0.0.1:2379"}, "", "etcdEndpoints"),
    ({"ranges": [[{"subnet": "10.90.0.0/16"}], [{"subnet": "10.90.1.0/24"}]]}, "", "overlaps"),
    ({}, "IP=10.91.0.5", "10.91.0.5"),                       # outside every range set
    ({}, "IP=10.90.0.5,10.90.0.6", "10.90.0.6"),             # two in one range set
])
def test_refused_with_code_7(ipam: dict[str, Any], cni_args: str, needle: str) -> None:
    with pytest.raises(CNIError) as err:
        parse_conf_dict(conf(**ipam), cni_args)
    assert err.value.code == 7 and needle in err.value.msg + err.value.details


def test_requested_ips_one_per_range_set() -> None:
    cfg = parse_conf_dict(dict(conf(), args={"cni": {"ips": ["fd90::5"]}}), "IP=10.90.0.5")
    assert [str(ip) for ip in cfg.requested] == ["10.90.0.5", "fd90::5"]


def test_del_needs_no_ranges() -> None:
    assert parse_conf_dict(conf(ranges=None), need_ranges=False).range_sets == []
    with pytest.raises(CNIError):
        parse_conf_dict(conf(ranges=None))
