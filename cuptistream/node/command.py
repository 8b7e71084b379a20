"""``cuptistream node install | uninstall | status``: the start hook in a Python environment."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from cuptistream.errors import UserError
from cuptistream.node import health, hook, interpreter, runtime


def add_command(commands: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Register ``node`` on the CLI's subcommands; returns its handler by name."""
    node = commands.add_parser(
        "node",
        help="install the start hook that probes every Python process of an environment on this node",
        description="Put a start hook into a Python environment: when the node config "
        f"({health.node_config_path() or 'unset'}) names a running collector, every process of the "
        "environment that initializes CUDA is probed into it, without wrapping its command.",
    )
    actions = node.add_subparsers(dest="node_command", metavar="ACTION", parser_class=commands._parser_class)
    for name, text in (
        ("install", "add the hook to an environment and prepare the probe for its interpreter"),
        ("uninstall", "remove what install added"),
        ("status", "what is installed where; whether a collector is configured and reachable"),
    ):
        action = actions.add_parser(name, help=text, description=text)
        action.add_argument(
            "--python", metavar="PATH", help="the environment's interpreter (e.g. VENV/bin/python)"
        )
        action.add_argument("--site-packages", metavar="DIR", help="the environment's site-packages folder")
        action.add_argument(
            "--root", type=Path, default=runtime.DEFAULT_ROOT,
            help=f"where the probe runtimes live (default {runtime.DEFAULT_ROOT})",
        )  # fmt: skip
        if name == "install":
            action.add_argument(
                "--wheelhouse", type=Path, metavar="DIR",
                help="install the probe's packages from these wheels only (default: this environment's, "
                "or the package index for another Python version)",
            )  # fmt: skip
    actions.required = True
    return {"node": _dispatch}


def _dispatch(args: argparse.Namespace) -> int:
    handler: Callable[[argparse.Namespace], int] = {
        "install": install, "uninstall": uninstall, "status": status,
    }[args.node_command]  # fmt: skip
    return handler(args)


def install(args: argparse.Namespace) -> int:
    target, site_packages = interpreter.resolve(args.python, args.site_packages, command="install")
    interpreter.require_supported(target, "install")
    if args.wheelhouse is not None and not args.wheelhouse.is_dir():
        raise UserError(
            f"node install: --wheelhouse {args.wheelhouse} is not a folder; pass a folder of wheels"
        )
    if not site_packages.is_dir():
        raise UserError(f"node install: {site_packages} does not exist; create the environment first")
    if not os.access(site_packages, os.W_OK):
        raise UserError(f"node install: {site_packages} is not writable; run as a user who may write it "
                        f"(the environment's owner, or root)")  # fmt: skip
    hook.read(site_packages)  # a foreign file of our name stops us here
    root = args.root.resolve()
    text = hook.hook_text(runtime.hook_dir(root), runtime.runtime_dir(root, target))  # checks the paths
    folder = runtime.prepare(root, target, interpreter.this_interpreter(), args.wheelhouse)
    path = hook.write(site_packages, text)
    runtime.add_user(root, site_packages, folder)
    print(f"installed {path} for {target.name}; probe runtime {folder}")
    _print_node(health.check())
    return 0


def uninstall(args: argparse.Namespace) -> int:
    _, site_packages = interpreter.resolve(args.python, args.site_packages, command="uninstall")
    installed = hook.read(site_packages)
    if installed is None:
        print(f"no cuptistream node hook in {site_packages}; nothing to remove")
        return 0
    hook.remove(installed)
    root = Path(installed.runtime).parent.parent
    removed = runtime.release(root, site_packages, installed.runtime)
    print(f"removed {installed.path}" + "".join(f"; removed {path}" for path in removed))
    return 0


def status(args: argparse.Namespace) -> int:
    problems = 0
    if args.python is not None or args.site_packages is not None:
        target, site_packages = interpreter.resolve(args.python, args.site_packages, command="status")
        installed = hook.read(site_packages)
        if installed is None:
            print(f"hook: none in {site_packages} ({target.name})")
        else:
            present = Path(installed.runtime).is_dir()
            problems += not present
            state = "present" if present else "MISSING: run `cuptistream node install` again"
            print(f"hook: {installed.path} ({target.name}); probe runtime {installed.runtime} ({state})")
    else:
        users = runtime.users(args.root.resolve())
        for site_packages_dir, folder in sorted(users.items()):
            print(f"hook: {site_packages_dir}/{hook.HOOK_FILE}; probe runtime {folder}")
        if not users:
            print(f"hook: none installed from {args.root} (pass --python PATH to look at one environment)")
    node = health.check()
    _print_node(node)
    return 1 if problems or node.problems else 0


def _print_node(node: health.NodeHealth) -> None:
    if not node.path:
        print("node config: $CUPTISTREAM_NODE_CONFIG is empty: hooked processes stay untouched")
    elif not node.configured:
        print(f"node config: {node.path} does not exist: hooked processes stay untouched")
    elif not node.values:
        print(f"node config: {node.path} is invalid: hooked processes print one line and run untouched")
    else:
        values = node.values
        print(f"node config: {node.path}: collector {values['collector']}, config {values['config']}, "
              f"probes start at {values['start']}")  # fmt: skip
        state = "reachable" if node.reachable else "not reachable: no probe starts (start the collector)"
        print(f"collector: {values['collector']} {state}")
    for problem in node.problems:
        print(f"problem: {problem}")
