"""What the Python tests share: a real stitch-node (the package's
:class:`LocalNode`) and ``stitch init-model``. Used by the client's tests and
the PyTorch example's."""

from __future__ import annotations

import os
import subprocess

# The build tree's binaries unless told otherwise.
os.environ.setdefault(
    "STITCH_BIN_DIR",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "build", "bin"),
)

from stitch_client.local_node import LocalNode as Node
from stitch_client.local_node import find_binary

BIN = find_binary("stitch-node").rsplit("/", 1)[0]

__all__ = ["BIN", "Node", "init_model"]


def init_model(out: str, seed: int, preset: str = "tiny") -> None:
    """`stitch init-model`: the built-in model as a Hugging Face directory."""
    subprocess.run(
        [find_binary("stitch"), "init-model", "--preset", preset, "--seed", str(seed), "--out", out],
        check=True,
        stdout=subprocess.DEVNULL,
    )
