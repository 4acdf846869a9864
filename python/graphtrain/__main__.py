"""``python -m graphtrain options [--markdown]``: the runtime options table."""

from __future__ import annotations

import argparse
import sys

import graphtrain


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graphtrain", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    opt = sub.add_parser("options", help="print the runtime options and where each value came from")
    opt.add_argument(
        "--markdown", action="store_true", help="print the README's table of options instead"
    )
    args = parser.parse_args(argv)
    if args.command == "options":
        opts = graphtrain.options()
        print(opts.markdown() if args.markdown else opts.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
