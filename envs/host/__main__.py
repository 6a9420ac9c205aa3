"""python -m envab.envs.host --mode fork|restore --port P --token-file F
[--sandbox gvisor|process|namespaces|runc|qemu] [--world pillow|xdesktop] [--allow-faults]"""

from __future__ import annotations

import argparse
import logging
import socket
import sys

import uvicorn

from envab.envs.arm_schema import MODES, SANDBOXES, WORLDS
from envab.envs.host.app import build_app
from envab.envs.host.embedded import host_token
from envab.envs.host.pool import HostConfig


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m envab.envs.host",
        description="env-ab embedded environment host (Drums protocol)",
    )
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--token-file", required=True, help="file holding the bearer token")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", type=int, help="TCP port to listen on")
    where.add_argument("--fd", type=int, help="an already bound, listening socket (embedded use)")
    p.add_argument("--bind", default="127.0.0.1", help="address to bind (default: loopback)")
    p.add_argument(
        "--allow-faults",
        action="store_true",
        help="accept fault-injection switches in create requests (tests only)",
    )
    p.add_argument("--step-timeout", type=float, default=10.0, help="seconds per step")
    p.add_argument("--create-timeout", type=float, default=60.0, help="seconds per create/fork")
    p.add_argument("--max-envs", type=int, default=512)
    p.add_argument("--access-log", action="store_true", help="log every request line")
    p.add_argument("--tasks", help="a tasks.jsonl to serve by id (create with a task_id)")
    p.add_argument(
        "--sandbox",
        choices=SANDBOXES,
        default="gvisor",
        help="where each environment runs: a gVisor sandbox forked by checkpoint and restore "
        "(default; needs Debian's runsc, as root), a plain process forked with os.fork, the "
        "same fork inside a sandbox of Linux namespaces and a seccomp filter (the Pillow "
        "desktop; needs Debian's bubblewrap, as root), a fresh OCI container under runc (the "
        "Pillow desktop, restore mode; as root), or (the X desktop, restore mode) a QEMU VM "
        "reset by loadvm of a warm snapshot",
    )
    p.add_argument("--sandbox-dir", help="checkpoint images and runsc state (default: a temp dir)")
    p.add_argument(
        "--world",
        choices=WORLDS,
        default="pillow",
        help="the desktop: the Pillow desktop (default) or the real X desktop (gvisor or qemu)",
    )
    p.add_argument("--rootfs", help="the X desktop's root (python -m envab.envs.xdesktop.image)")
    p.add_argument(
        "--image",
        choices=("base", "full"),
        default="base",
        help="the X desktop image a QEMU VM boots (envs/xdesktop/apps.py); a gVisor sandbox's "
        "is --rootfs",
    )
    p.add_argument(
        "--files",
        help="the frozen task set's files.json: the files its tasks download are delivered from "
        "the store beside it (envs/tasks/staging.py), never fetched",
    )
    # Stand-ins for the desktop and checker (import specs), so other backends can reuse the host.
    p.add_argument("--desktop", default=HostConfig.desktop, help=argparse.SUPPRESS)
    p.add_argument("--checker", default=HostConfig.checker, help=argparse.SUPPRESS)
    p.add_argument("--screen-of", default=HostConfig.screen_of, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = HostConfig(
        mode=args.mode,
        allow_faults=args.allow_faults,
        step_timeout_s=args.step_timeout,
        create_timeout_s=args.create_timeout,
        max_envs=args.max_envs,
        desktop=args.desktop,
        checker=args.checker,
        screen_of=args.screen_of,
        tasks=args.tasks,
        sandbox=args.sandbox,
        sandbox_dir=args.sandbox_dir,
        world=args.world,
        rootfs=args.rootfs,
        files=args.files,
        image=args.image,
    )
    app = build_app(config, host_token(args.token_file))
    if args.allow_faults:
        logging.getLogger("envab.envs.host").warning("fault injection is ON")
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.bind,
            port=args.port or 0,
            log_level="info",
            access_log=args.access_log,
            timeout_graceful_shutdown=5,
            timeout_keep_alive=120,  # a policy may think a while
        )
    )
    if args.fd is None:
        server.run()
    else:
        # uvicorn's own --fd takes every socket for AF_UNIX, so asyncio would leave Nagle on
        # and each response would wait ~40 ms for a delayed ACK; hand it the real TCP socket.
        server.run(sockets=[socket.socket(fileno=args.fd)])


if __name__ == "__main__":
    main()
