"""The cluster: pycni's etcd client, the cluster IPAM store and the node agent.

Plugins stay thin and import from here only what one invocation needs; :mod:`.etcd` is the
single etcd v3 client of the project (stdlib, over etcd's JSON gateway).
"""
