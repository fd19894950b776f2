"""A Kubernetes API server stand-in for tests: what the controller relies on, over a real etcd.

No kube-apiserver can be installed on these machines, so this plays one, honestly and no more.
What it is:

- objects live in a real etcd (``<prefix>/<resource>/[<namespace>/]<name>``, JSON), and an
  object's ``metadata.resourceVersion`` is the etcd mod revision of its key; a list's is the
  store revision it was read at;
- list with ``limit``/``continue`` (every page read at the first page's revision; a continue
  token past etcd's compaction answers 410 Gone, as the real server does);
- watch from a ``resourceVersion`` (an etcd watch from the next revision, with ``prev_kv`` for
  DELETED), ``allowWatchBookmarks`` (a BOOKMARK every ``bookmark_interval`` seconds carrying the
  highest revision this stream has delivered, so it never claims events it has not sent),
  ``timeoutSeconds``, and an ERROR event with a 410 Status once etcd compacted past the
  requested version (what the real server sends: the stream opens, then says "too old");
  a watch without a resourceVersion (or "0") starts with ADDED for every object, as the real one;
- create (409 AlreadyExists), get, update with a ``resourceVersion`` precondition (409 Conflict
  when stale: one etcd transaction comparing the mod revision), merge patch (JSON merge patch;
  a strategic merge patch is applied the same way — equal for labels, which is what the tests
  change), delete;
- HTTPS with a throwaway CA, bearer tokens: an unknown token is 401; a token is given either a
  set of resources (every verb on them) or :class:`Grants`, RBAC rules as a ClusterRole holds
  them (apiGroups, resources, verbs, resourceNames; "*" in any), and a request outside them is
  403 with the real server's message; :meth:`KubeAPI.kubeconfig` writes a kubeconfig for a token;
- discovery (/api, /apis, /api/v1, /apis/networking.k8s.io/v1, /version) enough for kubectl.

What it is not: no admission, no defaulting or validation of specs beyond JSON, no graceful
deletion (a DELETE removes the object at once), no label or field selectors, no RBAC objects served (rules
are given to the stand-in, not read from the API), no namespaced Roles, no cascading
namespace deletion, no aggregated discovery, no protobuf, no watch cache (every watch is its own
etcd watch). It listens inside a network namespace (the etcd cluster's underlay), never in the
machine's own.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from etcd_util import EtcdCluster

from pycni.cluster.etcd import Etcd, EtcdCompacted, EtcdError, WatchBroken, if_absent, if_mod, op_delete, op_put

# resource -> (group/version path, kind, namespaced)
RESOURCES: dict[str, tuple[str, str, bool]] = {
    "namespaces": ("api/v1", "Namespace", False),
    "nodes": ("api/v1", "Node", False),
    "pods": ("api/v1", "Pod", True),
    "networkpolicies": ("apis/networking.k8s.io/v1", "NetworkPolicy", True),
}
API_VERSION = {"api/v1": "v1", "apis/networking.k8s.io/v1": "networking.k8s.io/v1"}
FULL = "*"


class Grants:
    """RBAC rules as a ClusterRole's ``rules`` (dicts with apiGroups, resources, verbs and optional
    resourceNames), and the user they are bound to, named in a 403 as the real server does.

    A request's verb is the API server's: GET of a collection is ``list`` (``watch`` with
    ``?watch=true``), GET of an object ``get``, POST ``create``, PUT ``update``, PATCH ``patch``,
    DELETE ``delete``. ``resourceNames`` limits a rule to requests naming one of those objects (so
    never list, watch or create), as RBAC does. Non-resource URLs (discovery) are open to every
    authenticated token, as the system:discovery role makes them."""

    def __init__(self, rules: list[dict[str, Any]], user: str = "system:serviceaccount:test:test") -> None:
        for r in rules:
            if set(r) - {"apiGroups", "resources", "verbs", "resourceNames"} or not r.get("verbs"):
                raise ValueError(f"a rule the stand-in does not model: {r}")
        self.rules, self.user = rules, user
        self.asked: set[tuple[str, str, str]] = set()  # (group, resource, verb) of every request, for tests

    def allows(self, verb: str, group: str, resource: str, name: str) -> bool:
        def has(values: list[str], v: str) -> bool:
            return FULL in values or v in values

        self.asked.add((group, resource, verb))
        for r in self.rules:
            names = r.get("resourceNames") or []
            if (has(r["verbs"], verb) and has(r.get("apiGroups") or [], group)
                    and has(r.get("resources") or [], resource) and (not names or name in names)):
                return True
        return False

    def forbidden(self, verb: str, group: str, resource: str, name: str, namespace: str) -> str:
        """The real server's message for a refused request."""
        what = f'{resource} "{name}"' if name else resource
        scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        return f'{what} is forbidden: User "{self.user}" cannot {verb} resource "{resource}" in API group ' \
            f'"{group}" {scope}'


class Gone(Exception):
    """etcd compacted past the revision asked for."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _compacted(e: EtcdError) -> bool:
    return "compacted" in str(e)


class KubeAPI:
    """The stand-in. ``tokens`` maps a bearer token to the resources it may use with any verb
    (``{"*"}``: all), or to :class:`Grants`."""

    def __init__(self, cluster: EtcdCluster, tokens: Mapping[str, set[str] | Grants] | None = None,
                 prefix: str = "/registry", bookmark_interval: float = 1.0, port: int = 6443) -> None:
        self.cluster = cluster
        self.tokens: dict[str, set[str] | Grants] = dict(tokens) if tokens is not None else {"admin-token": {FULL}}
        self.prefix = prefix.rstrip("/")
        self.bookmark_interval = bookmark_interval
        self.port = port
        assert cluster.underlay is not None
        self.host = str(cluster.net.broadcast_address - 1)  # the underlay bridge's address
        self.dir = os.path.join(cluster.tmp, "kube-api")
        os.makedirs(self.dir, exist_ok=True)
        self.ca_cert = os.path.join(self.dir, "ca.crt")
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.requests: list[tuple[str, str]] = []  # (method, path) served, for assertions
        self._make_certs()

    # -- lifecycle --

    def _make_certs(self) -> None:
        d = self.dir

        def run(*args: str) -> None:
            subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

        key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        run("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=kube-test-ca")
        with open(os.path.join(d, "server.ext"), "w") as f:
            f.write(f"subjectAltName=IP:{self.host}\nextendedKeyUsage=serverAuth\n")
        run("req", *key, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=kube-apiserver")
        run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "1", "-extfile", "server.ext")

    def start(self) -> KubeAPI:
        api = self

        class Handler(_Handler):
            server_api = api

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(self.dir, "server.crt"), os.path.join(self.dir, "server.key"))
        assert self.cluster.underlay is not None
        with self.cluster.underlay.enter():  # the listening socket lives in the underlay namespace
            srv = ThreadingHTTPServer((self.host, self.port), Handler, bind_and_activate=False)
            srv.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.server_bind()
            srv.server_activate()
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
        srv.daemon_threads = True
        self._server = srv
        self._thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (open watches end when their client next reads: their sockets close)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        _Handler.close_all(self)

    def __enter__(self) -> KubeAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def kubeconfig(self, path: str, token: str = "admin-token") -> str:
        """A kubeconfig file for ``token`` (JSON is YAML)."""
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "test",
               "clusters": [{"name": "test", "cluster": {"server": self.url, "certificate-authority": self.ca_cert}}],
               "users": [{"name": "test", "user": {"token": token}}],
               "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}]}
        with open(path, "w") as f:
            json.dump(cfg, f)
        return path

    # -- storage --

    def etcd(self) -> Etcd:
        return self.cluster.client(timeout=5)

    def key(self, resource: str, namespace: str, name: str) -> str:
        return f"{self.prefix}/{resource}/{namespace + '/' if namespace else ''}{name}"

    def coll_prefix(self, resource: str, namespace: str) -> str:
        return f"{self.prefix}/{resource}/{namespace + '/' if namespace else ''}"

    @staticmethod
    def decorate(raw: str, rev: int) -> dict[str, Any]:
        obj: dict[str, Any] = json.loads(raw)
        obj.setdefault("metadata", {})["resourceVersion"] = str(rev)
        return obj

    # -- direct access for tests (the same code paths the HTTP side uses) --

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        res = {v[1]: k for k, v in RESOURCES.items()}[obj["kind"]]
        with self.etcd() as e:
            return _create(self, e, res, obj.get("metadata", {}).get("namespace", ""), obj)

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self.etcd() as e:
            kv = e.get(self.key(resource, namespace, name))
            return self.decorate(kv.value, kv.mod_revision) if kv else None

    def patch(self, resource: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        with self.etcd() as e:
            status, obj = _patch(self, e, resource, namespace, name, patch)
            assert status == 200, obj
            return obj

    def delete(self, resource: str, namespace: str, name: str) -> bool:
        with self.etcd() as e:
            return bool(e.delete(self.key(resource, namespace, name)))

    def compact(self) -> int:
        """Compact etcd at its current revision (every older resourceVersion is then Gone)."""
        with self.etcd() as e:
            _kvs, rev = e.range(f"{self.prefix}/")
            e.call("/v3/kv/compaction", {"revision": str(rev), "physical": True})
            return rev


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def _create(api: KubeAPI, e: Etcd, resource: str, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    """Store a new object; raises _Refused(409) when one of that name exists."""
    gv, kind, namespaced = RESOURCES[resource]
    meta = dict(obj.get("metadata") or {})
    name = meta.get("name", "")
    if not name:
        raise _Refused(422, "Invalid", "metadata.name: Required value")
    if namespaced:
        meta["namespace"] = namespace
    meta.pop("resourceVersion", None)
    meta.setdefault("uid", str(uuid.uuid4()))
    meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    stored = {**obj, "apiVersion": API_VERSION[gv], "kind": kind, "metadata": meta}
    key = api.key(resource, namespace if namespaced else "", name)
    res = e.txn([if_absent(key)], [op_put(key, json.dumps(stored))])
    if not res.succeeded:
        raise _Refused(409, "AlreadyExists", f'{resource} "{name}" already exists')
    return api.decorate(json.dumps(stored), res.revision)


def _update(api: KubeAPI, e: Etcd, resource: str, namespace: str, name: str,
            obj: dict[str, Any]) -> dict[str, Any]:
    """Replace an object; 409 Conflict when its resourceVersion precondition is stale."""
    key = api.key(resource, namespace, name)
    cur = e.get(key)
    if cur is None:
        raise _Refused(404, "NotFound", f'{resource} "{name}" not found')
    meta = dict(obj.get("metadata") or {})
    want = meta.pop("resourceVersion", "")
    rev = int(want) if want else cur.mod_revision
    old = json.loads(cur.value)["metadata"]
    meta.update({k: old[k] for k in ("uid", "creationTimestamp", "namespace") if k in old})
    stored = {**obj, "metadata": meta}
    res = e.txn([if_mod(key, rev)], [op_put(key, json.dumps(stored))])
    if not res.succeeded:
        raise _Refused(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": the object has been '
                       "modified; please apply your changes to the latest version and try again")
    return api.decorate(json.dumps(stored), res.revision)


def _patch(api: KubeAPI, e: Etcd, resource: str, namespace: str, name: str,
           patch: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    key = api.key(resource, namespace, name)
    for _ in range(10):
        cur = e.get(key)
        if cur is None:
            return 404, _status(404, "NotFound", f'{resource} "{name}" not found')
        obj = merge_patch(json.loads(cur.value), patch)
        obj["metadata"]["name"] = name
        obj["metadata"].pop("resourceVersion", None)
        res = e.txn([if_mod(key, cur.mod_revision)], [op_put(key, json.dumps(obj))])
        if res.succeeded:
            return 200, api.decorate(json.dumps(obj), res.revision)
    return 409, _status(409, "Conflict", "kept changing")


class _Refused(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


class _Handler(BaseHTTPRequestHandler):
    server_api: KubeAPI
    protocol_version = "HTTP/1.1"
    _open: list[Any] = []

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    @classmethod
    def close_all(cls, api: KubeAPI) -> None:
        for h in list(cls._open):
            if h.server_api is api:
                try:
                    h.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    # -- plumbing --

    def _send(self, code: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _drain(self) -> None:
        """Read a refused request's body, so the next request on this connection parses."""
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(n) if n else b""
        return json.loads(data) if data.strip() else {}

    def _route(self) -> tuple[str, str, str, dict[str, list[str]]] | None:
        """(resource, namespace, name, query) of a resource path, None for another path."""
        u = urlsplit(self.path)
        q = parse_qs(u.query)
        parts = [p for p in u.path.split("/") if p]
        for gv in ("api/v1", "apis/networking.k8s.io/v1"):
            g = gv.split("/")
            if parts[:len(g)] != g:
                continue
            rest = parts[len(g):]
            ns = ""
            if len(rest) >= 3 and rest[0] == "namespaces" and RESOURCES.get(rest[2], ("", "", False))[2]:
                ns, rest = rest[1], rest[2:]
            if not rest or rest[0] not in RESOURCES or RESOURCES[rest[0]][0] != gv or len(rest) > 2:
                return None
            return rest[0], ns, rest[1] if len(rest) == 2 else "", q
        return None

    def _auth(self, method: str, resource: str, ns: str, name: str, q: dict[str, list[str]]) -> bool:
        scheme, _, token = self.headers.get("Authorization", "").strip().partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""  # the scheme's case is free, as the real one
        allowed = self.server_api.tokens.get(token)
        if allowed is None or not isinstance(allowed, Grants) and FULL not in allowed and resource not in allowed:
            self._drain()
        if allowed is None:
            self._send(401, _status(401, "Unauthorized", "Unauthorized"))
            return False
        if isinstance(allowed, Grants):
            if method == "GET" and not name:
                verb = "watch" if q.get("watch", [""])[0] in ("true", "1") else "list"
            else:
                verb = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
            group = API_VERSION[RESOURCES[resource][0]].rpartition("/")[0]  # "v1" -> "" (the core group)
            if not allowed.allows(verb, group, resource, name):
                self._drain()
                self._send(403, _status(403, "Forbidden", allowed.forbidden(verb, group, resource, name, ns)))
                return False
            return True
        if FULL not in allowed and resource not in allowed:
            self._send(403, _status(403, "Forbidden", f'{resource} is forbidden: this token may not access '
                                    f'resource "{resource}"'))
            return False
        return True

    def _discovery(self) -> bool:
        path = urlsplit(self.path).path.rstrip("/")
        if path == "/version":
            self._send(200, {"major": "1", "minor": "32", "gitVersion": "v1.32.0-pycni-standin",
                             "platform": "linux/amd64"})
        elif path == "/api":
            self._send(200, {"kind": "APIVersions", "versions": ["v1"],
                             "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                             "serverAddress": f"{self.server_api.host}:6443"}]})
        elif path == "/apis":
            v = {"groupVersion": "networking.k8s.io/v1", "version": "v1"}
            self._send(200, {"kind": "APIGroupList", "apiVersion": "v1",
                             "groups": [{"name": "networking.k8s.io", "versions": [v], "preferredVersion": v}]})
        elif path in ("/api/v1", "/apis/networking.k8s.io/v1"):
            gv = path.lstrip("/")
            res = [{"name": r, "singularName": k.lower(), "namespaced": nsd, "kind": k,
                    "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}
                   for r, (g, k, nsd) in RESOURCES.items() if g == gv]
            self._send(200, {"kind": "APIResourceList", "groupVersion": API_VERSION[gv], "resources": res})
        else:
            return False
        return True

    def _handle(self, method: str) -> None:
        api = self.server_api
        api.requests.append((method, self.path))
        if method == "GET" and self._discovery():
            return
        route = self._route()
        if route is None:
            self._send(404, _status(404, "NotFound", f"the server could not find the requested resource ({self.path})"))
            return
        resource, ns, name, q = route
        if not self._auth(method, resource, ns, name, q):
            return
        try:
            with api.etcd() as e:
                self._serve(e, method, resource, ns, name, q)
        except _Refused as r:
            self._send(r.code, _status(r.code, r.reason, r.message))
        except Gone as g:
            self._send(410, _status(410, "Expired", str(g)))
        except (EtcdError, OSError) as ex:
            try:
                self._send(503, _status(503, "ServiceUnavailable", f"etcd: {ex}"))
            except OSError:
                pass

    def _serve(self, e: Etcd, method: str, resource: str, ns: str, name: str, q: dict[str, list[str]]) -> None:
        api = self.server_api
        gv, kind, namespaced = RESOURCES[resource]
        if method == "GET" and not name:
            if q.get("watch", [""])[0] in ("true", "1"):
                self._watch(e, resource, ns, q)
            else:
                self._list(e, resource, ns, q)
        elif method == "GET":
            kv = e.get(api.key(resource, ns, name))
            if kv is None:
                raise _Refused(404, "NotFound", f'{resource} "{name}" not found')
            self._send(200, api.decorate(kv.value, kv.mod_revision))
        elif method == "POST" and not name:
            self._send(201, _create(api, e, resource, ns, self._body()))
        elif method == "PUT" and name:
            self._send(200, _update(api, e, resource, ns, name, self._body()))
        elif method == "PATCH" and name:
            code, obj = _patch(api, e, resource, ns, name, self._body())
            self._send(code, obj)
        elif method == "DELETE" and name:
            key = api.key(resource, ns, name)
            cur = e.get(key)
            if cur is None:
                raise _Refused(404, "NotFound", f'{resource} "{name}" not found')
            res = e.txn([if_mod(key, cur.mod_revision)], [op_delete(key)])
            if not res.succeeded:
                raise _Refused(409, "Conflict", f'{resource} "{name}" changed during delete')
            self._send(200, api.decorate(cur.value, res.revision))
        else:
            raise _Refused(405, "MethodNotAllowed", f"{method} is not supported here")

    def _list(self, e: Etcd, resource: str, ns: str, q: dict[str, list[str]]) -> None:
        api = self.server_api
        gv, kind, _ = RESOURCES[resource]
        limit = int(q.get("limit", ["0"])[0] or 0)
        prefix = api.coll_prefix(resource, ns)
        start, rev = prefix, 0
        token = q.get("continue", [""])[0]
        if token:
            c = json.loads(base64.urlsafe_b64decode(token))
            start, rev = c["start"], int(c["rev"])
        from pycni.cluster.etcd import prefix_end

        end = base64.b64decode(prefix_end(prefix)).decode()
        try:
            kvs, now = e.range(start, range_end=end, limit=limit + 1 if limit else 0, revision=rev)
        except EtcdError as ex:
            if _compacted(ex):
                raise Gone("The provided continue parameter is too old to display a consistent list result. "
                           "You can start a new list without the continue parameter.") from None
            raise
        rev = rev or now
        more = bool(limit) and len(kvs) > limit
        kvs = kvs[:limit] if limit else kvs
        meta: dict[str, Any] = {"resourceVersion": str(rev)}
        if more:
            nxt = kvs[-1].key + "\x00"
            meta["continue"] = base64.urlsafe_b64encode(json.dumps({"start": nxt, "rev": rev}).encode()).decode()
        self._send(200, {"kind": f"{kind}List", "apiVersion": API_VERSION[gv], "metadata": meta,
                         "items": [api.decorate(kv.value, kv.mod_revision) for kv in kvs]})

    def _chunk(self, obj: Any) -> None:
        data = json.dumps(obj).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _watch(self, e: Etcd, resource: str, ns: str, q: dict[str, list[str]]) -> None:
        api = self.server_api
        gv, kind, _ = RESOURCES[resource]
        prefix = api.coll_prefix(resource, ns)
        rv = q.get("resourceVersion", [""])[0]
        bookmarks = q.get("allowWatchBookmarks", [""])[0] in ("true", "1")
        timeout = float(q.get("timeoutSeconds", ["1800"])[0] or 1800)
        initial: list[Any] = []
        if rv in ("", "0"):
            kvs, now = e.range(prefix, prefix=True)
            initial, start = kvs, now + 1
        else:
            start = int(rv) + 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        _Handler._open.append(self)
        try:
            self._stream(e, prefix, kind, gv, initial, start, rv, bookmarks, timeout)
            self.wfile.write(b"0\r\n\r\n")  # the stream's end: the client watches again
        except OSError:
            pass
        finally:
            if self in _Handler._open:
                _Handler._open.remove(self)
            self.close_connection = True

    def _stream(self, e: Etcd, prefix: str, kind: str, gv: str, initial: list[Any], start: int, rv: str,
                bookmarks: bool, timeout: float) -> None:
        api = self.server_api
        delivered = start - 1
        for kv in initial:
            self._chunk({"type": "ADDED", "object": api.decorate(kv.value, kv.mod_revision)})
        gone = {"type": "ERROR", "object": _status(410, "Expired", f"too old resource version: {rv}")}
        try:
            w = e.watch(prefix, prefix=True, start_revision=start, prev_kv=True, progress_notify=True)
        except EtcdCompacted:
            self._chunk(gone)
            return
        deadline = time.monotonic() + timeout
        next_mark = time.monotonic() + api.bookmark_interval
        with w:
            while api._server is not None:
                now = time.monotonic()
                if now >= deadline:
                    return
                try:
                    batch = w.next(timeout=max(0.01, min(next_mark, deadline) - now))
                except EtcdCompacted:
                    self._chunk(gone)
                    return
                except WatchBroken:
                    return
                if batch is not None:
                    for ev in batch.events:
                        if ev.type == "DELETE":
                            if ev.prev is None:
                                continue
                            self._chunk({"type": "DELETED", "object": api.decorate(ev.prev.value,
                                                                                  ev.kv.mod_revision)})
                        else:
                            t = "ADDED" if ev.kv.create_revision == ev.kv.mod_revision else "MODIFIED"
                            self._chunk({"type": t, "object": api.decorate(ev.kv.value, ev.kv.mod_revision)})
                        delivered = max(delivered, ev.kv.mod_revision)
                    if not batch.events:  # etcd's progress notice: everything up to it was sent
                        delivered = max(delivered, batch.revision)
                if bookmarks and time.monotonic() >= next_mark:
                    self._chunk({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": API_VERSION[gv],
                                                                "metadata": {"resourceVersion": str(delivered)}}})
                    next_mark = time.monotonic() + api.bookmark_interval

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")


def pod(namespace: str, name: str, labels: dict[str, str] | None = None, node: str = "",
        ports: list[tuple[str, int, str]] | None = None) -> dict[str, Any]:
    """A Pod manifest with one container carrying ``ports`` (name, containerPort, protocol)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
            "spec": {"nodeName": node, "containers": [
                {"name": "c", "image": "busybox",
                 "ports": [{"name": n, "containerPort": p, "protocol": proto} for n, p, proto in ports or ()]}]}}


def namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels or {})}}


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
