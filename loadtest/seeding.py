"""Peer seeding's stage on a control plane, one way for the e2e tests and the benchmark: the
service accounts two warmwatch peers run as, the RBAC grants seeding needs, and their tokens.

    async with seeding.admin(plane) as api:
        tokens = await seeding.make_accounts(api, home="ns", namespaces=("ns",))
    kubeapi.kubeconfig_for(plane.server, path=..., token=tokens[seeding.ACCOUNT], ca=...)

What each account is granted (README "Peer seeding"; ``deploy/example/rbac.yaml`` grants the
same to a pod): ``get``/``list``/``watch`` of ConfigMaps in ``namespaces``; ``create`` on
``serviceaccounts/token`` for itself only (TokenRequest: the token it sends a peer, bound to
the peer's certificate, and the reply token); TokenReviews (``system:auth-delegator``); and
``get`` of the ``kube-system`` namespace (the cluster's identity a snapshot is checked
against). The TLS material is warmwatch's own: its seeding listener makes a self-signed pair
(``--cert-dir``, else beside its database) that the requester pins, so none is made here.
Tokens for the apiserver last an hour; a bound one is asked with
``kubeapi.service_account_token(..., audiences=(binding.peer_audience(...),))``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadtest import kubeapi
from loadtest.cluster import ControlPlane

ACCOUNT = "warmwatch"
"""The account both peers of one workload run as."""

RBAC = "/apis/rbac.authorization.k8s.io/v1"


def admin(plane: ControlPlane, *, concurrency: int = 64) -> kubeapi.RawClient:
    """The control plane's admin, to set the stage."""
    return kubeapi.RawClient(
        base_url=plane.server,
        concurrency=concurrency,
        ssl_context=kubeapi.client_ssl(plane.pki, identity="admin"),
    )


def binding(
    name: str, *, kind: str, role: str, namespace: str, accounts: Sequence[str] = (ACCOUNT,)
) -> dict[str, Any]:
    """A (Cluster)RoleBinding of ``role`` to the ``accounts`` of ``namespace``."""
    return {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
        "subjects": [
            {"kind": "ServiceAccount", "name": account, "namespace": namespace}
            for account in accounts
        ],
    }


def rule(group: str, resource: str, *verbs: str, names: Sequence[str] = ()) -> dict[str, Any]:
    rule: dict[str, Any] = {"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}
    if names:
        rule["resourceNames"] = list(names)
    return rule


async def grant(
    api: kubeapi.RawClient, *, home: str, namespaces: Sequence[str], accounts: Sequence[str]
) -> None:
    """What ``accounts`` of ``home`` need to seed (the module's docstring). The cluster-wide
    grants are named ``home`` and ``home-auth`` (``revoke`` removes them)."""
    for namespace in namespaces:
        await api.ensure(
            f"{RBAC}/namespaces/{namespace}/roles",
            {
                "metadata": {"name": "configmaps"},
                "rules": [rule("", "configmaps", "get", "list", "watch")],
            },
        )
        await api.ensure(
            f"{RBAC}/namespaces/{namespace}/rolebindings",
            binding(
                "configmaps", kind="Role", role="configmaps", namespace=home, accounts=accounts
            ),
        )
    for account in accounts:
        await api.ensure(
            f"{RBAC}/namespaces/{home}/roles",
            {
                "metadata": {"name": f"token-{account}"},
                "rules": [rule("", "serviceaccounts/token", "create", names=(account,))],
            },
        )
        await api.ensure(
            f"{RBAC}/namespaces/{home}/rolebindings",
            binding(
                f"token-{account}",
                kind="Role",
                role=f"token-{account}",
                namespace=home,
                accounts=(account,),
            ),
        )
    await api.ensure(
        f"{RBAC}/clusterroles",
        {
            "metadata": {"name": home},
            "rules": [rule("", "namespaces", "get", names=("kube-system",))],
        },
    )
    for name, role in ((home, home), (f"{home}-auth", "system:auth-delegator")):
        await api.ensure(
            f"{RBAC}/clusterrolebindings",
            binding(name, kind="ClusterRole", role=role, namespace=home, accounts=accounts),
        )


async def revoke(api: kubeapi.RawClient, *, home: str) -> None:
    """``grant``'s cluster-wide grants (the namespaced ones go with their namespaces)."""
    for name in (home, f"{home}-auth"):
        await api.delete(f"{RBAC}/clusterrolebindings/{name}")
    await api.delete(f"{RBAC}/clusterroles/{home}")


async def make_accounts(
    api: kubeapi.RawClient,
    *,
    home: str,
    namespaces: Sequence[str],
    accounts: Sequence[str] = (ACCOUNT,),
) -> dict[str, str]:
    """The service ``accounts`` in ``home`` (made, with it, if missing), ``grant``-ed for the
    ConfigMaps of ``namespaces``; each one's token for the apiserver, by name."""
    await kubeapi.ensure_namespace(api, home)
    for account in accounts:
        await api.ensure(
            f"/api/v1/namespaces/{home}/serviceaccounts", {"metadata": {"name": account}}
        )
    await grant(api, home=home, namespaces=namespaces, accounts=accounts)
    return {
        account: await kubeapi.service_account_token(api, namespace=home, account=account)
        for account in accounts
    }
