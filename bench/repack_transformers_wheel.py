"""transformers' wheel with only the model packages the workloads here import, for the
64 MiB a device call carries (the whole wheel is 11.4 MiB, most of it 400 models' code).

    python bench/repack_transformers_wheel.py --out .whl

``transformers.models`` finds its subpackages by listing its folder (a lazy module),
so a model left out is simply not there; the ones kept: ``KEEP``. The RECORD is rewritten
by bench/repack_ray_wheel.py's ``repack``. Wheels are build outputs: never commit them.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from repack_ray_wheel import download, repack  # noqa: E402

TRANSFORMERS = "transformers==4.57.6"
# auto: the model registries every model imports; the rest: bench/workloads' models
KEEP = ("auto", "whisper", "mimi", "qwen3_omni_moe")
_MODEL = re.compile(r"transformers/models/([^/]+)/")


def dropped(name: str) -> bool:
    m = _MODEL.match(name)
    return m is not None and m.group(1) not in KEEP


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path(".whl"), help="the wheelhouse folder")
    p.add_argument("--python", default="3.12", help="the GPU machine's Python version")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        download([TRANSFORMERS], Path(tmp), args.python)
        wheel = next(Path(tmp).glob("transformers-*.whl"))
        before = wheel.stat().st_size
        for old in args.out.glob("transformers-*.whl"):
            old.unlink()
        repacked = repack(wheel, args.out, dropped)
    print(f"{wheel.name}: {before / 2**20:.1f} MiB -> {repacked.stat().st_size / 2**20:.1f} MiB (models kept: {', '.join(KEEP)})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
