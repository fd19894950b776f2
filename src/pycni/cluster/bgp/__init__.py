"""BGP mode: pod blocks announced by BIRD 2, driven from etcd by ``pycni node --mode bgp`` (docs/cluster.md)."""
