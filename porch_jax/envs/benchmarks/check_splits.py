"""Regenerate MACA's Table 4 splits from the benchmark files, and their CPU-sized subsets from the splits, and compare
with (or rewrite) the recorded files.

    python -m porch_jax.envs.benchmarks.check_splits            # exit 1 if splits/maca_table4.json or
                                                                # splits/maca_cpu_subsets.json differs
    python -m porch_jax.envs.benchmarks.check_splits --write    # rewrite both from the data

A module of its own (not splits.py's `__main__`) because the package imports splits.py.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from porch_jax.envs.benchmarks.base import default_data_dir
from porch_jax.envs.benchmarks.splits import SPLITS_FILE, SUBSETS_FILE, make_splits, make_subsets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=pathlib.Path, default=default_data_dir())
    parser.add_argument("--write", action="store_true", help="rewrite the recorded file instead of comparing")
    args = parser.parse_args(argv)
    splits = make_splits(args.data_dir)
    files = {
        SPLITS_FILE: json.dumps(splits, indent=1) + "\n",
        SUBSETS_FILE: json.dumps(make_subsets(splits["benchmarks"]), indent=1) + "\n",
    }
    if args.write:
        for path, text in files.items():
            path.write_text(text, encoding="utf-8")
        return 0
    differ = [path for path, text in files.items() if not path.exists() or path.read_text(encoding="utf-8") != text]
    for path in differ:
        print(f"{path} differs from what {args.data_dir} regenerates", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
