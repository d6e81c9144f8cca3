"""kubernetes_asyncio's credential loaders, without the rest of kubernetes_asyncio.

warmwatch uses one part of kubernetes_asyncio: :mod:`kubernetes_asyncio.config`, which reads
kubeconfigs (client certificates, tokens, token files, exec plugins, basic auth) and the
in-cluster service account into a ``kubernetes_asyncio.client.Configuration``; requests go
through warmwatch's own sessions (``connecting``). But importing any module of the package
first runs ``kubernetes_asyncio/__init__.py`` and ``kubernetes_asyncio/client/__init__.py``,
which import every generated API and model class. Measured on the 2-core test machine, in a
process that has warmwatch's other modules: the whole package costs 34 MB of resident memory
and 0.25 to 0.45 s, the modules the loaders need 2 MB and 35 to 60 ms (an idle
``python -m proxy`` takes 49 MB instead of 84 MB). warmwatch pays the import before its port
opens, on every restart, and keeps the memory for its lifetime.

:func:`credential_loaders` therefore loads only those modules, when the process has not
imported kubernetes_asyncio already:

1. the two packages are registered in ``sys.modules`` as empty modules made from their own
   specs, without running their ``__init__``, so that their submodules can be imported;
2. ``kubernetes_asyncio.client.configuration`` is imported, and its ``Configuration`` set on
   the empty client package together with a stand-in for ``ApiClient`` (the two names that
   ``kube_config`` and ``incluster_config`` import from it; ``ApiClient`` only serves
   ``new_client_from_config``, which warmwatch never calls, and the stand-in imports the
   real class when called);
3. ``kubernetes_asyncio.config`` is imported: the real package, with all its loaders;
4. every ``kubernetes_asyncio`` module is taken out of ``sys.modules`` again: warmwatch keeps
   its own references, and a later ``import kubernetes_asyncio`` in the same process (a
   controller library, the tests) is an ordinary first import of the whole package. Leaving
   the loaded submodules in ``sys.modules`` would not do: the import system binds a submodule
   to its package only when it loads it, so the package imported later would lack its
   ``configuration`` and ``exceptions`` attributes (``client.exceptions.ApiException``).

The cost of that isolation: in a process that imports the package only after warmwatch loaded
its credentials, warmwatch's loaders are a copy of their own, and state kept on the library's
modules (``Configuration``'s default, ``incluster_config.TOKEN_REFRESH_PERIOD``) is not shared
with that process's copy. warmwatch passes its own ``Configuration`` to every loader, so it
never uses that state. A process that imported the package first shares it, as before.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

__all__ = ["CredentialLoaders", "credential_loaders"]

_PACKAGE: Final = "kubernetes_asyncio"
_CLIENT: Final = "kubernetes_asyncio.client"


@dataclass(frozen=True, kw_only=True, slots=True)
class CredentialLoaders:
    """What ``connecting`` uses of kubernetes_asyncio (untyped there: ``Any``)."""

    config: ModuleType
    """``kubernetes_asyncio.config``: ``load_kube_config``, ``load_incluster_config``,
    ``ConfigException``, and the ``incluster_config`` module."""

    configuration: Callable[[], Any]
    """``kubernetes_asyncio.client.Configuration``: an empty configuration for a loader to
    fill."""


@functools.cache
def credential_loaders() -> CredentialLoaders:
    """kubernetes_asyncio's credential loaders: the process's own when it has imported
    kubernetes_asyncio, else only the modules they need, loaded as the module says.
    Loaded once; not safe against another thread importing kubernetes_asyncio meanwhile."""
    if _PACKAGE in sys.modules:
        import kubernetes_asyncio.config
        from kubernetes_asyncio.client import Configuration

        return CredentialLoaders(config=kubernetes_asyncio.config, configuration=Configuration)
    try:
        for name in (_PACKAGE, _CLIENT):
            spec = importlib.util.find_spec(name)
            if spec is None:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            sys.modules[name] = importlib.util.module_from_spec(spec)
        configuration = importlib.import_module(f"{_CLIENT}.configuration").Configuration
        # The two names kube_config and incluster_config import from the client package.
        vars(sys.modules[_CLIENT]).update(Configuration=configuration, ApiClient=_api_client)
        config = importlib.import_module(f"{_PACKAGE}.config")
    finally:
        for name in [n for n in sys.modules if n == _PACKAGE or n.startswith(f"{_PACKAGE}.")]:
            del sys.modules[name]
    return CredentialLoaders(config=config, configuration=configuration)


def _api_client(*args: Any, **kwargs: Any) -> Any:
    """``kubernetes_asyncio.client.ApiClient(...)``, importing the whole package when called
    (``config.new_client_from_config``: never by warmwatch)."""
    from kubernetes_asyncio.client import ApiClient

    return ApiClient(*args, **kwargs)
