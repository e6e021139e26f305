"""The sandbox executor image: its tag (a hash of its inputs) and its build.

    python -m sandbox_pool.image build     # what `make sandbox-image` runs; does nothing when built

The tag is `coderloo-sandbox:<hash of docker/Dockerfile and IMAGE_FILES, the files it copies>`,
so the image is rebuilt exactly when one of them changes. The base (Python 3, g++ and Node.js on
Debian bookworm) comes from docker/Dockerfile.base when a registry is reachable; without one, from
debootstrap with the Debian mirror of this machine's apt sources, imported with `docker import`.
"""
from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common.progress import working

PACKAGE = Path(__file__).resolve().parent
DOCKER_DIR = PACKAGE.parent / "docker"
# The build context besides docker/Dockerfile (which copies all of it): the executor and what it imports.
IMAGE_FILES = [PACKAGE / name for name in ("container_executor.py", "supervisor.py", "judge.py", "kernel.py", "wait.py", "runner.py", "protocol.py", "confine.py", "matching.py", "call_harness.js")]
REPOSITORY = "coderloo-sandbox"
DEBOOTSTRAP_PACKAGES = "python3,g++,nodejs"
# The base's tag names what is in it, so that a machine holding an older base (without nodejs)
# builds the new one instead of reusing it.
BASE_IMAGE = "coderloo-sandbox-base:bookworm-" + hashlib.sha256(
    (DOCKER_DIR / "Dockerfile.base").read_bytes() + DEBOOTSTRAP_PACKAGES.encode()).hexdigest()[:8]


def image_tag() -> str:
    digest = hashlib.sha256(BASE_IMAGE.encode())
    for path in [DOCKER_DIR / "Dockerfile", *IMAGE_FILES]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{REPOSITORY}:{digest.hexdigest()[:12]}"


def has_image(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode == 0


def build() -> str:
    tag = image_tag()
    if has_image(tag):
        print(f"sandbox image {tag} is up to date")
        return tag
    if not has_image(BASE_IMAGE):
        build_base()
    with tempfile.TemporaryDirectory() as context:
        for path in [DOCKER_DIR / "Dockerfile", *IMAGE_FILES]:
            shutil.copy(path, context)
        with working(f"building the sandbox image {tag}"):
            run(["docker", "build", "-q", "--build-arg", f"BASE={BASE_IMAGE}", "-t", tag, context], stdout=subprocess.DEVNULL)
    print(f"built sandbox image {tag}")
    return tag


def build_base() -> None:
    pulled = subprocess.run(["timeout", "30", "docker", "pull", "-q", "debian:bookworm-slim"], capture_output=True)
    if pulled.returncode == 0:
        with working(f"building the base image {BASE_IMAGE} from debian:bookworm-slim"):
            run(["docker", "build", "-q", "-t", BASE_IMAGE, "-f", str(DOCKER_DIR / "Dockerfile.base"), str(DOCKER_DIR)],
                stdout=subprocess.DEVNULL)
        return
    mirror = debian_mirror()
    print(f"no registry reachable ({pulled.stderr.decode().strip()[:120]}); debootstrap from {mirror}", flush=True)
    with tempfile.TemporaryDirectory(prefix="coderloo-rootfs-") as rootfs:
        # debootstrap says each package it gets and unpacks: hundreds of lines, kept for a failure
        log = Path(tempfile.gettempdir()) / "coderloo-debootstrap.log"
        with working(f"debootstrap of bookworm ({DEBOOTSTRAP_PACKAGES}); its log: {log}"), log.open("w") as out:
            run(["debootstrap", "--variant=minbase", f"--include={DEBOOTSTRAP_PACKAGES}", "bookworm", rootfs, mirror],
                stdout=out, stderr=subprocess.STDOUT)
        with working(f"importing it as {BASE_IMAGE}"):
            tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
            run(["docker", "import", "-", BASE_IMAGE], stdin=tar.stdout, stdout=subprocess.DEVNULL)
            if tar.wait() != 0:
                raise RuntimeError("tar of the debootstrapped root failed")


def debian_mirror() -> str:
    """The first Debian (not -security) mirror in this machine's apt sources."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        if not path.is_file():
            continue
        text = path.read_text()
        found = re.findall(r"^URIs:\s*(\S+)", text, re.M) + re.findall(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)", text, re.M)
        for uri in found:
            if "security" not in uri:
                return uri
    raise RuntimeError("no Debian mirror found in /etc/apt/sources.list{,.d}: give one to debootstrap")


def run(command: list[str], **kwargs) -> None:
    result = subprocess.run(command, **kwargs)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:3])} ... failed with exit code {result.returncode}")


if __name__ == "__main__":
    if sys.argv[1:] != ["build"]:
        raise SystemExit("usage: python -m sandbox_pool.image build")
    build()
