"""`diloco-chaos toxiproxy`: a Toxiproxy server in the foreground, for poking at by hand."""
from __future__ import annotations

import time

from diloco_chaos.harness.backends.toxiproxy_server import ToxiproxyServer


def register(sub, help_: str) -> None:
    p = sub.add_parser("toxiproxy", help=help_, description=__doc__)
    p.add_argument("--port", type=int, default=None, help="API port (default: a free one)")
    p.add_argument("--seed", type=int, default=None, help="seed for toxic randomness")
    p.set_defaults(func=main)


def main(args) -> int:
    with ToxiproxyServer(port=args.port, seed=args.seed) as server:
        print(f"toxiproxy {server.version()} on {server.url} (pid {server.pid}); Ctrl-C stops it", flush=True)
        while server.proc.poll() is None:
            time.sleep(0.5)
    return 0
