"""A wheelhouse that brings Ray Serve to a GPU machine without network: the Ray wheel
repacked without ``ray/jars/`` and the few Serve dependencies that machine's image
lacks, all under the 64 MiB a device call may carry.

    python bench/repack_ray_wheel.py --out .whl            # here (pip reaches PyPI)
    # there, first thing in the command:
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \\
        --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH

``ray/jars/`` holds the Java workers' jars (cross-language actors): Python workers never
load them, and they are most of the wheel's size. ``DEPS`` are the packages of ``ray[serve]``
that the GPU image (device KINDS.md, Python 3.12) lacks and that importing Ray Serve,
starting a local cluster and serving through handles needs; the rest of the extra
(the dashboard's, haproxy, py-spy, virtualenv, cloud storage, metrics exporters) is left
out: the application runs with the dashboard and the HTTP proxy off. Wheels are
build outputs: never commit them (``.whl/`` is ignored through ``.git/info/exclude``).
"""

from __future__ import annotations

import argparse
import hashlib
import base64
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

RAY = "ray==2.60.0"
DEPS = (
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "fastapi==0.165.0",
    "starlette==1.10.0",
    "uvicorn==0.54.0",
    "opentelemetry-api==1.45.2",
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-semantic-conventions==0.66b2",
    "opentelemetry-proto==1.45.2",
    "opentelemetry-exporter-prometheus==0.66b2",
    # the image's grpcio is 1.84.0 and a reflection module generated for a newer grpcio
    # refuses to import (measured on the H200: 1.85.1 stopped `from ray import serve`)
    "grpcio-reflection==1.84.0",
)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
LIMIT = 64 * 2**20
DROP = "ray/jars/"


def download(specs: list[str], dest: Path, python: str) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", python, "--implementation", "cp", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + specs, check=True)


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(
    wheel: Path, out: Path, dropped: Callable[[str], bool] = lambda name: name.startswith(DROP)
) -> Path:
    """``wheel`` without the entries ``dropped`` names (Ray's: those under ``ray/jars/``),
    its RECORD rewritten to match (bench/repack_transformers_wheel.py trims another)."""
    target = out / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        kept = []
        for info in src.infolist():
            if dropped(info.filename) or info.filename == record_name:
                continue
            data = src.read(info)
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            kept.append(f"{info.filename},{_digest(data)},{len(data)}")
        kept.append(f"{record_name},,")
        dst.writestr(record_name, "\n".join(kept) + "\n")
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path(".whl"), help="the wheelhouse folder")
    p.add_argument("--python", default="3.12", help="the GPU machine's Python version")
    p.add_argument("--wheel", type=Path, help="a Ray wheel already downloaded")
    p.add_argument("--no-deps", action="store_true", help="only the repacked Ray wheel")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = args.wheel
        if wheel is None:
            download([RAY], Path(tmp), args.python)
            wheel = next(Path(tmp).glob("ray-*.whl"))
        before = wheel.stat().st_size
        repacked = repack(wheel, args.out)
    print(f"{wheel.name}: {before / 2**20:.1f} MiB -> {repacked.stat().st_size / 2**20:.1f} MiB without {DROP}")  # fmt: skip
    if not args.no_deps:
        download(list(DEPS), args.out, args.python)
    total = sum(f.stat().st_size for f in args.out.glob("*.whl"))
    print(f"{args.out}: {len(list(args.out.glob('*.whl')))} wheels, {total / 2**20:.1f} MiB")
    if total > LIMIT:
        print(f"over the {LIMIT // 2**20} MiB a device call carries", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
