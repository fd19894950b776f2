"""Loading network configurations from a directory, exactly as Go's libcni does. Stdlib only.

* ``*.conflist`` files are network configurations (a list of plugins), searched first, in
  lexical order; the first whose ``name`` matches wins.
* ``*.conf`` / ``*.json`` files are legacy single-plugin configurations, searched next and
  converted to a one-plugin list.
* Spec 1.1: ``cniVersions`` (the runtime picks the highest it supports), ``disableGC`` and
  ``loadOnlyInlinedPlugins``: unless that is true, plugin objects in ``<dir>/<name>/*.conf``
  are appended to the inlined ``plugins``.

As in libcni, a file that cannot be parsed stops a lookup that reaches it. Every error is a
:class:`CNIError` (6: the JSON does not decode, 7: it decodes but is not a valid
configuration) naming the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from pycni.record import field, record
from pycni.spec.errors import DECODE_FAILURE, INCOMPATIBLE_VERSION, CNIError, invalid_config
from pycni.spec.gokeys import lookup
from pycni.spec.validate import validate_network_name, validate_plugin_type
from pycni.spec.version import ALL_VERSIONS, CURRENT_VERSION, highest, parse_version

TYPE_CHECKING = False  # not typing's: importing typing costs a process ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

DEFAULT_CONF_DIR = "/etc/cni/net.d"
CONFLIST_EXTENSIONS = (".conflist",)
CONF_EXTENSIONS = (".conf", ".json")


# ---- JSON as Go's encoding/json writes it ------------------------------------------------------

def go_json(obj: Any) -> bytes:
    """Compact JSON with Go's escaping of <, >, & and U+2028/9 (keys in the order given)."""
    try:
        text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError) as e:  # NaN/Infinity or a non-JSON type from a caller
        raise CNIError(DECODE_FAILURE, "cannot encode as JSON", str(e)) from None
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                    ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)  # these characters only ever occur inside JSON strings
    return text.encode()


def sorted_keys(obj: Any) -> Any:
    """``obj`` with every object's keys in sorted order, as Go marshals a map[string]any."""
    if isinstance(obj, dict):
        return {k: sorted_keys(obj[k]) for k in sorted(obj)}
    if isinstance(obj, list):
        return [sorted_keys(v) for v in obj]
    return obj


def _where(path: str) -> str:
    return f" in {path}" if path else ""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _decode(data: bytes | str, path: str, what: str) -> dict[str, Any]:
    """A config file's JSON object; NaN/Infinity refused as Go refuses them."""
    try:
        obj = json.loads(data, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise CNIError(DECODE_FAILURE, f"error parsing {what}{_where(path)}", f"invalid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise CNIError(DECODE_FAILURE, f"error parsing {what}{_where(path)}",
                       f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _invalid(path: str, what: str, details: str) -> CNIError:
    return invalid_config(f"error parsing {what}{_where(path)}", details)


# ---- plugin configuration objects ---------------------------------------------------------------

@record
class NetworkConfig:
    """One plugin configuration object (libcni's NetworkConfig / PluginConfig).

    ``raw`` is the decoded JSON passed through to the plugin; ``bytes`` the text it came
    from (cached as the config of a single-plugin ADD).
    """

    type: str
    raw: dict[str, Any]
    bytes: bytes
    name: str = ""
    cni_version: str = ""
    capabilities: dict[str, bool] = field(default_factory=dict)
    path: str = ""

    def enabled_capabilities(self) -> list[str]:
        return sorted(c for c, on in self.capabilities.items() if on)

    def describe(self) -> str:
        """``type="bridge" name="x"``: how libcni names a plugin in errors."""
        return f'type="{self.type}"' + (f' name="{self.name}"' if self.name else "")


def _string_field(raw: dict[str, Any], key: str, path: str, what: str, go_struct: bool = False) -> str:
    """An optional string key of a config ("" when absent). ``go_struct``: libcni decodes this
    object into a struct, so the key is matched as Go matches it (pycni.spec.gokeys); a
    conflist's own keys are read from a map, exactly."""
    value = lookup(raw, key) if go_struct else raw.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _invalid(path, what, f"{key!r} must be a string, got {json.dumps(value)}")
    return value


def conf_from_bytes(data: bytes | str, path: str = "", what: str = "configuration") -> NetworkConfig:
    """Parse one plugin configuration object (it needs a ``type``).

    libcni decodes it into types.NetConf, a struct: ``"Type"`` or ``"Capabilities"`` are read as
    ``type`` and ``capabilities`` (the capability names inside are a map's keys: exact)."""
    raw = _decode(data, path, what)
    ptype = _string_field(raw, "type", path, what, go_struct=True)
    if not ptype:
        hint = ("; this file has a 'plugins' list: network configurations are named *.conflist"
                if "plugins" in raw and what == "configuration" else "")
        raise _invalid(path, what, f"missing 'type': every plugin configuration names its plugin binary{hint}")
    try:
        validate_plugin_type(ptype)
    except CNIError as e:
        raise _invalid(path, what, f"{e.msg}: {e.details}") from None
    caps = lookup(raw, "capabilities")
    if caps is None:
        caps = {}
    if not isinstance(caps, dict) or not all(isinstance(v, bool) for v in caps.values()):
        raise _invalid(path, what, f"'capabilities' must map capability names to true/false, got {json.dumps(caps)}")
    ipam = lookup(raw, "ipam")
    if ipam is not None and (not isinstance(ipam, dict) or not isinstance(lookup(ipam, "type", ""), str)):
        raise _invalid(path, what, f"'ipam' must be an object with a string 'type', got {json.dumps(ipam)}")
    name = _string_field(raw, "name", path, what, go_struct=True)
    version = _string_field(raw, "cniVersion", path, what, go_struct=True)

    data_b = data.encode() if isinstance(data, str) else data
    return NetworkConfig(type=ptype, raw=raw, bytes=data_b, name=name, cni_version=version,
                         capabilities=dict(caps), path=path)


def conf_from_file(path: str) -> NetworkConfig:
    return conf_from_bytes(_read(path), path)


def _read(path: str) -> bytes:
    """A config file's bytes; CNIError 7 naming the file when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise invalid_config(f"error reading {path}", e.strerror or str(e)) from None


# ---- network configurations (lists) -------------------------------------------------------------

@record
class NetworkConfigList:
    """A network configuration: a named, versioned chain of plugins (libcni's NetworkConfigList).

    ``cni_version`` is the version the runtime speaks with the plugins: ``cniVersion``, or the
    highest supported one of ``cniVersions``. ``bytes`` is the file's text, cached on ADD.
    """

    name: str
    cni_version: str
    plugins: list[NetworkConfig]
    bytes: bytes
    cni_versions: list[str] = field(default_factory=list)
    disable_check: bool = False
    disable_gc: bool = False
    load_only_inlined_plugins: bool = False
    path: str = ""

    def validate(self) -> None:
        """Names and types usable as file names, at least one plugin (code 7 otherwise)."""
        try:
            validate_network_name(self.name)
        except CNIError as e:
            raise CNIError(e.code, f"{e.msg}{_where(self.path)}", e.details) from None
        if not self.plugins:
            raise _invalid(self.path, "network configuration",
                           f"network {self.name!r} has no plugins: add a 'plugins' list or "
                           f"plugin .conf files to the folder {self.name}/ beside it")
        for p in self.plugins:
            validate_plugin_type(p.type)


def _read_bool(raw: dict[str, Any], key: str, path: str) -> bool:
    """A boolean as libcni reads it: true/false, or the strings "true"/"false" in any case."""
    value = raw.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise _invalid(path, "configuration list", f"{key!r} must be true or false, got {json.dumps(value)}")


def select_version(cni_version: str, cni_versions: Sequence[str], path: str = "") -> str:
    """Spec 1.1: the highest of ``cniVersion`` and ``cniVersions`` this runtime supports."""
    offered = [*cni_versions, *([cni_version] if cni_version else [])]
    candidates = []
    for v in offered:
        try:
            parse_version(v)
        except CNIError as e:
            raise _invalid(path, "configuration list", f"invalid CNI version {v!r}: {e.details}") from None
        if v in ALL_VERSIONS:
            candidates.append(v)
    if not candidates:
        raise CNIError(INCOMPATIBLE_VERSION, f"no supported CNI version in configuration list{_where(path)}",
                       f"it offers {offered}; "
                       f"this runtime speaks {list(ALL_VERSIONS)}")
    return highest(candidates)


def conflist_from_bytes(data: bytes | str, path: str = "", load_plugin_dir: bool = False) -> NetworkConfigList:
    """Parse a network configuration (``.conflist``).

    With ``load_plugin_dir`` (what loading from a file does) plugin objects from
    ``<dir of path>/<name>/*.conf`` are appended unless ``loadOnlyInlinedPlugins`` is true.
    """
    what = "configuration list"
    raw = _decode(data, path, what)
    if "name" not in raw:
        raise _invalid(path, what, "no name: a network configuration needs a \"name\"")
    name = raw["name"]
    if not isinstance(name, str):
        raise _invalid(path, what, f"'name' must be a string, got {json.dumps(name)}")
    version = _string_field(raw, "cniVersion", path, what)
    versions_raw = raw.get("cniVersions")
    versions: list[str] = []
    if versions_raw is not None:
        if not isinstance(versions_raw, list) or not all(isinstance(v, str) for v in versions_raw):
            raise _invalid(path, what, f"'cniVersions' must be a list of strings, got {json.dumps(versions_raw)}")
        versions = list(versions_raw)
        version = select_version(version, versions, path)
    inlined_only = _read_bool(raw, "loadOnlyInlinedPlugins", path)
    nl = NetworkConfigList(name=name, cni_version=version or "0.1.0", plugins=[],
                           bytes=data.encode() if isinstance(data, str) else data, cni_versions=versions,
                           disable_check=_read_bool(raw, "disableCheck", path),
                           disable_gc=_read_bool(raw, "disableGC", path),
                           load_only_inlined_plugins=inlined_only, path=path)
    if "plugins" not in raw:
        if inlined_only:
            raise _invalid(path, what, "'loadOnlyInlinedPlugins' is true but there is no 'plugins' list")
    else:
        plugins = raw["plugins"]
        if not isinstance(plugins, list):
            raise _invalid(path, what, f"'plugins' must be a list, got {json.dumps(plugins)}")
        if not plugins:
            raise _invalid(path, what, "no plugins in list: 'plugins' is empty")
        for i, p in enumerate(plugins):
            if not isinstance(p, dict):
                raise _invalid(path, what, f"plugin {i} must be an object, got {json.dumps(p)}")
            try:
                nl.plugins.append(conf_from_bytes(go_json(sorted_keys(p)), path))
            except CNIError as e:
                raise CNIError(e.code, f"failed to parse plugin config {i}{_where(path)}",
                               e.details or e.msg) from None
    if load_plugin_dir and path and not inlined_only and _valid_name(name):
        nl.plugins.extend(plugin_confs_from_dir(os.path.join(os.path.dirname(path), name)))
    if not nl.plugins:
        raise _invalid(path, what, f"no plugin configs found for network {name!r}: add a 'plugins' list"
                       + (f" or .conf files in {os.path.join(os.path.dirname(path), name)}" if path else ""))
    return nl


def _valid_name(name: str) -> bool:
    """Only a valid network name may name a folder (no '..', no '/')."""
    try:
        validate_network_name(name)
    except CNIError:
        return False
    return True


def plugin_confs_from_dir(folder: str) -> list[NetworkConfig]:
    """Spec 1.1 aggregated plugin objects: every ``*.conf`` in ``folder``, in lexical order."""
    return [conf_from_bytes(_read(p), p, "plugin configuration") for p in conf_files(folder, (".conf",))]


def conflist_from_file(path: str) -> NetworkConfigList:
    return conflist_from_bytes(_read(path), path, load_plugin_dir=True)


def conflist_from_conf(conf: NetworkConfig) -> NetworkConfigList:
    """Up-convert a legacy single-plugin configuration to a one-plugin list, as libcni does."""
    listed = {"cniVersion": conf.cni_version, "name": conf.name, "plugins": [conf.raw]}
    nl = conflist_from_bytes(go_json(sorted_keys(listed)), conf.path)
    nl.path = conf.path
    return nl


def conf_files(directory: str, extensions: Sequence[str]) -> list[str]:
    """Regular files in ``directory`` with one of ``extensions``, sorted (none if it is missing)."""
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise invalid_config(f"cannot read configuration directory {directory}",
                             e.strerror or str(e)) from None
    out = []
    for entry in sorted(entries):
        full = os.path.join(directory, entry)
        if os.path.isdir(full):
            continue
        if os.path.splitext(entry)[1] in extensions:
            out.append(full)
    return out


def not_found(directory: str, name: str) -> CNIError:
    return invalid_config(f'no net configuration with name "{name}" in {directory}',
                    f"add a .conflist file with \"name\": \"{name}\" to {directory}, "
                    "or check the network name (`pycni list` shows what is there)")


def load_conf(directory: str, name: str) -> NetworkConfig:
    """The first legacy ``.conf``/``.json`` file in ``directory`` whose name is ``name``."""
    files = conf_files(directory, CONF_EXTENSIONS)
    if not files:
        raise invalid_config(f"no net configurations found in {directory}",
                             f"put .conflist files (or legacy .conf/.json ones) into {directory}")
    for path in files:
        conf = conf_from_file(path)
        if conf.name == name:
            return conf
    raise not_found(directory, name)


def load_network(directory: str, name: str) -> NetworkConfigList:
    """The network named ``name`` in ``directory``, as libcni's LoadNetworkConf finds it."""
    lists = conf_files(directory, CONFLIST_EXTENSIONS)
    for path in lists:
        nl = conflist_from_file(path)
        if nl.name == name:
            nl.validate()
            return nl
    if not conf_files(directory, CONF_EXTENSIONS):
        if lists:
            raise not_found(directory, name)
        raise invalid_config(f"no net configurations found in {directory}",
                             f"put .conflist files (or legacy .conf/.json ones) into {directory}")
    nl = conflist_from_conf(load_conf(directory, name))
    nl.validate()
    return nl


@record
class ConfigFile:
    """One file seen by :func:`scan`: the network it defines, or why it does not."""

    path: str
    network: NetworkConfigList | None = None
    error: CNIError | None = None
    shadowed: bool = False  # an earlier file already defines this network name


def scan(directory: str) -> list[ConfigFile]:
    """Every configuration file in lookup order, each parsed on its own (for `pycni list`)."""
    out: list[ConfigFile] = []
    seen: set[str] = set()
    paths = conf_files(directory, CONFLIST_EXTENSIONS) + conf_files(directory, CONF_EXTENSIONS)
    for path in paths:
        item = ConfigFile(path)
        try:
            if path.endswith(CONFLIST_EXTENSIONS):
                item.network = conflist_from_file(path)
            else:
                item.network = conflist_from_conf(conf_from_file(path))
            item.network.validate()
        except CNIError as e:
            item.error = e
        if item.network is not None:
            item.shadowed = item.network.name in seen
            seen.add(item.network.name)
        out.append(item)
    return out


__all__ = [
    "CURRENT_VERSION", "DEFAULT_CONF_DIR", "ConfigFile", "NetworkConfig", "NetworkConfigList",
    "conf_files", "conf_from_bytes", "conf_from_file", "conflist_from_bytes", "conflist_from_conf",
    "conflist_from_file", "go_json", "load_conf", "load_network", "scan", "select_version", "sorted_keys",
]
