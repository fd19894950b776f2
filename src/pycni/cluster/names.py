"""Names in the kernel that routed writes and the policy agent matches: one home, importing nothing.

routed names a pod's host end :data:`HOST_PREFIX` + 12 hex digits; the policy table's fail-closed
rules match ``HOST_PREFIX*`` (:mod:`pycni.cluster.policy.compile`). Both import it from here, so
the plugin's start path loads no policy code and the agent no plugin. (The policy table's name,
``TABLE``, lives with routed's side of policy, :mod:`pycni.cluster.policy.workload`.)
"""

HOST_PREFIX = "rtd"  # routed's host interfaces
