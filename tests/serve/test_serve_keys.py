"""`serve.keys` by hand: which requests each setting lets through, where keys come from, and
which reload paths lie under the root (the HTTP side: tests/serve/test_serve_limits.py)."""
import dataclasses
import os
import types

import pytest

from orl_jax.serve import keys
from orl_jax.serve.protocol import RequestError


def _serve(**kw):
  fields = dict(api_keys="", admin_keys="", reload_root="", key_probes=False)
  return types.SimpleNamespace(**{**fields, **kw})


def _status(access, path, authorization=None):
  try:
    keys.check(access, path, authorization)
  except RequestError as e:
    return e.status
  return 200


def test_keys_come_from_the_config_the_flags_and_the_environment():
  access = keys.access_from(_serve(api_keys="a,b"), ["c", "a"], ["x"],
                            {"ORL_API_KEYS": " d ,,e", "ORL_ADMIN_KEYS": "y"})
  assert access.api_keys == ("a", "b", "c", "d", "e") and access.admin_keys == ("x", "y")
  assert keys.access_from(_serve(), [], [], {}) == keys.OPEN


@pytest.mark.parametrize("path,authorization,open_,keyed,probes_keyed", [
    ("/v1/completions", None, 200, 401, 401),
    ("/v1/completions", "Bearer k", 200, 200, 200),
    ("/v1/completions", "bearer k", 200, 200, 200),
    ("/v1/completions", "Basic k", 200, 401, 401),
    ("/v1/completions", "Bearer kk", 200, 401, 401),
    ("/v1/models", None, 200, 401, 401),
    ("/health", None, 200, 200, 401),
    ("/metrics", "Bearer k", 200, 200, 200),
    ("/v1/admin/reload", "Bearer k", 403, 403, 403),
])
def test_which_requests_each_setting_lets_through(path, authorization, open_, keyed,
                                                  probes_keyed):
  assert _status(keys.OPEN, path, authorization) == open_
  assert _status(dataclasses.replace(keys.OPEN, api_keys=("k",)), path, authorization) == keyed
  probes = dataclasses.replace(keys.OPEN, api_keys=("k",), key_probes=True)
  assert _status(probes, path, authorization) == probes_keyed


def test_the_admin_routes_take_only_an_admin_key():
  access = dataclasses.replace(keys.OPEN, api_keys=("k",), admin_keys=("adm",))
  assert _status(access, "/v1/admin/reload", "Bearer adm") == 200
  assert _status(access, "/v1/admin/reload", "Bearer k") == 401
  assert _status(access, "/v1/completions", "Bearer adm") == 401


def test_reload_paths_resolve_under_the_root_and_nowhere_else(tmp_path):
  root = tmp_path / "root"
  (root / "run").mkdir(parents=True)
  (root / "escape").symlink_to(tmp_path)
  access = dataclasses.replace(keys.OPEN, reload_root=os.path.realpath(root))
  assert keys.reload_folder(access, "run") == os.path.realpath(root / "run")
  assert keys.reload_folder(access, str(root / "run" / ".." / "run")) == \
      os.path.realpath(root / "run")
  messages = set()
  for outside in ("..", "/etc", "escape", str(tmp_path), "run/../../x"):
    with pytest.raises(RequestError) as e:
      keys.reload_folder(access, outside)
    assert e.value.status == 403
    messages.add(str(e.value))
  assert len(messages) == 1
  with pytest.raises(RequestError, match="reloads are off"):
    keys.reload_folder(keys.OPEN, "run")
