"""`npurun config show [--json]`: every configuration value and the layer it came from."""
from __future__ import annotations

import json


def add_parser(sub):
    p = sub.add_parser("config", help="show the layered configuration and where each value came from")
    p.add_argument("action", choices=["show"])
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                   help="override a value, as any command's --set does (repeatable)")
    p.set_defaults(fn=run)


def run(args) -> int:
    from .. import config
    cfg = config.load(config.parse_set(args.set))
    if args.json:
        print(json.dumps(cfg.as_dict(), indent=2))
        return 0
    section = None
    width = max(len(f"{k} = {_toml(v)}") for _, k, v, _ in cfg.items())
    for s, k, v, src in cfg.items():
        if s != section:
            print(("\n" if section else "") + f"[{s}]")
            section = s
        print(f"{k} = {_toml(v)}".ljust(width) + f"   # {src}")
    return 0


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    return str(v)
