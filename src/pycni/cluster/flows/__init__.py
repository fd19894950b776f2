"""Flows: what the node's policy rules logged, kept in a bounded ring and served on a local socket.

:mod:`.model` (the record, the prefix convention, the resolver seam, the ring),
:mod:`.collector` (the NFLOG reader thread and the flow metrics), :mod:`.server` (the query
socket and its client). docs/flows.md is the reference.
"""

DEFAULT_SOCKET = "/run/pycni/flows.sock"  # here, importing nothing: `pycni`'s parser names it at every start
