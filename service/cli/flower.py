"""``flowbeat flower``: Flower on the project's Celery app, behind authentication.

The credentials reach Flower through its environment, never its argv, so ``ps`` does not
show them. ``FLOWER_UNAUTHENTICATED_API`` is removed from that environment: without
credentials, only a loopback address and ``--unauthenticated`` start it, and its API then
still refuses every call.
"""

import ipaddress
import os
import sys
from typing import Annotated

import typer

from service.cli.app import cli, console, load_settings
from service.platform.errors import FlowerAuthRequired

LOOPBACK_NAMES = frozenset({"localhost"})


def is_loopback(address: str) -> bool:
    if address in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def flower_env(environ: dict[str, str], basic_auth: str | None) -> dict[str, str]:
    """Flower's environment: our credentials or none, and never the unauthenticated API."""
    env = {
        key: value
        for key, value in environ.items()
        if key not in {"FLOWER_BASIC_AUTH", "FLOWER_UNAUTHENTICATED_API", "FLOWER_AUTH"}
    }
    if basic_auth is not None:
        env["FLOWER_BASIC_AUTH"] = basic_auth
    return env


@cli.command()
def flower(
    address: Annotated[str, typer.Option(help="the address to listen on")] = "127.0.0.1",
    port: int = 5555,
    url_prefix: Annotated[str, typer.Option(help="when served under a path")] = "",
    unauthenticated: Annotated[
        bool, typer.Option("--unauthenticated", help="no login; loopback addresses only")
    ] = False,
) -> None:
    """Flower for the workers and their tasks, with basic auth (FLOWBEAT_FLOWER_BASIC_AUTH)."""
    settings = load_settings()
    secret = settings.flower_basic_auth
    if secret is None and not (unauthenticated and is_loopback(address)):
        raise FlowerAuthRequired(
            "set FLOWBEAT_FLOWER_BASIC_AUTH=user:password, or give --unauthenticated "
            "with a loopback --address",
            {"address": address},
        )
    basic_auth = secret.get_secret_value() if secret is not None else None
    argv = [sys.executable, "-m", "celery", "-A", "tasks.app", "flower"]
    argv += [f"--address={address}", f"--port={port}"]
    if url_prefix:
        argv.append(f"--url-prefix={url_prefix}")
    login = "basic auth" if basic_auth else "no login (loopback only)"
    console.print(f"Flower on http://{address}:{port}/{url_prefix}, {login}", highlight=False)
    os.execve(sys.executable, argv, flower_env(dict(os.environ), basic_auth))
