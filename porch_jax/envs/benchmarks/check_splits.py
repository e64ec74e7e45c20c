"""Regenerate MACA's Table 4 splits from the benchmark files and compare with (or rewrite) the recorded file.

    python -m porch_jax.envs.benchmarks.check_splits            # exit 1 if splits/maca_table4.json differs
    python -m porch_jax.envs.benchmarks.check_splits --write    # rewrite it from the data

A module of its own (not splits.py's `__main__`) because the package imports splits.py.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from porch_jax.envs.benchmarks.base import default_data_dir
from porch_jax.envs.benchmarks.splits import SPLITS_FILE, make_splits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=pathlib.Path, default=default_data_dir())
    parser.add_argument("--write", action="store_true", help="rewrite the recorded file instead of comparing")
    args = parser.parse_args(argv)
    text = json.dumps(make_splits(args.data_dir), indent=1) + "\n"
    if args.write:
        SPLITS_FILE.write_text(text, encoding="utf-8")
        return 0
    if SPLITS_FILE.read_text(encoding="utf-8") != text:
        print(f"{SPLITS_FILE} differs from the splits regenerated from {args.data_dir}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
