"""``python -m bench model [--examples N] [--sql-examples N] [BACKEND ...]``: the model
test (tests/test_store_model.py: every store against the memory store's decisions) as a
long campaign. CI runs it with few examples per backend (the defaults there); this runs
the same test with as many as asked, on the backends named (default: all)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

TEST = Path(__file__).resolve().parent.parent / "tests" / "test_store_model.py"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench model", description=__doc__)
    parser.add_argument("--examples", type=int, default=1000,
                        help="examples per Redis backend (default 1,000)")
    parser.add_argument("--sql-examples", type=int, default=200,
                        help="examples per SQL backend (default 200)")
    parser.add_argument("backends", nargs="*",
                        help="backends to run (redis, redis-subgroups, redis-scope, sqlite, "
                        "postgresql, mariadb, sqlite-scope...; default: every one)")
    args = parser.parse_args(argv)
    for name, value in (("--examples", args.examples), ("--sql-examples", args.sql_examples)):
        if value < 1:
            parser.error(f"{name} must be a positive number of examples, got {value}")
    env = dict(os.environ, FAIR_MODEL_EXAMPLES=str(args.examples),
               FAIR_MODEL_EXAMPLES_SQL=str(args.sql_examples))
    command = [sys.executable, "-m", "pytest", "-p", "no:hypothesispytest", str(TEST)]
    if args.backends:
        command += ["-k", " or ".join(f"[{b}]" for b in args.backends)]
    return subprocess.run(command, env=env, check=False).returncode
