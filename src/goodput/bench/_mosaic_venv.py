"""Make the separate venv that ``goodput bench cache`` runs Mosaic Streaming in (benchmark only)."""

from __future__ import annotations

import os
import subprocess
import sys

# Pins that work together on a CPU-only machine: streaming 0.13 needs numpy<2.2; torch and torchvision pinned
# together (otherwise pip pulls a CUDA torch).
_PINS = ["mosaicml-streaming==0.13.0", "torch==2.13.0", "torchvision==0.28.0", "numpy<2.2"]

# streaming imports a few torchvision names for its vision datasets, which the benchmark never uses; the PyPI
# torchvision binary fails to import without CUDA libraries, so it is replaced by these stubs.
_STANDIN = {
    "__init__.py": '"""torchvision stand-in for the goodput Mosaic benchmark venv (CPU-only)."""\n__version__ = "0.28.0"\n',
    "datasets/__init__.py": (
        "class VisionDataset:\n"
        "    def __init__(self, *args, **kwargs):\n"
        '        raise RuntimeError("torchvision stand-in: vision datasets are unavailable here")\n\n\n'
        "class CIFAR10(VisionDataset):\n    pass\n"
    ),
    "transforms/__init__.py": "",
    "transforms/functional.py": (
        'def to_tensor(pic):\n    raise RuntimeError("torchvision stand-in: transforms are unavailable here")\n'
    ),
}


def make_mosaic_venv(path: str) -> None:
    """Create ``path`` as a venv with Mosaic Streaming and the torchvision stand-in (about 2.5 min)."""
    subprocess.run([sys.executable, "-m", "venv", path], check=True)
    python = os.path.join(path, "bin", "python")
    subprocess.run([python, "-m", "pip", "install", "-q", *_PINS], check=True)
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", "torchvision"], check=True)
    for name, text in _STANDIN.items():
        target = os.path.join(purelib, "torchvision", name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w") as f:
            f.write(text)
    subprocess.run([python, "-c", "import streaming"], check=True)
    print(f"Mosaic Streaming venv ready: {python}")
