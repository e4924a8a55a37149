"""Who may call the server (docs/serving.md#keys): API keys checked as `Authorization: Bearer`
on every `/v1/*` route (OpenAI's 401 body without one), the admin routes (`/v1/admin/*`) off
unless an admin key is set, and reloads only from folders under `serve.reload_root`, with
errors that say nothing about paths outside it.

Keys come from the command line (`--api-key`, `--admin-key`, each repeatable), the config
(`serve.api_keys`, `serve.admin_keys`: comma-separated) and the environment (`ORL_API_KEYS`,
`ORL_ADMIN_KEYS`: comma-separated; what keeps a key out of `ps`); every key of every source
is accepted.
"""
from __future__ import annotations

import dataclasses
import hmac
import os
from typing import Iterable, Mapping

from orl_jax.serve.protocol import RequestError

ENV_API_KEYS, ENV_ADMIN_KEYS = "ORL_API_KEYS", "ORL_ADMIN_KEYS"
PROBES = ("/health", "/metrics")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Access:
  """What the key check lets through (`access_from` builds it from the serve section)."""
  api_keys: tuple[str, ...]          # none: /v1/* is open
  admin_keys: tuple[str, ...]        # none: /v1/admin/* is off
  reload_root: str                   # an absolute folder reloads must lie under ("": none may)
  key_probes: bool                   # /health and /metrics take an API key too


# no keys: every route open but the admin ones, no reloads (a server built without a config)
OPEN = Access(api_keys=(), admin_keys=(), reload_root="", key_probes=False)


def split_keys(sources: Iterable[str]) -> tuple[str, ...]:
  """The distinct non-empty keys of comma-separated `sources`, in order."""
  keys = [k.strip() for source in sources for k in (source or "").split(",")]
  return tuple(dict.fromkeys(k for k in keys if k))


def access_from(serve, api_flags: Iterable[str] = (), admin_flags: Iterable[str] = (),
                environ: Mapping[str, str] = os.environ) -> Access:
  """The server's `Access` from the config's `serve` section, the command line's keys and the
  environment (module docstring)."""
  root = os.path.realpath(serve.reload_root) if serve.reload_root else ""
  return Access(
      api_keys=split_keys([serve.api_keys, *api_flags, environ.get(ENV_API_KEYS, "")]),
      admin_keys=split_keys([serve.admin_keys, *admin_flags, environ.get(ENV_ADMIN_KEYS, "")]),
      reload_root=root, key_probes=bool(serve.key_probes))


def bearer(authorization: str | None) -> str | None:
  """The key of an `Authorization: Bearer KEY` header, None without one."""
  scheme, _, key = (authorization or "").partition(" ")
  return key.strip() or None if scheme.lower() == "bearer" else None


def _known(key: str | None, keys: tuple[str, ...]) -> bool:
  return key is not None and any(hmac.compare_digest(key.encode(), k.encode()) for k in keys)


def _unauthorized(key: str | None) -> RequestError:
  """OpenAI's 401: `code` null without a key, `invalid_api_key` with a wrong one."""
  if key is None:
    error = RequestError("You didn't provide an API key. You need to provide your API key in an "
                         "Authorization header using Bearer auth (i.e. Authorization: Bearer "
                         "YOUR_KEY).", status=401)
  else:
    shown = key[:3] + "*" * min(8, max(0, len(key) - 3))
    error = RequestError(f"Incorrect API key provided: {shown}.", status=401,
                         code="invalid_api_key")
  return error


def check(access: Access, path: str, authorization: str | None) -> None:
  """RequestError (401, 403) unless a request to `path` with this Authorization header may
  proceed."""
  key = bearer(authorization)
  if path.startswith("/v1/admin/"):
    if not access.admin_keys:
      raise RequestError("the admin API is off on this server: start it with an admin key "
                         f"(--admin-key or {ENV_ADMIN_KEYS})", status=403,
                         kind="permission_error")
    if not _known(key, access.admin_keys):
      raise _unauthorized(key)
    return
  keyed = path.startswith("/v1/") or (access.key_probes and path in PROBES)
  if keyed and access.api_keys and not _known(key, access.api_keys):
    raise _unauthorized(key)


def reload_folder(access: Access, path: str) -> str:
  """The real path of a reload's `path` (relative: under the root), or a 403 that is the same
  sentence for any path outside `access.reload_root`, existing or not."""
  if not access.reload_root:
    raise RequestError("reloads are off on this server: set serve.reload_root to the folder "
                       "they may come from", status=403, kind="permission_error", param="path")
  real = os.path.realpath(os.path.join(access.reload_root, path))
  if os.path.commonpath([real, access.reload_root]) != access.reload_root:
    raise RequestError("path must name a folder under this server's reload root "
                       "(serve.reload_root)", status=403, kind="permission_error", param="path")
  return real


def scrubbed(access: Access, message: str) -> str:
  """`message` with the reload root's absolute path shown as `<reload_root>`."""
  return message.replace(access.reload_root, "<reload_root>") if access.reload_root else message
