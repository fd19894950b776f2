"""Kubernetes as the source of truth: ``pycni kube-controllers`` mirrors the API into etcd.

Modules: :mod:`.client` (the one place the ``kubernetes`` library is imported), :mod:`.informer`
(list + watch with client-go's semantics), :mod:`.leader` (one writer among replicas: an etcd
lease whose key guards every write), :mod:`.mirror` (API objects -> pycni's records, through
:mod:`pycni.cluster.policy.records`), :mod:`.controller` (the loop, node and pod garbage
collection), :mod:`.cli` (the verb). See docs/kubernetes.md.
"""
