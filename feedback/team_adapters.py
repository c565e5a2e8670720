"""Team adapters: a promoted adapter published to the team's collector, pulled by its members.

The machine that trains on the team's pooled feedback (`squidcode train --source ... --team ...`)
publishes its promoted adapter (`squidcode train publish`): the adapter's files, their sha256 and
the gate's metrics go to the collector (`POST /v1/adapters`), which keeps them per team (versions
are the publisher's; a version is stored once, at most `MAX_ADAPTER_BYTES`). A member's server with
`feedback.team_adapter = true` asks for the team's newest (`GET /v1/adapters/latest`), downloads a
version it does not have (`GET /v1/adapters/VERSION`), checks the digest, stores it as a local
adapter version and promotes it: the server's adapter watch swaps it in without a restart, exactly
as after a local promotion. The team adapter is then the local base: the member's own rounds train
on top of it (the trainer continues the promoted adapter), and `squidcode train rollback` goes
back to what was in use before it. Only the token's team can publish or pull.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import ssl
from pathlib import Path
from typing import Any

import httpx

from context.errors import AdapterError

__all__ = [
    "MAX_ADAPTER_BYTES",
    "adapter_digest",
    "pack_adapter",
    "publish_adapter",
    "pull_team_adapter",
    "unpack_adapter",
    "valid_version",
]

log = logging.getLogger(__name__)

MAX_ADAPTER_BYTES = 64 * 1024 * 1024  # the files of one adapter, before base64
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
_FILE = re.compile(r"[A-Za-z0-9_.\-]{1,128}")


def valid_version(version: Any) -> bool:
    return isinstance(version, str) and bool(_VERSION.fullmatch(version))


def adapter_digest(files: dict[str, bytes]) -> str:
    """sha256 over the files' names and bytes, in name order (what publisher and member check)."""
    digest = hashlib.sha256()
    for name in sorted(files):
        data = files[name]
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def pack_adapter(directory: Path, version: str, meta: dict[str, Any]) -> dict[str, Any]:
    """The JSON body publishing the adapter in `directory` (its files, not its local meta.json)."""
    files = {p.name: p.read_bytes() for p in sorted(Path(directory).iterdir())
             if p.is_file() and p.name != "meta.json"}
    if not files:
        raise AdapterError(f"no adapter files in {directory}")
    size = sum(len(data) for data in files.values())
    if size > MAX_ADAPTER_BYTES:
        raise AdapterError(f"adapter {version} is {size} bytes; a team adapter is at most "
                           f"{MAX_ADAPTER_BYTES}")
    return {"version": version, "sha256": adapter_digest(files), "meta": meta,
            "files": {name: base64.b64encode(data).decode("ascii") for name, data in files.items()}}


def unpack_adapter(payload: Any) -> tuple[str, str, dict[str, Any], dict[str, bytes]]:
    """(version, sha256, meta, files) of a published adapter; ValueError for anything malformed,
    AdapterError when the files do not match their digest (truncated or tampered with)."""
    if not isinstance(payload, dict) or set(payload) != {"version", "sha256", "meta", "files"}:
        raise ValueError("expected exactly the keys version, sha256, meta, files")
    version, digest, meta, encoded = payload["version"], payload["sha256"], payload["meta"], payload["files"]
    if not valid_version(version):
        raise ValueError("version must be 1-64 letters, digits, '.', '-' or '_'")
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ValueError("sha256 must be 64 hex digits")
    if not isinstance(meta, dict) or not isinstance(encoded, dict) or not encoded:
        raise ValueError("meta must be an object and files a non-empty object")
    files: dict[str, bytes] = {}
    for name, text in encoded.items():
        if not _FILE.fullmatch(name) or name in (".", "..") or not isinstance(text, str):
            raise ValueError(f"file {name!r}: a plain file name and base64 text")
        try:
            files[name] = base64.b64decode(text, validate=True)
        except ValueError as exc:
            raise ValueError(f"file {name!r} is not base64") from exc
    if sum(len(data) for data in files.values()) > MAX_ADAPTER_BYTES:
        raise ValueError(f"an adapter is at most {MAX_ADAPTER_BYTES} bytes")
    if adapter_digest(files) != digest:
        raise AdapterError(f"team adapter {version}: its files do not match their sha256 "
                           "(truncated or altered)")
    return version, digest, meta, files


def _headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def publish_adapter(endpoint: str, token: str, directory: Path, version: str, meta: dict[str, Any],
                    timeout_s: float = 60.0, verify: ssl.SSLContext | bool = True) -> dict[str, Any]:
    """Publish the adapter in `directory` to the collector at `endpoint`; the collector's answer.
    `verify`: the HTTPS check (`feedback.upload.collector_tls`)."""
    body = pack_adapter(directory, version, meta)
    try:
        response = httpx.post(f"{endpoint.rstrip('/')}/v1/adapters", json=body, headers=_headers(token),
                              timeout=timeout_s, verify=verify)
    except httpx.HTTPError as exc:
        raise AdapterError(f"cannot reach the collector at {endpoint}: {exc}") from exc
    if response.status_code >= 400:
        raise AdapterError(f"the collector refused adapter {version} (HTTP {response.status_code}): "
                           f"{response.text[:200]}")
    return response.json()


def pull_team_adapter(endpoint: str, token: str, registry, timeout_s: float = 60.0,
                      verify: ssl.SSLContext | bool = True) -> str | None:
    """Install and promote the team's newest adapter when this machine does not have it yet; the
    local version it became, or None (none published, or already here: a user who rolled back is
    not overruled by the same version again)."""
    base = endpoint.rstrip("/")
    try:
        with httpx.Client(headers=_headers(token), timeout=timeout_s, verify=verify) as client:
            latest = client.get(f"{base}/v1/adapters/latest")
            if latest.status_code == 404:
                return None
            latest.raise_for_status()
            info = latest.json()
            if any(ref.meta.get("team_version") == info.get("version") for ref in registry.versions()):
                return None
            if not valid_version(info.get("version")):
                raise AdapterError(f"the collector named an invalid adapter version {info.get('version')!r}")
            got = client.get(f"{base}/v1/adapters/{info['version']}")
            got.raise_for_status()
            payload = got.json()
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        raise AdapterError(f"cannot pull the team adapter from {endpoint}: {exc}") from exc
    try:
        version, digest, meta, files = unpack_adapter(payload)
    except ValueError as exc:
        raise AdapterError(f"the collector sent a malformed team adapter: {exc}") from exc

    def save(directory: Path) -> None:
        for name, data in files.items():
            (directory / name).write_bytes(data)

    ref = registry.add_version(save, {"team_version": version, "sha256": digest, "source": "team",
                                      "team_meta": meta})
    registry.promote(ref.id)
    log.info("team adapter %s installed as %s and promoted", version, ref.id)
    return ref.id
