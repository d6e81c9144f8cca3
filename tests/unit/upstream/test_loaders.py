"""kubernetes_asyncio's credential loaders without the rest of the package (``loaders``).

Each check runs in a fresh interpreter: what matters is which modules a process imports, and
the test process has imported all of kubernetes_asyncio already.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from pathlib import Path
from typing import Any

from loadtest.pki import write_kubeconfig
from tests.unit.upstream.conftest import (
    FakeApiserver,
    Served,
    exec_kubeconfig,
    token_kubeconfig,
    user_kubeconfig,
)

ROOT = Path(__file__).resolve().parents[3]

# Connects with each case's settings and sends two requests, rewriting a file between them
# (a token being rotated); reports the kubernetes_asyncio modules imported and left behind.
CONNECT = """\
import asyncio, json, os, pathlib, sys

class Recorder:
    names = []

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        cls.names.append(name)
        return None

sys.meta_path.insert(0, Recorder)
import proxy.__main__  # what `python -m proxy` imports
from proxy.metrics import Metrics
from proxy.upstream.connecting import ConnectionSettings, connect

def ours(names):
    return sorted({n for n in names if n.split(".")[0] == "kubernetes_asyncio"})

async def main():
    at_start = ours(Recorder.names)
    statuses = []
    for case in json.loads(sys.argv[1]):
        os.environ.update(case["env"])
        upstream = await connect(ConnectionSettings(**case["settings"]), metrics=Metrics())
        try:
            for step in (1, 2):
                async with upstream.request("GET", f"/echo/{case['name']}-{step}", purpose="passthrough") as answer:
                    statuses.append(answer.status)
                if step == 1 and case["rewrite"]:
                    pathlib.Path(case["rewrite"][0]).write_text(case["rewrite"][1])
        finally:
            await upstream.close()
        for name in case["env"]:
            del os.environ[name]
    print(json.dumps({
        "at_start": at_start,
        "imported": ours(Recorder.names),
        "left": ours(sys.modules),
        "statuses": statuses,
    }))

asyncio.run(main())
"""

# The narrow import first, then the whole package as a controller library imports it.
LATER_IMPORT = """\
import asyncio, json, sys
from proxy.upstream.loaders import credential_loaders

narrow = credential_loaders().config

async def main():
    from kubernetes_asyncio import client, config

    result = {
        "CoreV1Api": hasattr(client, "CoreV1Api"),
        "exceptions": client.exceptions.ApiException.__name__,
        "models": "kubernetes_asyncio.client.models" in sys.modules,
    }
    api = await config.new_client_from_config(config_file=sys.argv[1])
    result["new_client"] = [isinstance(api, client.ApiClient), api.configuration.host]
    await api.close()
    await config.load_kube_config(config_file=sys.argv[1])
    result["default_host"] = client.Configuration.get_default_copy().host
    api = await narrow.new_client_from_config(config_file=sys.argv[1])  # the stand-in ApiClient
    result["narrow_new_client"] = isinstance(api, client.ApiClient)
    await api.close()
    print(json.dumps(result))

asyncio.run(main())
"""

# A process that imported kubernetes_asyncio first: its modules are used.
EARLIER_IMPORT = """\
import kubernetes_asyncio
from proxy.upstream.loaders import credential_loaders

loaders = credential_loaders()
print(loaders.config is kubernetes_asyncio.config,
      loaders.configuration is kubernetes_asyncio.client.Configuration)
"""


async def _python(script: str, *args: str, env: dict[str, str] | None = None) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return out.decode()


def _case(
    name: str, settings: dict[str, Any], *, env: dict[str, str] | None = None, rewrite: Any = None
) -> dict[str, Any]:
    return {"name": name, "settings": settings, "env": env or {}, "rewrite": rewrite}


async def test_warmwatch_loads_every_kind_of_credentials_without_the_generated_client(
    apiserver: Served, tls_apiserver: Served, fake: FakeApiserver, pki: Any, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("file-1\n")
    sa_token = tmp_path / "sa-token"
    sa_token.write_text("sa-token-1")
    fake.rejected_tokens.add("exec-token-1")  # a 401 makes warmwatch run the plugin again
    plain = apiserver.url
    token = token_kubeconfig(tmp_path / "kc-token", server=plain, token="tk")
    token_from_file = user_kubeconfig(
        tmp_path / "kc-tokenfile", server=plain, user=f'{{tokenFile: "{token_file}"}}'
    )
    exec_plugin = exec_kubeconfig(
        tmp_path / "kc-exec", server=plain, counter=tmp_path / "count", expires_in="none"
    )
    basic = user_kubeconfig(tmp_path / "kc-basic", server=plain, user="{username: u, password: p}")
    certs = write_kubeconfig(
        path=tmp_path / "kc-certs", pki=pki, identity="admin", server=tls_apiserver.url
    )
    cases = [
        _case("token", {"kubeconfig": str(token)}),
        _case(
            "tokenfile",
            {"kubeconfig": str(token_from_file), "token_file_reread": 0.0},
            rewrite=[str(token_file), "file-2"],
        ),
        _case("exec", {"kubeconfig": str(exec_plugin)}),
        _case("basic", {"kubeconfig": str(basic)}),
        _case("certs", {"kubeconfig": str(certs)}),
        _case(
            "incluster",
            {"incluster_token_path": str(sa_token), "incluster_ca_path": str(pki.ca_cert)},
            env={
                "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "KUBERNETES_SERVICE_PORT": str(tls_apiserver.port),
            },
        ),
    ]
    result = json.loads(await _python(CONNECT, json.dumps(cases)))

    assert result["at_start"] == []  # connect() imports the loaders, `--help` never does
    assert "kubernetes_asyncio.config.kube_config" in result["imported"]
    assert "kubernetes_asyncio.config.incluster_config" in result["imported"]
    assert [n for n in result["imported"] if n.startswith("kubernetes_asyncio.client.")] == [
        "kubernetes_asyncio.client.configuration",
        "kubernetes_asyncio.client.exceptions",
    ]  # not kubernetes_asyncio.client.models, .api, .api_client
    assert result["left"] == []
    seen = {s.path_qs.removeprefix("/echo/"): s for s in fake.seen}
    assert {name: s.headers.get("authorization") for name, s in seen.items()} == {
        "token-1": "Bearer tk",
        "token-2": "Bearer tk",
        "tokenfile-1": "Bearer file-1",
        "tokenfile-2": "Bearer file-2",
        "exec-1": "Bearer exec-token-1",
        "exec-2": "Bearer exec-token-2",
        "basic-1": "Basic " + base64.b64encode(b"u:p").decode(),
        "basic-2": "Basic " + base64.b64encode(b"u:p").decode(),
        "certs-1": None,
        "certs-2": None,
        "incluster-1": "Bearer sa-token-1",
        "incluster-2": "Bearer sa-token-1",
    }
    assert result["statuses"] == [200, 200, 200, 200, 401, 200, 200, 200, 200, 200, 200, 200]
    assert seen["certs-1"].peer_cn == "warmwatch-admin"
    assert seen["incluster-1"].peer_cn is None


async def test_the_whole_package_imported_after_the_loaders_works(tmp_path: Path) -> None:
    kubeconfig = token_kubeconfig(tmp_path / "kc", server="http://127.0.0.1:1", token="t")
    result = json.loads(await _python(LATER_IMPORT, str(kubeconfig)))
    assert result == {
        "CoreV1Api": True,
        "exceptions": "ApiException",
        "models": True,
        "new_client": [True, "http://127.0.0.1:1"],
        "default_host": "http://127.0.0.1:1",
        "narrow_new_client": True,
    }


async def test_a_process_that_imported_the_package_shares_its_loaders() -> None:
    assert (await _python(EARLIER_IMPORT)).split() == ["True", "True"]
