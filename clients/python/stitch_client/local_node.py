"""An all-in-one ``stitch-node`` on this machine, for notebooks, examples and
tests: every role in one process on free loopback ports, the publisher's HTTP
surface on, its URLs read from its log::

    from stitch_client import Client
    from stitch_client.local_node import LocalNode

    with LocalNode("/tmp/stitch", "model.preset=small") as node:
        client = Client(publisher=node.publisher, gateway=node.gateway)
        ...

Production deployments run ``stitch-node`` with a config file instead.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from typing import Dict, Optional

#: Settings of the local node; ``sets`` given to :class:`LocalNode` override them.
DEFAULTS: Dict[str, str] = {
    "coordinator.listen": "127.0.0.1:0",
    "gateway.listen": "127.0.0.1:0",
    "status.listen": "127.0.0.1:0",
    "replica.listen": "127.0.0.1:0",
    "publisher.listen": "127.0.0.1:0",
    "replica.backstop": "1",
    "model.preset": "tiny",
}


def find_binary(name: str, bin_dir: Optional[str] = None) -> str:
    """``name`` in ``bin_dir``, else ``$STITCH_BIN_DIR``, else on ``PATH``."""
    for d in (bin_dir, os.environ.get("STITCH_BIN_DIR")):
        if d:
            return os.path.join(d, name)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} is not on PATH; set STITCH_BIN_DIR to the build's bin/")
    return found


class LocalNode:
    """Starts ``stitch-node`` with its data and log under ``root``; ``sets``
    are ``key=value`` settings (``--set``). Raises RuntimeError with the log
    when the node does not come up within ``timeout`` seconds."""

    def __init__(self, root: str, *sets: str, bin_dir: Optional[str] = None, timeout: float = 30):
        self.dir = root
        os.makedirs(root, exist_ok=True)
        self.log_path = os.path.join(root, "node.log")
        args = [find_binary("stitch-node", bin_dir), "--data-dir", os.path.join(root, "data")]
        settings = dict(DEFAULTS)
        settings.update(s.split("=", 1) for s in sets)
        for key, value in settings.items():
            args += ["--set", f"{key}={value}"]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            with open(self.log_path) as f:
                text = f.read()
            pub = re.search(r"publisher http://127\.0\.0\.1:(\d+)", text)
            gw = re.search(r"gateway http://127\.0\.0\.1:(\d+)", text)
            coord = re.search(r"listening on 127\.0\.0\.1:(\d+)", text)
            if pub and gw and coord:
                #: The publisher's HTTP surface (for :class:`stitch_client.Client`).
                self.publisher = f"http://127.0.0.1:{pub.group(1)}"
                #: The gateway (rollouts, ``/pool``).
                self.gateway = f"http://127.0.0.1:{gw.group(1)}"
                #: The coordinator, as ``stitch --coordinator`` takes it.
                self.coordinator = f"127.0.0.1:{coord.group(1)}"
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("stitch-node did not start:\n" + text)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self) -> "LocalNode":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
