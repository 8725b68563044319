"""``make lab``: JupyterLab on ``notebooks/`` with the project's kernel, on loopback with a token.

    python -m peercache.lab.jupyter [--port 8888] [--ip 127.0.0.1] [--token T]
    python -m peercache.lab.jupyter --register-kernel   (only the kernel: what ``make setup`` runs)
    peercache-lab jupyter ...                     (the same command)

The kernel "PeerCache Lab" (``peercache-lab``) is this interpreter, registered
in the venv (``<prefix>/share/jupyter/kernels/peercache-lab``, what
``python -m ipykernel install --sys-prefix --name peercache-lab`` writes) and
written again only when it names another interpreter. The token comes from
``--token``, else ``$PEERCACHE_LAB_TOKEN``, else a fresh random one; it is
handed to the server in its environment (``JUPYTER_TOKEN``), never on its
command line where ``ps`` would show it, and printed with the address.

The command line and the "who can reach it" sentence are pure functions
(:func:`server_argv`, :func:`reach`); only :func:`main` registers the kernel
and replaces this process with the server (``exec``: nothing is left behind
when it stops).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import secrets
import socket
import sys
from pathlib import Path

from peercache.address import is_loopback, join

KERNEL_NAME = "peercache-lab"
KERNEL_DISPLAY_NAME = "PeerCache Lab"
DEFAULT_IP = "127.0.0.1"
DEFAULT_PORT = 8888
TOKEN_ENV = "PEERCACHE_LAB_TOKEN"


def repo_root() -> Path:
    """The checkout this package is installed from (editable install)."""
    return Path(__file__).resolve().parents[2]


def kernel_dir(prefix: str | Path) -> Path:
    """Where the kernel spec lives under an environment prefix."""
    return Path(prefix) / "share" / "jupyter" / "kernels" / KERNEL_NAME


def kernel_is_current(prefix: str | Path, python: str = sys.executable) -> bool:
    """True when the registered "PeerCache Lab" kernel runs ``python`` (nothing to write)."""
    spec = kernel_dir(prefix) / "kernel.json"
    try:
        doc = json.loads(spec.read_text())
    except (OSError, ValueError):
        return False
    argv = doc.get("argv") or []
    return bool(argv) and argv[0] == python and doc.get("display_name") == KERNEL_DISPLAY_NAME


def ensure_kernel(prefix: str | Path = sys.prefix) -> Path:
    """Register this interpreter as the "PeerCache Lab" kernel under ``prefix`` (once); returns its folder."""
    if not kernel_is_current(prefix):
        try:
            # optional (the lab extra): the ImportError below says how to install it
            from ipykernel.kernelspec import install
        except ImportError:
            raise RuntimeError("ipykernel is not installed in this environment; run `make setup` (it installs "
                               f"the lab extra) or `{sys.executable} -m pip install -e '.[lab]'`") from None
        install(prefix=str(prefix), kernel_name=KERNEL_NAME, display_name=KERNEL_DISPLAY_NAME)
    return kernel_dir(prefix)


def reach(ip: str, port: int) -> str:
    """Who can reach a server bound to ``ip:port`` (said when it starts)."""
    if is_loopback(ip):
        return (f"reachable only from this machine (bound to {ip}, loopback), by whoever holds the token; "
                f"from another machine, tunnel: ssh -N -L {port}:{ip}:{port} {socket.gethostname()}")
    return (f"reachable by every host that can route to {ip}:{port} and holds the token "
            f"(bound to {ip}, not loopback): anyone with the token runs code as this user; "
            f"keep the default --ip {DEFAULT_IP} unless the network is trusted")


def server_argv(notebook_dir: str | Path, *, ip: str = DEFAULT_IP, port: int = DEFAULT_PORT,
                python: str = sys.executable, allow_root: bool = False) -> list[str]:
    """The JupyterLab command line (pure; the token travels in the environment, not here)."""
    argv = [python, "-m", "jupyterlab",
            f"--ServerApp.root_dir={notebook_dir}",
            f"--ServerApp.ip={ip}",
            f"--ServerApp.port={int(port)}",
            "--ServerApp.port_retries=0",          # a busy port is an error, not a silent other port
            "--ServerApp.open_browser=False",
            f"--MappingKernelManager.default_kernel_name={KERNEL_NAME}"]
    if allow_root:
        argv.append("--ServerApp.allow_root=True")
    return argv


def server_env(token: str, env: dict[str, str] | None = None, kernel_prefix: str | Path | None = None) -> dict[str, str]:
    """The server's environment: the token, and the kernel's data folder when it is not the venv's."""
    out = dict(os.environ if env is None else env)
    out["JUPYTER_TOKEN"] = token
    if kernel_prefix is not None and Path(kernel_prefix).resolve() != Path(sys.prefix).resolve():
        data = str(Path(kernel_prefix) / "share" / "jupyter")
        out["JUPYTER_PATH"] = os.pathsep.join(p for p in (data, out.get("JUPYTER_PATH", "")) if p)
    return out


def port_free(ip: str, port: int) -> bool:
    """True when ``ip:port`` can be bound now."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
        except OSError:
            return False
    return True


def build_parser() -> argparse.ArgumentParser:
    """Options of the ``jupyter`` command."""
    p = argparse.ArgumentParser(prog="peercache-lab jupyter", description=__doc__.splitlines()[0])
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``jupyter`` options to ``p`` (shared by ``peercache-lab jupyter``)."""
    p.add_argument("--ip", default=DEFAULT_IP, help="address to bind [%(default)s: this machine only]")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to bind [%(default)s]")
    p.add_argument("--notebook-dir", default=None, help="folder JupyterLab opens [<repo>/notebooks]")
    p.add_argument("--token", default=None, help=f"access token [${TOKEN_ENV}, else a random one]")
    p.add_argument("--kernel-prefix", default=sys.prefix,
                   help="environment prefix the kernel spec is written under [this venv: %(default)s]")
    p.add_argument("--dry-run", action="store_true", help="register the kernel, print the command, start nothing")
    p.add_argument("--register-kernel", action="store_true",
                   help="register the kernel and exit (what `make setup` runs, so papermill finds it)")


def register(prefix: str | Path) -> int:
    """Register the kernel under ``prefix`` and say where (``--register-kernel``, run by ``make setup``)."""
    try:
        kdir = ensure_kernel(prefix)
    except (RuntimeError, OSError) as e:
        print(f"peercache-lab jupyter: cannot register the \"{KERNEL_DISPLAY_NAME}\" kernel under {prefix}: {e}; "
              "pass a writable --kernel-prefix or fix the environment", file=sys.stderr)
        return 2
    print(f"Jupyter kernel \"{KERNEL_DISPLAY_NAME}\" ({KERNEL_NAME}, {sys.executable}): {kdir}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Register the kernel, say where the server is and who can reach it, then become the server."""
    if args.register_kernel:
        return register(args.kernel_prefix)
    nb_dir = Path(args.notebook_dir) if args.notebook_dir else repo_root() / "notebooks"
    if not nb_dir.is_dir():
        print(f"peercache-lab jupyter: notebook folder {nb_dir} does not exist; pass --notebook-dir",
              file=sys.stderr)
        return 2
    if not 0 < args.port < 65536:
        print(f"peercache-lab jupyter: --port {args.port} is not a TCP port (1-65535)", file=sys.stderr)
        return 2
    if importlib.util.find_spec("jupyterlab") is None:
        print("peercache-lab jupyter: JupyterLab is not installed in this environment; run `make lab` "
              f"(it installs the lab extra) or `{sys.executable} -m pip install -e '.[lab]'`", file=sys.stderr)
        return 2
    try:
        kdir = ensure_kernel(args.kernel_prefix)
    except (RuntimeError, OSError) as e:
        print(f"peercache-lab jupyter: cannot register the \"{KERNEL_DISPLAY_NAME}\" kernel under "
              f"{args.kernel_prefix}: {e}; pass a writable --kernel-prefix or fix the environment", file=sys.stderr)
        return 2
    token = args.token or os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(24)
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    argv = server_argv(nb_dir, ip=args.ip, port=args.port, allow_root=root)
    print(f"JupyterLab on {nb_dir}, kernel \"{KERNEL_DISPLAY_NAME}\" ({kdir})", flush=True)
    print(f"  URL:   http://{join(args.ip, args.port)}/lab?token={token}", flush=True)
    print(f"  token: {token}", flush=True)
    print(f"  {reach(args.ip, args.port)}", flush=True)
    if root:
        print("  running as root: JupyterLab is started with --ServerApp.allow_root=True", flush=True)
    if args.dry_run:
        print("  command: " + " ".join(argv), flush=True)
        return 0
    if not port_free(args.ip, args.port):
        print(f"peercache-lab jupyter: {args.ip}:{args.port} is in use; pass another port "
              f"(make lab LAB_PORT=N, or --port N)", file=sys.stderr)
        return 2
    sys.stdout.flush()
    os.execve(argv[0], argv, server_env(token, kernel_prefix=args.kernel_prefix))
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    """Command line of ``python -m peercache.lab.jupyter``."""
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
