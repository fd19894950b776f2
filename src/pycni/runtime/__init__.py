"""The runtime library (libcni's role): load network configurations, run plugin chains,
cache results in libcni's format, validate, GC and STATUS. Stdlib only.

    from pycni.runtime import CNI
    rt = CNI(conf_dir="/etc/cni/net.d", plugin_path=["/opt/cni/bin"])
    result = rt.add(rt.load_network("mynet"), "ctr1", "/var/run/netns/ctr1", "eth0")
"""

from pycni.runtime.api import CNI, Attachment, GCAttachment, RuntimeConf, build_config
from pycni.runtime.cache import DEFAULT_CACHE_DIR, CacheEntry
from pycni.runtime.conf import (
    DEFAULT_CONF_DIR,
    ConfigFile,
    NetworkConfig,
    NetworkConfigList,
    conf_from_bytes,
    conflist_from_bytes,
    conflist_from_file,
    load_network,
)

__all__ = [
    "CNI", "DEFAULT_CACHE_DIR", "DEFAULT_CONF_DIR", "Attachment", "CacheEntry", "ConfigFile", "GCAttachment",
    "NetworkConfig", "NetworkConfigList", "RuntimeConf", "build_config", "conf_from_bytes",
    "conflist_from_bytes", "conflist_from_file", "load_network",
]
