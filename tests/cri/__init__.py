"""A small CRI v1 client for tests and benchmarks (kubelet's side of containerd's CRI socket)."""
