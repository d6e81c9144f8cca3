"""Container images without a registry: the Debian base, warmwatch's image, the pause image and
the test controllers' images, built with podman (docker where its daemon answers instead).

    python -m loadtest.images warmwatch      # `make image`: localhost/warmwatch:dev
    python -m loadtest.images base           # only the Debian base

The public Python image cannot be pulled where no registry is reachable (the test machines), so
the base is built from Debian packages: ``debootstrap --variant=minbase bookworm`` with python3
and python3-venv, ``python`` linked to python3 (the Dockerfile runs ``python -m venv``), the
package lists and docs removed. Its root filesystem is cached as a tarball under
``~/.cache/warmwatch/`` (the expensive step, ~1 minute) and imported into the builder's store
when the store lacks it; ``make image PYTHON_IMAGE=python:3.11-slim-bookworm`` uses the public
image instead. The tools install themselves (``apt-get install``) when missing: CI runs as root
on a fresh machine.

Builds run with ``--network=host`` (pip reaches PyPI through the host's network, trusting the
host's CA certificates, mounted read-only into the build): no bridge is created for them.
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from loadtest.building import KUBERNETES_VERSION, cache_root

REPO = Path(__file__).resolve().parents[1]

WARMWATCH_IMAGE = "localhost/warmwatch:dev"
BASE_IMAGE = "localhost/warmwatch-base:bookworm"
PAUSE_IMAGE = "localhost/pause:3.10.2"
"""The pause image's tag: the release's own (build/pause/Makefile of k8s.io/kubernetes)."""

BASE_PACKAGES = ("python3", "python3-venv")
"""On top of minbase: what the Dockerfile's build stage and warmwatch need at run time."""

PACKAGES = {
    # command -> Debian package that provides it
    "podman": "podman",
    "buildah": "buildah",
    "debootstrap": "debootstrap",
    "containerd": "containerd",
    "runc": "runc",
    "iptables-save": "iptables",
    "gcc": "gcc",
    # the second node (loadtest/node.py): its network namespace and the relays into it
    "ip": "iproute2",
    "nsenter": "util-linux",
    "socat": "socat",
}
CNI_PACKAGE = ("/usr/lib/cni/loopback", "containernetworking-plugins")

CONTAINERS_CONF = Path("/etc/containers/containers.conf")
CONTAINERS_CONF_TEXT = """\
# Written by warmwatch's loadtest/images.py for machines without systemd on cgroup v1:
# crun does not support hybrid cgroups, and the default ulimits exceed a VM's hard limits.
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
events_logger = "file"
"""


def _say(message: str) -> None:
    print(f"[images] {message}", file=sys.stderr, flush=True)


def ensure_packages() -> None:
    """apt-get install what the image builds and the node need, once per machine."""
    missing = sorted({package for command, package in PACKAGES.items() if not _which(command)})
    if not Path(CNI_PACKAGE[0]).exists():
        missing.append(CNI_PACKAGE[1])
    if missing:
        _say(f"apt-get install {' '.join(missing)}")
        env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
    if not CONTAINERS_CONF.exists():
        CONTAINERS_CONF.parent.mkdir(parents=True, exist_ok=True)
        CONTAINERS_CONF.write_text(CONTAINERS_CONF_TEXT)


def _which(command: str) -> str | None:
    return shutil.which(command, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


@functools.cache
def builder() -> str:
    """``docker`` where its daemon answers, else ``podman`` (installed when missing)."""
    if _which("docker") and _quiet(["docker", "info"]):
        return "docker"
    ensure_packages()
    return "podman"


def _quiet(argv: list[str]) -> bool:
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


def image_exists(image: str) -> bool:
    return _quiet([builder(), "image", "inspect", image])


def _base_tarball() -> Path:
    """The Debian base's root filesystem, built once per machine (cached)."""
    tarball = cache_root() / "images" / f"debian-bookworm-{'-'.join(BASE_PACKAGES)}.tar"
    if tarball.exists():
        return tarball
    ensure_packages()
    tarball.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="warmwatch-rootfs-", dir=tarball.parent) as scratch:
        rootfs = Path(scratch) / "rootfs"
        _say("debootstrap bookworm (minbase + python3), about a minute ...")
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                "bookworm",
                str(rootfs),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        (rootfs / "usr/bin/python").symlink_to("python3")
        for cache in ("var/lib/apt/lists", "var/cache/apt", "usr/share/doc", "usr/share/man"):
            shutil.rmtree(rootfs / cache, ignore_errors=True)
            (rootfs / cache).mkdir(parents=True)
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True)
        partial.rename(tarball)
    _say(f"built {tarball.name} in {time.monotonic() - started:.0f}s")
    return tarball


def ensure_base() -> str:
    """The Debian base image in the builder's store (imported from the cached tarball)."""
    if not image_exists(BASE_IMAGE):
        tarball = _base_tarball()
        subprocess.run(
            [builder(), "import", "--change", 'CMD ["/bin/bash"]', str(tarball), BASE_IMAGE],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return BASE_IMAGE


def build_warmwatch(
    *, tag: str = WARMWATCH_IMAGE, python_image: str | None = None, context: Path = REPO
) -> str:
    """``make image``: the Dockerfile built on ``python_image`` (default: the Debian base), in
    ``context`` (another checkout's sources, for an older release)."""
    base = python_image or ensure_base()
    started = time.monotonic()
    subprocess.run(
        [
            builder(),
            "build",
            "--network=host",
            *_host_certificates(),
            f"--build-arg=PYTHON_IMAGE={base}",
            "-t",
            tag,
            str(context),
        ],
        check=True,
    )
    _say(f"built {tag} on {base} in {time.monotonic() - started:.0f}s, {size_mb(tag):.0f} MB")
    return tag


def _host_certificates() -> list[str]:
    """podman mounts the host's CA certificates into the build's RUN steps (nothing of them
    goes into the image): Debian's pip trusts /etc/ssl/certs, and where PyPI is reached through
    a TLS-inspecting proxy only the host's bundle has its CA."""
    certificates = Path("/etc/ssl/certs")
    if builder() != "podman" or not certificates.is_dir():
        return []
    return [f"--volume={certificates}:{certificates}:ro"]


def release_context(*, commit: str, directory: Path) -> Path:
    """A build context of warmwatch as of ``commit`` (its ``proxy`` package), with today's
    Dockerfile and requirements.lock: an image of an older release, for upgrade tests."""
    directory.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, "proxy", "pyproject.toml", "README.md"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(directory, filter="data")
    for name in ("Dockerfile", "requirements.lock", ".dockerignore"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, directory / name)
    return directory


def size_mb(image: str) -> float:
    out = subprocess.run(
        [builder(), "image", "inspect", "--format", "{{.Size}}", image],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return int(out.strip()) / 1e6


def import_files(
    *, image: str, files: Mapping[str, Path], entrypoint: Iterable[str], user: str = "65532:65532"
) -> str:
    """An image of ``files`` alone (path in image -> file here), as ``scratch`` would make:
    for static binaries (the pause program, Go controllers)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, source in files.items():
            info = archive.gettarinfo(str(source), arcname=name.lstrip("/"))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = 0o755
            with open(source, "rb") as content:
                archive.addfile(info, content)
    entry = ", ".join(f'"{part}"' for part in entrypoint)
    subprocess.run(
        [
            builder(),
            "import",
            "--change",
            f"ENTRYPOINT [{entry}]",
            "--change",
            f"USER {user}",
            "-",
            image,
        ],
        input=buffer.getvalue(),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return image


def ensure_pause() -> str:
    """The sandbox image the node's containerd starts for every pod: the release's pause.c
    (shipped in the k8s.io/kubernetes module zip), compiled statically."""
    if image_exists(PAUSE_IMAGE):
        return PAUSE_IMAGE
    ensure_packages()
    modcache = subprocess.run(
        ["go", "env", "GOMODCACHE"], check=True, capture_output=True, text=True
    ).stdout.strip()
    source = Path(modcache) / f"k8s.io/kubernetes@{KUBERNETES_VERSION}/build/pause/linux/pause.c"
    if not source.exists():
        subprocess.run(
            ["go", "mod", "download", f"k8s.io/kubernetes@{KUBERNETES_VERSION}"],
            check=True,
            cwd=REPO / "loadtest" / "k8sbuild",
        )
    binary = cache_root() / "images" / "pause"
    binary.parent.mkdir(parents=True, exist_ok=True)
    tag = PAUSE_IMAGE.rsplit(":", 1)[1]
    subprocess.run(
        ["gcc", "-Os", "-static", f'-DVERSION="v{tag}"', "-o", str(binary), str(source)],
        check=True,
    )
    return import_files(
        image=PAUSE_IMAGE, files={"/pause": binary}, entrypoint=["/pause"], user="65535:65535"
    )


def save(image: str) -> subprocess.Popen[bytes]:
    """A docker-archive of ``image`` on the returned process's stdout."""
    archive = ["--format", "docker-archive"] if builder() == "podman" else []
    return subprocess.Popen([builder(), "save", *archive, image], stdout=subprocess.PIPE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.images", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    warmwatch = commands.add_parser("warmwatch", help="build localhost/warmwatch:dev")
    warmwatch.add_argument("--tag", default=WARMWATCH_IMAGE)
    warmwatch.add_argument(
        "--python-image",
        default=os.environ.get("PYTHON_IMAGE") or None,
        help="the Dockerfile's PYTHON_IMAGE (default: the Debian base built here)",
    )
    commands.add_parser("base", help="build the Debian base image")
    args = parser.parse_args(argv)
    if args.command == "warmwatch":
        print(build_warmwatch(tag=args.tag, python_image=args.python_image))
    else:
        print(ensure_base())
    return 0


if __name__ == "__main__":
    sys.exit(main())
