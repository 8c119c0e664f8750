"""``make dist``: the sdist and wheel of each distribution (bastion-core, bastion, mailrelay) into ``dist/``.

The repository is one source tree; each distribution is built from a staging copy holding only what it ships
(``build/distributions/<name>/``: its ``pyproject.toml`` and ``README.md`` from ``distributions/<name>/``, ``LICENSE``,
``NOTICE``, ``CHANGELOG.md`` and its one package under ``src/``; bastion-core also carries the documentation as
``bastion_core/_docs/``, what ``bastion docs`` and ``mailrelay docs`` print). The staging copy makes each sdist
self-contained, and ``python -m build`` builds the wheel from that sdist, so a file the sdist misses fails here.

Run with the development environment's Python (``build`` and ``hatchling`` are dev dependencies; no network).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = {"bastion-core": "bastion_core", "bastion": "bastion", "mailrelay": "mailrelay"}
SHARED_FILES = ("LICENSE", "NOTICE", "CHANGELOG.md")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc")


def stage(name: str, package: str, into: Path) -> Path:
    """The source tree of one distribution, under ``into/name``."""
    tree = into / name
    shutil.rmtree(tree, ignore_errors=True)
    (tree / "src").mkdir(parents=True)
    for file in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / "distributions" / name / file, tree / file)
    for file in SHARED_FILES:
        shutil.copy2(ROOT / file, tree / file)
    shutil.copytree(ROOT / "src" / package, tree / "src" / package, ignore=IGNORED)
    if package == "bastion_core":
        docs = tree / "src" / package / "_docs"
        docs.mkdir()
        for page in sorted((ROOT / "docs").glob("*.md")):
            shutil.copy2(page, docs / page.name)
    return tree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outdir", default=str(ROOT / "dist"), help="where the sdists and wheels go (dist/)")
    args = parser.parse_args()
    outdir = Path(args.outdir).resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    for name, package in DISTRIBUTIONS.items():
        tree = stage(name, package, ROOT / "build" / "distributions")
        command = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(outdir), str(tree)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            sys.stderr.write(result.stdout + result.stderr)
            print(f"make dist: building {name} failed", file=sys.stderr)
            return 1
        print(f"make dist: {name}: {result.stdout.strip().splitlines()[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
