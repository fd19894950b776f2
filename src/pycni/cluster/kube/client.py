"""The Kubernetes API as the controller needs it: paged lists and watch streams of four kinds.

The one module that imports the official ``kubernetes`` client (heavy: ~0.8 s and ~40 MB, so
only the long-running controller loads it, never a plugin). Objects stay plain dicts: lists and
watches are read with ``_preload_content=False`` and decoded once with :mod:`json` (the
library's model classes would cost most of the controller's CPU at a thousand pods).
"""

from __future__ import annotations

import json
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

# kind -> (API class, list-all method, read method, namespaced)
KINDS: dict[str, tuple[str, str, str, bool]] = {
    "Namespace": ("CoreV1Api", "list_namespace", "read_namespace", False),
    "Node": ("CoreV1Api", "list_node", "read_node", False),
    "Pod": ("CoreV1Api", "list_pod_for_all_namespaces", "read_namespaced_pod", True),
    "NetworkPolicy": ("NetworkingV1Api", "list_network_policy_for_all_namespaces",
                      "read_namespaced_network_policy", True),
}
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


class KubeError(Exception):
    """The API refused or could not be reached; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Expired(KubeError):
    """410 Gone: the resourceVersion (or continue token) is older than the server keeps."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 410)


def _status_error(status: int, body: bytes) -> KubeError:
    try:
        obj = json.loads(body)
        msg = str(obj.get("message") or obj.get("reason") or body[:200])
    except ValueError:
        msg = body[:200].decode(errors="replace")
    return Expired(msg) if status == 410 else KubeError(f"HTTP {status}: {msg}", status)


class KubeClient:
    """One API server connection pool, from a kubeconfig or the pod's service account."""

    def __init__(self, kubeconfig: str = "", timeout: float = 10.0) -> None:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException

        self.timeout = timeout
        try:
            if kubeconfig:
                self.api = config.new_client_from_config(config_file=kubeconfig)
            else:
                cfg = client.Configuration()
                config.load_incluster_config(client_configuration=cfg)
                self.api = client.ApiClient(cfg)
        except (ConfigException, OSError, ValueError, TypeError) as e:
            where = kubeconfig or f"the in-cluster service account ({SERVICE_ACCOUNT}, KUBERNETES_SERVICE_HOST)"
            raise KubeError(f"cannot load the Kubernetes client configuration from {where}: {e}") from None
        self._apis: dict[str, Any] = {}
        self._client = client

    def close(self) -> None:
        self.api.close()

    def _method(self, kind: str, which: int) -> Any:
        cls = KINDS[kind][0]
        if cls not in self._apis:
            self._apis[cls] = getattr(self._client, cls)(self.api)
        name = KINDS[kind][which]
        assert isinstance(name, str)
        return getattr(self._apis[cls], name)

    def _call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        """Call ``fn`` raw; KubeError for anything but a 2xx answer."""
        import urllib3

        try:
            resp = fn(*args, _preload_content=False, **kw)
        except self._client.ApiException as e:
            raise _status_error(int(e.status or 0), (e.body or str(e.reason)).encode()
                                if isinstance(e.body, str) or e.body is None else e.body) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise KubeError(f"the API server did not answer: {e}") from None
        if not 200 <= resp.status <= 299:
            body = resp.data
            resp.release_conn()
            raise _status_error(resp.status, body)
        return resp

    def list_page(self, kind: str, limit: int = 500, cont: str = "") -> tuple[list[dict[str, Any]], str, str]:
        """One page: (items, the list's resourceVersion, continue token or '')."""
        kw: dict[str, Any] = {"limit": limit, "_request_timeout": self.timeout}
        if cont:
            kw["_continue"] = cont
        resp = self._call(self._method(kind, 1), **kw)
        try:
            obj = json.loads(resp.data)
        except ValueError as e:
            raise KubeError(f"undecodable {kind} list: {e}") from None
        meta = obj.get("metadata") or {}
        return list(obj.get("items") or ()), str(meta.get("resourceVersion") or ""), str(meta.get("continue") or "")

    def list_all(self, kind: str, limit: int = 500) -> tuple[list[dict[str, Any]], str]:
        """Every object (page by page, one consistent snapshot) and the snapshot's resourceVersion."""
        items, rv, cont = self.list_page(kind, limit)
        while cont:
            more, _rv, cont = self.list_page(kind, limit, cont)
            items += more
        return items, rv

    def watch(self, kind: str, resource_version: str, timeout_seconds: int = 300) -> Iterator[dict[str, Any]]:
        """Events from ``resource_version`` on, with bookmarks, until the server ends the stream
        (``timeout_seconds``); an ERROR event with 410 raises Expired, any other KubeError."""
        from kubernetes.watch.watch import iter_resp_lines

        resp = self._call(self._method(kind, 1), watch=True, resource_version=resource_version,
                          allow_watch_bookmarks=True, timeout_seconds=timeout_seconds,
                          _request_timeout=(self.timeout, timeout_seconds + self.timeout))
        import urllib3

        try:
            for line in iter_resp_lines(resp):
                if not line.strip():
                    continue
                ev = json.loads(line)
                if ev.get("type") == "ERROR":
                    st = ev.get("object") or {}
                    raise _status_error(int(st.get("code") or 500), json.dumps(st).encode())
                yield ev
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as e:
            raise KubeError(f"watch of {kind} broken: {e}") from None
        finally:
            resp.release_conn()

    def exists(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object read now from the API (not a cache), None when the API says 404."""
        fn = self._method(kind, 2)
        args = (name, namespace) if KINDS[kind][3] else (name,)
        try:
            resp = self._call(fn, *args, _request_timeout=self.timeout)
        except KubeError as e:
            if e.status == 404:
                return None
            raise
        obj: dict[str, Any] = json.loads(resp.data)
        return obj


def in_cluster_available() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(f"{SERVICE_ACCOUNT}/token")
