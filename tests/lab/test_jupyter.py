"""``make lab``'s command: JupyterLab on loopback with a token, the "PeerCache Lab" kernel importing peercache.

The live test starts the very command ``make lab`` runs (``python -m peercache.lab.jupyter``) with the
kernel spec written under a temporary prefix, checks /api/status with and without the token, starts the
kernel through the server's kernels API and runs ``import peercache`` in it over the kernel's websocket,
then stops the server (SIGTERM; the process group is killed at teardown whatever happens).
"""
import asyncio
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from conftest import scaled
from peercache.lab import jupyter

ROOT = Path(__file__).resolve().parents[2]


def test_server_argv_binds_loopback_refuses_other_ports_and_keeps_the_token_out():
    argv = jupyter.server_argv(ROOT / "notebooks", port=8123, python="/venv/bin/python")
    assert argv[:3] == ["/venv/bin/python", "-m", "jupyterlab"]
    assert "--ServerApp.ip=127.0.0.1" in argv and "--ServerApp.port=8123" in argv
    assert "--ServerApp.port_retries=0" in argv and "--ServerApp.open_browser=False" in argv
    assert f"--ServerApp.root_dir={ROOT / 'notebooks'}" in argv
    assert "--MappingKernelManager.default_kernel_name=peercache-lab" in argv
    assert not any("token" in a.lower() for a in argv)
    env = jupyter.server_env("s3cret", env={}, kernel_prefix="/tmp/kp")
    assert env["JUPYTER_TOKEN"] == "s3cret" and env["JUPYTER_PATH"] == "/tmp/kp/share/jupyter"


def test_reach_says_who_can_connect():
    assert jupyter.reach("127.0.0.1", 8888).startswith("reachable only from this machine (bound to 127.0.0.1")
    assert "ssh -N -L 8888:127.0.0.1:8888" in jupyter.reach("127.0.0.1", 8888)
    wide = jupyter.reach("0.0.0.0", 8888)
    assert "every host that can route to 0.0.0.0:8888" in wide and "not loopback" in wide


def test_kernel_spec_is_this_interpreter_named_peercache_lab(tmp_path):
    d = jupyter.ensure_kernel(tmp_path)
    spec = json.loads((d / "kernel.json").read_text())
    assert d == tmp_path / "share" / "jupyter" / "kernels" / "peercache-lab"
    assert spec["display_name"] == "PeerCache Lab" and spec["argv"][0] == sys.executable
    assert jupyter.kernel_is_current(tmp_path)
    before = (d / "kernel.json").stat().st_mtime_ns
    jupyter.ensure_kernel(tmp_path)                      # quick when done: not written again
    assert (d / "kernel.json").stat().st_mtime_ns == before


def test_make_setup_registers_the_kernel_where_papermill_finds_it(tmp_path, capsys):
    # what `make setup` runs (Makefile: $(VENV)/.kernel), into a prefix of its own here
    assert "$(PY) -m peercache.lab.jupyter --register-kernel" in (ROOT / "Makefile").read_text()
    assert jupyter.main(["--register-kernel", "--kernel-prefix", str(tmp_path)]) == 0
    assert f"kernel \"PeerCache Lab\" (peercache-lab, {sys.executable})" in capsys.readouterr().out
    from jupyter_client.kernelspec import KernelSpecManager   # how papermill looks a kernel up
    ksm = KernelSpecManager(kernel_dirs=[str(tmp_path / "share" / "jupyter" / "kernels")])
    assert ksm.get_kernel_spec("peercache-lab").argv[0] == sys.executable
    assert jupyter.main(["--register-kernel", "--kernel-prefix", "/proc/no-such-prefix"]) == 2
    assert "pass a writable --kernel-prefix" in capsys.readouterr().err


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _post(url: str, doc: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(doc).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.loads(r.read())


async def _execute(ws_url: str, code: str, timeout: float) -> str:
    """Run ``code`` in a kernel over its websocket; the stream output (or the error) as text."""
    from tornado.websocket import websocket_connect

    conn = await asyncio.wait_for(websocket_connect(ws_url), timeout)
    msg_id = uuid.uuid4().hex
    conn.write_message(json.dumps({
        "header": {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex, "msg_type": "execute_request",
                   "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True}}))
    out = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            raw = await asyncio.wait_for(conn.read_message(), max(0.1, deadline - time.monotonic()))
            if raw is None:
                break
            m = json.loads(raw)
            if m.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            t = m["header"]["msg_type"]
            if t == "stream":
                out.append(m["content"]["text"])
            elif t == "error":
                out.append(f"ERROR {m['content']['ename']}: {m['content']['evalue']}")
            elif t == "status" and m["content"]["execution_state"] == "idle":
                break
    finally:
        conn.close()
    return "".join(out)


def test_make_lab_command_serves_jupyterlab_on_loopback_with_the_token(procs, port, tmp_path):
    token = uuid.uuid4().hex
    env = dict(os.environ, PEERCACHE_LAB_TOKEN=token, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_DATA_DIR=str(tmp_path / "data"))
    server = procs.start([sys.executable, "-m", "peercache.lab.jupyter", "--port", str(port),
                          "--kernel-prefix", str(tmp_path / "prefix")], env=env)
    log: list[str] = []                     # drain the server's log so its pipe never fills
    threading.Thread(target=lambda: log.extend(server.stderr), daemon=True).start()
    said = procs.wait_line(server, "reachable")
    assert f"http://127.0.0.1:{port}/lab?token={token}" in said
    assert "reachable only from this machine (bound to 127.0.0.1, loopback)" in said
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + scaled(60)
    status = None
    while time.monotonic() < deadline and server.poll() is None:
        try:
            status = _get(f"{base}/api/status?token={token}")
            break
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.3)
    assert status is not None, f"no answer on {base} within {scaled(60):.0f}s (rc={server.poll()}): {''.join(log)[-2000:]}"
    code, body = status
    assert code == 200 and "started" in json.loads(body), body
    assert _get(f"{base}/api/status")[0] == 403                      # without the token
    assert _get(f"{base}/api/status?token=wrong{token}")[0] == 403  # with another one
    specs = json.loads(_get(f"{base}/api/kernelspecs?token={token}")[1])
    assert specs["default"] == "peercache-lab"
    assert specs["kernelspecs"]["peercache-lab"]["spec"]["display_name"] == "PeerCache Lab"

    code, kernel = _post(f"{base}/api/kernels?token={token}", {"name": "peercache-lab"})
    assert code == 201 and kernel["name"] == "peercache-lab"
    ws = f"ws://127.0.0.1:{port}/api/kernels/{kernel['id']}/channels?token={token}"
    out = asyncio.run(_execute(ws, "import peercache, sys; print(peercache.__file__); print(sys.executable)",
                               scaled(60)))
    assert str(ROOT / "peercache" / "__init__.py") in out and sys.executable in out, out

    os.killpg(server.pid, signal.SIGTERM)                          # the server stops, its kernel with it
    assert server.wait(timeout=scaled(30)) is not None
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        _get(f"{base}/api/status?token={token}")
