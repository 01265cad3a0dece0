"""A private Docker Engine for one test session (real dockerd, Debian ``docker.io``).

Each session gets its own socket, data root and exec root, so concurrent sessions never share
state, and no bridge or iptables rules are touched (builds use the host network, verification
containers none). Everything is torn down by PID at the end.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.cpuacct import PARENT_ENV

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Dockerd:
    host: str  # DOCKER_HOST value
    root: Path
    proc: subprocess.Popen[bytes]
    bridge: str = ""
    data_root: Path | None = None  # None: root/data; else a path the caller owns (a test fs)

    def stop(self, *, keep_data: bool = False) -> None:
        """Stop the daemon and remove its directories; ``keep_data``: leave a caller-owned
        ``data_root`` (its images and build cache) for a later daemon, e.g. an acceptance image
        another step reads."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # dockerd's overlay mounts live under the data root; unmount anything left before removal
        roots = [str(r) for r in (self.root, self.data_root) if r is not None]
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                  if any(r in line.split()[1] for r in roots)]
        for m in sorted(mounts, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
        if self.data_root is not None and not keep_data:
            shutil.rmtree(self.data_root, ignore_errors=True)
        if self.bridge:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def kill(self) -> None:
        """The fault: SIGKILL to this dockerd's PID (nothing else), reaped. Its data root, exec
        root and socket stay as a crash leaves them; :meth:`restart` starts on them again."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def restart(self, timeout: float = 60) -> Dockerd:
        """A new dockerd on the same data root, exec root, socket and bridge (after
        :meth:`kill`); this object is spent, stop the returned one."""
        if self.proc.poll() is None:
            raise RuntimeError(f"dockerd {self.proc.pid} still runs; kill() it first")
        # The killed dockerd's containerd died with it, but nobody may reap it (PID 1 of a
        # container often does not): its pid file then names a zombie, which dockerd takes
        # for a running containerd and waits on forever. Only a live one may be reused.
        pidfile = self.root / "exec" / "containerd" / "containerd.pid"
        if pidfile.is_file() and not _running(pidfile.read_text().strip()):
            pidfile.unlink()
        return start_dockerd(timeout, root=self.root, data_root=self.data_root,
                             bridge=self.bridge)


def _running(pid: str) -> bool:
    """Whether ``pid`` is a process that is neither gone nor a zombie."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


_BRIDGES = itertools.count()


def _private_bridge() -> str:
    """A bridge of the session's own for dockerd's default network (containers here use the
    host's network or none, so it carries nothing). Not ``--bridge=none``: a dockerd started with
    it deletes the host's ``docker0``, breaking a Docker the machine already runs."""
    name = f"verlenv{os.getpid() % 100000}x{next(_BRIDGES)}"[:15]
    subprocess.run(["ip", "link", "del", name], capture_output=True)
    subprocess.run(["ip", "link", "add", "name", name, "type", "bridge"], check=True,
                   capture_output=True)
    # an address of its own, so dockerd does not pick docker0's default subnet
    subprocess.run(["ip", "addr", "add", "172.31.254.1/30", "dev", name], check=True,
                   capture_output=True)
    return name


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "dockerd needs root"
    if not shutil.which("dockerd"):
        return "dockerd not installed (apt-get install docker.io)"
    return None


def cgroup_parent() -> list[str]:
    """dockerd's ``--cgroup-parent`` where the test group accounts its CPU in a cgroup of its
    own (tests/support/cpuacct.py): the engine's containers and build steps are then the
    group's, not the top of the hierarchy's."""
    parent = os.environ.get(PARENT_ENV)
    return [f"--cgroup-parent={parent}"] if parent else []


def start_dockerd(timeout: float = 60, *, root: Path | None = None,
                  data_root: Path | None = None, bridge: str | None = None) -> Dockerd:
    """A private dockerd. ``data_root``: where it keeps images and the build cache (default
    ``root/data``), e.g. on a small filesystem a test mounted; ``root`` and ``bridge``: those of
    an earlier dockerd to start again on (:meth:`Dockerd.restart`)."""
    root = root or Path(tempfile.mkdtemp(prefix="verl-env-dockerd-", dir="/var/tmp"))
    sock = root / "docker.sock"
    log = open(root / "dockerd.log", "ab")
    bridge = bridge or _private_bridge()
    proc = subprocess.Popen(
        ["dockerd", "--data-root", str(data_root or root / "data"), "--exec-root",
         str(root / "exec"), "--pidfile", str(root / "dockerd.pid"), "-H", f"unix://{sock}",
         "--bridge", bridge, "--iptables=false", "--ip6tables=false", "--ip-masq=false",
         *cgroup_parent()],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    d = Dockerd(f"unix://{sock}", root, proc, bridge, data_root)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if sock.exists() and subprocess.run(
                ["docker", "-H", d.host, "version"], capture_output=True).returncode == 0:
            return d
        time.sleep(0.2)
    tail = (root / "dockerd.log").read_text(errors="replace")[-2000:]
    d.stop()
    raise RuntimeError(f"dockerd did not start:\n{tail}")


def import_debian_base(host: str, tag: str = "verl-env-test/debian:bookworm") -> str:
    """Import the debootstrap base (cached tarball) into the engine at ``host``."""
    env = {**os.environ, "DOCKER_HOST": host}
    proc = subprocess.run([str(REPO / "scripts" / "debian-base.sh"), tag], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"debian-base.sh failed: {proc.stderr[-2000:]}")
    return tag
