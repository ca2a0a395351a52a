"""`draftlab discover`'s parser: rank candidate datasets from the catalog (notebook 01)."""

from __future__ import annotations

import argparse

from draftlab.dataset_discovery.catalog import (
    RELEVANCE,
    Discovery,
    Workload,
    discover,
    enrich,
    load_catalog,
    score,
)

# -------------------------------------------------------------------------------------- CLI


def add_discover_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("discover", help="rank candidate datasets (live Hub search when reachable)")
    p.add_argument("--catalog", default=None, help="catalog YAML (default data/catalog.yaml)")
    p.add_argument("--domain", default="code", choices=sorted(RELEVANCE))
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the Hub")
    p.add_argument("--offline", action="store_true", help="do not contact the Hub")
    p.set_defaults(func=_cmd_discover)
    return p


def _cmd_discover(args: argparse.Namespace) -> int:
    catalog = load_catalog(args.catalog)
    found = (
        Discovery(False, "--offline: using the catalog snapshot") if args.offline else discover(timeout_s=args.timeout)
    )
    print(found.message)
    table = score(enrich(catalog, found), Workload(domain=args.domain))
    print(table[["hub_id", "category", "score", "license", "rows"]].to_string(index=False))
    return 0
