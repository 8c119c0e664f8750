"""Instructions per request of the example's secured ``POST /api/v2/documents``, in-process, with idempotency off and
on (a new key each request): a count that does not move with the machine's load, unlike a rate or a CPU time.

Each variant runs twice under valgrind's cachegrind (Debian package ``valgrind``; not needed by ``make test``): ``N1``
and ``N2`` requests after 200 of warm-up, with the garbage collector off while they run, one key pair and
``PYTHONHASHSEED=0`` for both, so that start-up costs the same in the two runs and their difference over ``N2 - N1``
requests is what one request costs. The pipeline is ``bench.limits_micro``'s (RS256 token, Cedar policy, a local rate
limiter that never trips), with metrics on as in ``bastion run``. ``--cache`` adds cachegrind's simulated misses per
request (first-level instruction and data caches of 32 KiB, a last level of 4 MiB): the step's cost in a server is
more than its instructions say, and these show where. ``--base SRC`` adds the two variants served from another
checkout's ``src`` (``PYTHONPATH``), for before/after. Run: ``python -m bench.instructions [--cache] [--base SRC]``
(issue 32; bench/README.md "Idempotency and plans").
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WARM_UP = 200
COUNTS = {"Ir": "I   refs", "I1 misses": "I1  misses", "D1 misses": "D1  misses", "LL misses": "LL misses"}
CACHES = ["--I1=32768,8,64", "--D1=32768,8,64", "--LL=4194304,16,64"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, nargs=2, default=(100, 600), metavar=("N1", "N2"))
    parser.add_argument("--cache", action="store_true", help="add simulated cache misses per request")
    parser.add_argument("--base", help="another checkout's src directory: its two variants as well")
    parser.add_argument("--drive", nargs=3, metavar=("VARIANT", "N", "KEY"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.drive:
        variant, count, key = args.drive
        asyncio.run(_drive(variant == "on", int(count), Path(key).read_bytes()))
        return
    if shutil.which("valgrind") is None:
        sys.exit("bench.instructions needs valgrind (Debian package valgrind)")
    from bastion.testing import write_dev_keys

    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as tmp:
        private, _ = write_dev_keys(Path(tmp))
        sources = {"": None, " (base)": args.base} if args.base else {"": None}
        rows = {}
        for label, src in sources.items():
            for variant in ("off", "on"):
                low, high = (_count(variant, n, private, src, cache=args.cache) for n in args.requests)
                rows[f"idempotency {variant}{label}"] = {
                    k: (high[k] - low[k]) / (args.requests[1] - args.requests[0]) for k in low
                }
    names = list(next(iter(rows.values())))
    print("| per request | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for row, values in rows.items():
        print(f"| {row} | " + " | ".join(f"{values[name]:,.0f}" for name in names) + " |")


def _count(variant: str, requests: int, key: Path, src: str | None, *, cache: bool) -> dict[str, int]:
    """cachegrind's totals for one run of ``requests`` requests of ``variant``."""
    argv = ["valgrind", "--tool=cachegrind", "--cachegrind-out-file=/dev/null"]
    argv += ["--cache-sim=yes", *CACHES] if cache else ["--cache-sim=no"]
    argv += [sys.executable, "-m", "bench.instructions", "--drive", variant, str(requests), str(key)]
    path = os.pathsep.join(filter(None, (src, str(REPO))))
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": path}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=True)
    found = {}
    for name, label in COUNTS.items():
        match = re.search(rf"== {re.escape(label)}:\s+([\d,]+)", done.stderr)
        if match is not None:
            found[name] = int(match.group(1).replace(",", ""))
    return found


async def _drive(idempotency: bool, requests: int, private_pem: bytes) -> None:
    from bastion.testing import TokenMinter
    from bench import limits_micro

    minter = TokenMinter.from_private_pem(private_pem, "RS256")
    token = minter.mint(sub="bench", roles=["user"], ttl=3600)
    with tempfile.TemporaryDirectory() as tmp:
        app = limits_micro.secured_app(Path(tmp), minter, idempotency=idempotency, valkey_url=None, metrics=True)
        once = limits_micro.post_once(app, token, with_key=idempotency)
        for _ in range(WARM_UP):
            await once()
        gc.collect()
        gc.disable()
        for _ in range(requests):
            await once()


if __name__ == "__main__":
    main()
