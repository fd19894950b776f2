"""Running networks: ADD / DEL / CHECK / GC / STATUS / validate, with libcni's result cache.

The runtime's side of the spec (libcni's CNIConfig). Three lines attach a namespace::

    rt = CNI(conf_dir="/etc/cni/net.d", plugin_path=["/opt/cni/bin"])
    net = rt.load_network("mynet")
    result = rt.add(net, "ctr1", "/var/run/netns/ctr1", "eth0")

Plugins run as child processes forked from the calling thread, so they start in that
thread's network namespace (``with netns.enter(host): rt.add(...)`` runs them "on" host).
Every failure is a :class:`CNIError`. Stdlib only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

from pycni import invoke
from pycni.record import field, record
from pycni.runtime import cache as _cache
from pycni.runtime import conf as _conf
from pycni.runtime.conf import NetworkConfig, NetworkConfigList, go_json, sorted_keys
from pycni.spec.errors import DECODE_FAILURE, INCOMPATIBLE_VERSION, INVALID_ENV, UNKNOWN_CONTAINER, CNIError
from pycni.spec.types import Result
from pycni.spec.validate import validate_container_id, validate_interface_name, validate_network_name
from pycni.spec.version import greater_than_or_equal

TYPE_CHECKING = False  # not typing's: importing typing costs a process ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

Network = NetworkConfigList | NetworkConfig


@record
class RuntimeConf:
    """The per-attachment arguments of one operation (libcni's RuntimeConf).

    ``args`` become CNI_ARGS (``K=V;K=V``); ``capability_args`` feed each plugin's
    ``runtimeConfig``, filtered by the capabilities the plugin declares.
    """

    container_id: str
    netns: str = ""
    ifname: str = "eth0"
    args: list[tuple[str, str]] = field(default_factory=list)
    capability_args: dict[str, Any] = field(default_factory=dict)

    def cni_args(self) -> str:
        return ";".join(f"{k}={v}" for k, v in self.args)


@record
class GCAttachment:
    """An attachment still in use, passed to GC (spec 1.1 ``cni.dev/valid-attachments``)."""

    container_id: str
    ifname: str

    def to_dict(self) -> dict[str, str]:
        return {"containerID": self.container_id, "ifname": self.ifname}


@record
class Attachment:
    """A cached attachment (libcni's NetworkAttachment)."""

    container_id: str
    network: str
    ifname: str
    config: bytes
    netns: str = ""
    cni_args: list[tuple[str, str]] = field(default_factory=list)
    capability_args: dict[str, Any] = field(default_factory=dict)


@record
class _Chain:
    """What an operation needs of a network, whether a list or a single plugin config."""

    name: str
    version: str
    plugins: list[NetworkConfig]
    bytes: bytes
    disable_check: bool = False
    disable_gc: bool = False


def _chain(net: Network) -> _Chain:
    """A single config or a list, seen the same way: a chain of plugins (a bare .conf defaults to 0.1.0)."""
    if isinstance(net, NetworkConfigList):
        return _Chain(net.name, net.cni_version, net.plugins, net.bytes, net.disable_check, net.disable_gc)
    if isinstance(net, NetworkConfig):
        return _Chain(net.name, net.cni_version or "0.1.0", [net], net.bytes)
    raise TypeError(f"expected a NetworkConfigList or NetworkConfig, got {type(net).__name__}")


def build_config(name: str, cni_version: str, plugin: NetworkConfig, prev_result: Result | None = None,
                 rt: RuntimeConf | None = None, extra: Mapping[str, Any] | None = None) -> bytes:
    """The stdin of one plugin execution, byte for byte as libcni builds it.

    The plugin object with ``name`` and ``cniVersion`` of the network, ``prevResult``
    (in the network's version) and ``runtimeConfig``: the capability args the runtime
    offers for the capabilities the plugin enables, replacing any runtimeConfig in the file.
    """
    conf: dict[str, Any] = dict(plugin.raw)
    conf["name"] = name
    conf["cniVersion"] = cni_version
    if rt is not None:
        rc = {cap: rt.capability_args[cap] for cap, on in plugin.capabilities.items()
              if on and cap in rt.capability_args}
        if rc:
            conf["runtimeConfig"] = rc
    if extra:
        conf.update(extra)
    out = sorted_keys({k: v for k, v in conf.items() if k != "prevResult"})
    if prev_result is not None:
        out["prevResult"] = prev_result.to_dict(cni_version)  # Go keeps the result type's field order
    elif "prevResult" in conf:
        out["prevResult"] = sorted_keys(conf["prevResult"])
    return go_json({k: out[k] for k in sorted(out)})


def _joined(errors: Sequence[CNIError]) -> CNIError:
    """Several errors as one: the first one's code, every message and detail in order."""
    first = errors[0]
    if len(errors) == 1:
        return first
    return CNIError(first.code, "; ".join(e.msg for e in errors), "; ".join(e.details for e in errors if e.details))


def _wrap(plugin: NetworkConfig, op: str, e: CNIError) -> CNIError:
    """A plugin's error with the plugin and operation named in front, as libcni reports it."""
    return CNIError(e.code, f"plugin {plugin.describe()} failed ({op}): {e.msg}", e.details, e.cni_version)


def _reason(e: CNIError) -> tuple[int, str, str]:
    """What went wrong, without the plugin and operation :func:`_wrap` put in front."""
    return e.code, e.msg.partition(" failed (")[2].partition("): ")[2] or e.msg, e.details


class CNI:
    """A CNI runtime: where configurations, plugins and the result cache live.

    ``conf_dir``     directory of ``.conflist`` / ``.conf`` files (NETCONFPATH)
    ``plugin_path``  directories searched for plugin binaries (CNI_PATH); default: $CNI_PATH
    ``cache_dir``    root of the result cache (libcni's default /var/lib/cni)
    ``env``          base environment for plugins (default: this process's, read per call)
    ``timeout``      seconds a plugin may run before it is killed (default: no limit)
    """

    def __init__(self, conf_dir: str = _conf.DEFAULT_CONF_DIR, plugin_path: Sequence[str] | None = None,
                 cache_dir: str = _cache.DEFAULT_CACHE_DIR, env: Mapping[str, str] | None = None,
                 timeout: float | None = None) -> None:
        self.conf_dir = conf_dir
        if plugin_path is None:
            plugin_path = [p for p in os.environ.get("CNI_PATH", "").split(os.pathsep) if p]
        self.plugin_path = list(plugin_path)
        self.cache_dir = cache_dir or _cache.DEFAULT_CACHE_DIR
        self.env = env
        self.timeout = timeout

    # ---- configurations ---------------------------------------------------------------------
    def load_network(self, name: str) -> NetworkConfigList:
        """The network ``name`` from ``conf_dir`` (first match in lexical order; code 7 if none)."""
        return _conf.load_network(self.conf_dir, name)

    def networks(self) -> list[_conf.ConfigFile]:
        """Every configuration file in ``conf_dir``, parsed one by one (errors kept, not raised)."""
        return _conf.scan(self.conf_dir)

    # ---- attachment operations --------------------------------------------------------------
    def add(self, net: Network, container_id: str, netns: str, ifname: str = "eth0", *,
            args: str | Iterable[tuple[str, str]] | Mapping[str, str] | None = None,
            capability_args: Mapping[str, Any] | None = None) -> Result:
        """ADD every plugin in order, threading prevResult; cache and return the final result."""
        return self.add_rt(net, self.runtime_conf(container_id, netns, ifname, args, capability_args))

    def delete(self, net: Network, container_id: str, netns: str = "", ifname: str = "eth0", *,
               args: str | Iterable[tuple[str, str]] | Mapping[str, str] | None = None,
               capability_args: Mapping[str, Any] | None = None) -> None:
        """DEL every plugin in reverse order with the cached result, then drop the cache entry."""
        self.delete_rt(net, self.runtime_conf(container_id, netns, ifname, args, capability_args))

    def check(self, net: Network, container_id: str, netns: str, ifname: str = "eth0", *,
              args: str | Iterable[tuple[str, str]] | Mapping[str, str] | None = None,
              capability_args: Mapping[str, Any] | None = None) -> None:
        """CHECK every plugin in order against the cached ADD result."""
        self.check_rt(net, self.runtime_conf(container_id, netns, ifname, args, capability_args))

    @staticmethod
    def runtime_conf(container_id: str, netns: str = "", ifname: str = "eth0",
                     args: str | Iterable[tuple[str, str]] | Mapping[str, str] | None = None,
                     capability_args: Mapping[str, Any] | None = None) -> RuntimeConf:
        """A :class:`RuntimeConf`; ``args`` as CNI_ARGS text, pairs or a mapping."""
        if isinstance(args, str):  # CNI_ARGS text, "K=V;K=V"
            from pycni.cniargs import runtime_args

            args = runtime_args(args)
        pairs = list(args.items()) if isinstance(args, Mapping) else [(str(k), str(v)) for k, v in args or ()]
        return RuntimeConf(container_id=container_id, netns=netns, ifname=ifname, args=pairs,
                           capability_args=dict(capability_args or {}))

    def add_rt(self, net: Network, rt: RuntimeConf) -> Result:
        """:meth:`add` with a prepared :class:`RuntimeConf` (libcni's AddNetworkList).

        When a plugin fails, the whole chain is DELeted (in reverse, with the partial result
        as prevResult) before the error is returned, as CRI runtimes do, so a retry starts
        clean. If that DEL fails too, the partial result is cached for a later DEL or GC and
        both errors are reported.
        """
        chain = _chain(net)
        self._validate_attachment(chain, rt)
        self._refuse_cached(chain, rt)
        paths = [self._find(p) for p in chain.plugins]
        with _cache.adding(self.cache_dir, chain.name, rt.container_id, rt.ifname):
            result: Result | None = None
            for plugin, path in zip(chain.plugins, paths, strict=True):
                stdin = build_config(chain.name, chain.version, plugin, result, rt)
                try:
                    out = invoke.exec_with_result(path, stdin, self._env("ADD", rt), self.timeout)
                    result = self._as_version(out, chain.version)
                except CNIError as e:
                    raise self._undo_add(chain, rt, result, _wrap(plugin, "add", e)) from None
            assert result is not None  # a chain has at least one plugin
            try:
                self._cache(chain, rt, result)
            except CNIError as e:  # an attachment nobody can find again must not stay
                raise self._undo_add(chain, rt, result, e) from None
        return result

    def _refuse_cached(self, chain: _Chain, rt: RuntimeConf) -> None:
        """Refuse an ADD of an attachment the cache already holds, before any plugin runs: the
        plugins would refuse it (its interface exists) and the rollback of that failure would DEL
        the live attachment. libcni leaves this to its caller; cnitool never rolls back."""
        path = _cache.cache_file(self.cache_dir, chain.name, rt.container_id, rt.ifname)
        if os.path.lexists(path):
            raise CNIError(INVALID_ENV, f"attachment {rt.container_id}:{rt.ifname} of network {chain.name!r} "
                           "already exists", f"its result is cached in {path}; DEL it first (or use another "
                           "container ID or interface name)")

    def _undo_add(self, chain: _Chain, rt: RuntimeConf, partial: Result | None, error: CNIError) -> CNIError:
        """DEL the chain after a failed ADD; the ADD's error, with the DEL's appended if it failed."""
        failures = self._run_each(chain, reversed(chain.plugins), "DEL", "delete", rt, partial, keep_going=True)
        if not failures:
            return error
        try:
            self._cache(chain, rt, partial)  # so that DEL or GC can finish the clean-up later
        except CNIError:
            pass  # reported below; the cache is what failed in the first place
        # A DEL refused for the ADD's own reason (the same bad config, say) adds nothing to it.
        failures = [e for e in failures if _reason(e) != _reason(error)]
        if not failures:
            return error
        return CNIError(error.code, error.msg, "; ".join(
            [error.details] * bool(error.details)
            + [f"cleaning up after the failed ADD also failed: {e.msg}" for e in failures]), error.cni_version)

    def _cache(self, chain: _Chain, rt: RuntimeConf, result: Result | None) -> None:
        _cache.write_entry(self.cache_dir, _cache.CacheEntry(
            network_name=chain.name, container_id=rt.container_id, ifname=rt.ifname, config=chain.bytes,
            netns=rt.netns, cni_args=list(rt.args), capability_args=dict(rt.capability_args),
            result=result.to_dict(chain.version) if result is not None else None))

    def delete_rt(self, net: Network, rt: RuntimeConf) -> None:
        """:meth:`delete` with a prepared :class:`RuntimeConf` (libcni's DelNetworkList).

        Unlike libcni, a plugin's failure does not stop the walk: every plugin's DEL runs, the
        errors are reported together, and the cache entry is kept so a retry still has it.
        """
        chain = _chain(net)
        self._validate_attachment(chain, rt)
        cached: Result | None = None
        if greater_than_or_equal(chain.version, "0.4.0"):
            try:
                cached = self._cached_result(chain, rt.container_id, rt.ifname)
            except CNIError:  # an unreadable entry must not block DEL (as newer libcni)
                _cache.delete_entry(self.cache_dir, chain.name, rt.container_id, rt.ifname)
                cached = None
        failures = self._run_each(chain, reversed(chain.plugins), "DEL", "delete", rt, cached, keep_going=True)
        if failures:
            raise _joined(failures)
        _cache.delete_entry(self.cache_dir, chain.name, rt.container_id, rt.ifname)

    def check_rt(self, net: Network, rt: RuntimeConf) -> None:
        """:meth:`check` with a prepared :class:`RuntimeConf` (libcni's CheckNetworkList)."""
        chain = _chain(net)
        if not greater_than_or_equal(chain.version, "0.4.0"):
            raise CNIError(INCOMPATIBLE_VERSION, f'configuration version "{chain.version}" does not support '
                           "the CHECK command", "CHECK needs cniVersion 0.4.0 or later")
        if chain.disable_check:
            return
        self._validate_attachment(chain, rt)
        cached = self._cached_result(chain, rt.container_id, rt.ifname)
        if cached is None:
            raise CNIError(UNKNOWN_CONTAINER, f"no cached result for network {chain.name!r}, container "
                           f"{rt.container_id!r}, interface {rt.ifname!r}",
                           f"CHECK needs the result of an earlier ADD, cached under {self.cache_dir}; "
                           "was the attachment added (with the same cache dir)?")
        self._run_each(chain, chain.plugins, "CHECK", "check", rt, cached)

    def _run_each(self, chain: _Chain, plugins: Iterable[NetworkConfig], command: str, op: str,
                  rt: RuntimeConf, prev: Result | None, keep_going: bool = False) -> list[CNIError]:
        """Exec ``command`` for each plugin in turn with ``prev`` as prevResult; errors reported as
        libcni does (see :func:`_wrap`). The first failure stops the walk and is raised, unless
        ``keep_going``: then every plugin runs and the failures are returned."""
        failures: list[CNIError] = []
        for plugin in plugins:
            try:
                path = self._find(plugin)
                stdin = build_config(chain.name, chain.version, plugin, prev, rt)
                invoke.exec_plugin(path, stdin, self._env(command, rt), self.timeout)
            except CNIError as e:
                if not keep_going:
                    raise _wrap(plugin, op, e) from None
                failures.append(_wrap(plugin, op, e))
        return failures

    # ---- network-wide operations ------------------------------------------------------------
    def gc(self, net: NetworkConfigList,
           valid_attachments: Iterable[GCAttachment | tuple[str, str]] | None = None) -> None:
        """Spec 1.1 GC: DEL cached attachments not in ``valid_attachments``, then GC each plugin.

        ``None`` (what cnitool passes) means no attachment is known valid: all cached ones of
        this network are deleted and, as libcni, plugins get no ``cni.dev/valid-attachments`` —
        which ours refuse (code 7) rather than free what other runtimes hold. Attachments whose
        ADD is in flight (see :func:`pycni.runtime.cache.adding`) are always kept, and listed.
        Errors are collected and raised together; ``disableGC`` makes this a no-op.
        """
        chain = _chain(net)
        if chain.disable_gc:
            return
        valid: list[GCAttachment] | None = None
        if valid_attachments is not None:
            valid = [a if isinstance(a, GCAttachment) else GCAttachment(*a) for a in valid_attachments]
        keep = {(a.container_id, a.ifname) for a in valid or ()}
        # An attachment whose ADD is running now is not stale, listed or not.
        adding = [(cid, ifname) for network, cid, ifname in _cache.in_flight(self.cache_dir)
                  if network == chain.name and (cid, ifname) not in keep]
        keep.update(adding)
        errors: list[CNIError] = []
        for entry in _cache.list_entries(self.cache_dir):
            if entry.network_name != chain.name or (entry.container_id, entry.ifname) in keep:
                continue
            rt = RuntimeConf(entry.container_id, entry.netns, entry.ifname, list(entry.cni_args),
                             dict(entry.capability_args))
            try:
                self.delete_rt(net, rt)
            except CNIError as e:
                errors.append(CNIError(e.code, f"failed to delete stale attachment {rt.container_id} "
                                       f"{rt.ifname}: {e.msg}", e.details))
        if greater_than_or_equal(chain.version, "1.1.0"):
            extra: dict[str, Any] = {}
            if valid is not None:
                # In-flight ADDs are listed too: a plugin must not free what is being set up.
                listed = [a.to_dict() for a in valid] + [GCAttachment(*a).to_dict() for a in adding]
                # libcni sets both keys: the spec's name and the one it used before (#1101)
                extra = {"cni.dev/valid-attachments": listed, "cni.dev/attachments": listed}
            for plugin in chain.plugins:
                try:
                    stdin = build_config(chain.name, chain.version, plugin, extra=extra)
                    invoke.exec_plugin(self._find(plugin), stdin, self._env("GC", None), self.timeout)
                except CNIError as e:
                    errors.append(_wrap(plugin, "gc", e))
        if errors:
            raise _joined(errors)

    def status(self, net: NetworkConfigList) -> None:
        """Spec 1.1 STATUS of every plugin; raises the first plugin's error (e.g. code 50)."""
        chain = _chain(net)
        if not greater_than_or_equal(chain.version, "1.1.0"):
            return
        for plugin in chain.plugins:
            try:
                stdin = build_config(chain.name, chain.version, plugin)
                invoke.exec_plugin(self._find(plugin), stdin, self._env("STATUS", None), self.timeout)
            except CNIError as e:
                raise _wrap(plugin, "status", e) from None

    def validate(self, net: Network) -> list[str]:
        """Every plugin found and speaking the network's version; the enabled capabilities.

        All problems are reported together (code of the first).
        """
        chain = _chain(net)
        errors: list[CNIError] = []
        caps: set[str] = set()
        for plugin in chain.plugins:
            caps.update(plugin.enabled_capabilities())
            try:
                info = self.version_info(plugin.type)
            except CNIError as e:
                errors.append(CNIError(e.code, f"plugin {plugin.describe()}: {e.msg}", e.details))
                continue
            supported = [str(v) for v in info.get("supportedVersions") or []]
            if chain.version not in supported:
                errors.append(CNIError(INCOMPATIBLE_VERSION, f"plugin {plugin.type} does not support config "
                                       f'version "{chain.version}"', f"it supports {supported}"))
        if errors:
            raise CNIError(errors[0].code, "; ".join(e.msg for e in errors),
                           "; ".join(e.details for e in errors if e.details))
        return sorted(caps)

    def version_info(self, plugin_type: str) -> dict[str, Any]:
        """The VERSION answer of the plugin ``plugin_type`` found on the plugin path."""
        path = invoke.find_in_path(plugin_type, self.plugin_path)
        return invoke.get_version_info(path, self._env("VERSION", None))

    # ---- the cache ----------------------------------------------------------------------------
    def get_cached_result(self, net: Network, container_id: str, ifname: str = "eth0") -> Result | None:
        """The cached ADD result converted to the network's version, or None."""
        return self._cached_result(_chain(net), container_id, ifname)

    def get_cached_config(self, net: Network, container_id: str,
                          ifname: str = "eth0") -> tuple[bytes, RuntimeConf] | None:
        """The config bytes and runtime arguments cached at ADD, or None."""
        chain = _chain(net)
        entry = _cache.read_entry(self.cache_dir, chain.name, container_id, ifname)
        if entry is None:
            return None
        if entry.legacy:
            raise CNIError(DECODE_FAILURE, f"cached network {chain.name!r} config has the wrong kind",
                           "the cache file predates cniCacheV1 and holds only a result")
        return entry.config, RuntimeConf(container_id, entry.netns, ifname, list(entry.cni_args),
                                         dict(entry.capability_args))

    def cached_attachments(self, container_id: str = "") -> list[Attachment]:
        """Every cached attachment (of ``container_id`` if given), as GetCachedAttachments."""
        return [Attachment(e.container_id, e.network_name, e.ifname, e.config, e.netns, list(e.cni_args),
                           dict(e.capability_args)) for e in _cache.list_entries(self.cache_dir, container_id)]

    # ---- internals ----------------------------------------------------------------------------
    def _cached_result(self, chain: _Chain, container_id: str, ifname: str) -> Result | None:
        """The cached ADD result at the chain's version, None when nothing is cached."""
        entry = _cache.read_entry(self.cache_dir, chain.name, container_id, ifname)
        if entry is None or not entry.result:
            return None
        try:
            res = Result.from_dict(entry.result)
            return self._as_version(res, chain.version)
        except CNIError as e:
            raise CNIError(e.code, f"failed to get network {chain.name!r} cached result: {e.msg}",
                           e.details) from None

    @staticmethod
    def _as_version(res: Result, version: str) -> Result:
        """``res`` in the network's version (plugins must receive prevResult in it)."""
        if res.cni_version == version:
            return res
        try:
            return res.convert(version)
        except CNIError as e:
            raise CNIError(e.code, f"failed to convert result from version {res.cni_version} to the "
                           f"config version {version}: {e.msg}", e.details) from None

    def _find(self, plugin: NetworkConfig) -> str:
        return invoke.find_in_path(plugin.type, self.plugin_path)

    def _validate_attachment(self, chain: _Chain, rt: RuntimeConf) -> None:
        validate_container_id(rt.container_id)
        validate_network_name(chain.name)
        validate_interface_name(rt.ifname)

    def _env(self, command: str, rt: RuntimeConf | None) -> dict[str, str]:
        """The CNI_* environment for a plugin exec (no attachment variables for GC/STATUS)."""
        base = os.environ if self.env is None else self.env
        if rt is None:
            return invoke.plugin_env(base, command, path=os.pathsep.join(self.plugin_path))
        return invoke.plugin_env(base, command, container_id=rt.container_id, netns=rt.netns,
                                 ifname=rt.ifname, args=rt.cni_args(), path=os.pathsep.join(self.plugin_path))
