"""The ``packkit`` command line: ``packkit demo``, ``packkit analyze``, ``packkit info`` (also ``python -m packkit``)."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="packkit", description="Sequence packing for LLM training.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="plan a built-in length profile with every algorithm and print a table")
    demo.add_argument("--capacity", type=int, default=20_000, help="tokens per row (default 20000)")
    demo.add_argument("--dp-size", type=int, default=8, help="data-parallel ranks for ogbfd (default 8)")
    demo.add_argument("-o", "--out", default="packkit-demo-report",
                      help="folder for the analyze report of the profile (default ./packkit-demo-report)")
    demo.add_argument("--no-report", action="store_true", help="print the table only")
    from ..analyze.cli import add_parser as add_analyze_parser

    add_analyze_parser(sub)
    from .info import add_parser as add_info_parser

    add_info_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "info":
        from .info import run as run_info

        return run_info(args)
    if args.command == "analyze":
        from ..analyze.cli import run as run_analyze

        return run_analyze(args, sys.argv[1:] if argv is None else list(argv))
    if args.command == "demo":
        from .demo import run

        run(capacity=args.capacity, dp_size=args.dp_size, out=None if args.no_report else args.out)
    return 0

