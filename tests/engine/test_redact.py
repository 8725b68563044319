"""No secret in any document written.

Before, ``serve --out`` and ``drive --out`` wrote the Redis password in clear
in ``meta.command``; log lines already masked it. One function,
``peercache.redact.redact``, now masks secrets in log lines, messages, the
bench's result documents, the lab's raw folders and its tidy tables.
"""
from __future__ import annotations

import json
import sys

import pytest

from conftest import BENCH, free_port, scaled
from peercache.bench import dirbench, meta
from peercache.bench.serve import READY_LINE
from peercache.directory.redis.url import parse_url

PASSWORD = "Hunter2-sekrit-pw"


def test_one_function_masks_urls_variables_flags_and_known_secrets(monkeypatch):
    from peercache import redact as R
    assert R.redact(f"--directory redis://:{PASSWORD}@h:1/0 --x") == "--directory redis://:***@h:1/0 --x"
    assert R.redact(f"rediss://alice:{PASSWORD}@h:1/0?prefix=a") == "rediss://alice:***@h:1/0?prefix=a"
    assert R.redact("redis://tok@h:1/0") == "redis://***@h:1/0"
    assert R.redact("redis://h:1/0") == "redis://h:1/0"
    assert R.redact("redis://u:p/w@rd@h:1/0") == "redis://u:***@h:1/0"      # '/' and '@' unescaped
    # Sentinel URLs: one rule, whatever the number of sentinels; rediss+sentinel:// is refused, but masked
    assert R.redact(f"x redis+sentinel://:{PASSWORD}@h:1,h:2/m/0 y") == "x redis+sentinel://:***@h:1,h:2/m/0 y"
    assert R.redact(f"REDIS+SENTINEL://u:{PASSWORD}@h:1/m") == "REDIS+SENTINEL://u:***@h:1/m"
    assert R.redact("rediss+sentinel://:p@ss@h:1/m") == "rediss+sentinel://:***@h:1/m"
    assert R.redact("redis+sentinel://h:1,h:2/m/0") == "redis+sentinel://h:1,h:2/m/0"
    assert R.redact("env PEERCACHE_AUTH_KEY=abc PEERCACHE_REDIS_PASSWORD=x cmd") == \
        "env PEERCACHE_AUTH_KEY=*** PEERCACHE_REDIS_PASSWORD=*** cmd"
    assert R.redact("redis-server --requirepass foo --port 1") == "redis-server --requirepass *** --port 1"
    assert R.redact_argv(["redis-cli", "-a", "pw", "ping"]) == ["redis-cli", "-a", "***", "ping"]
    assert R.redact_argv(["ls", "-a", "dir"]) == ["ls", "-a", "dir"]
    monkeypatch.setenv("PEERCACHE_AUTH_KEY", "a secret from the environment 1")
    assert R.redact("it was a secret from the environment 1!") == "it was ***!"
    R.remember("remembered secret value 42")
    assert R.redact("x remembered secret value 42 y") == "x *** y"
    doc = R.redact_doc({"auth_key": "zzz", "password": "pw", "token": None, "nested": [{"cmd": "redis://:p@h/0"}],
                        "n": 3, "t": (1, "redis://:p@h/0")})
    assert doc == {"auth_key": "***", "password": "***", "token": None, "nested": [{"cmd": "redis://:***@h/0"}],
                   "n": 3, "t": (1, "redis://:***@h/0")}


def test_the_redaction_of_messages_and_of_documents_is_the_same_function():
    from peercache import redact as R
    assert dirbench.redact is R.redact
    u = parse_url(f"redis://:{PASSWORD}@127.0.0.1:6379/0")
    assert u.safe == R.redact(u.safe) == "redis://:***@127.0.0.1:6379/0"
    assert PASSWORD not in repr(u)
    u = parse_url(f"redis+sentinel://:{PASSWORD}@127.0.0.1:26379,127.0.0.1:26380/m/0")
    assert u.safe == R.redact(u.safe) == "redis+sentinel://:***@127.0.0.1:26379,127.0.0.1:26380/m/0"
    assert PASSWORD not in repr(u)


def test_meta_command_and_written_documents_hold_no_password(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["peercache-bench", "drive", "--directory", f"redis://:{PASSWORD}@h:1/0"])
    assert PASSWORD not in meta.command_line() and "redis://:***@h:1/0" in meta.command_line()
    out = tmp_path / "d.json"
    meta.write_document(str(out), {"meta": {"command": f"x --directory redis://u:{PASSWORD}@h/0"},
                                   "extra": {"auth_key": "k" * 32}})
    text = out.read_text()
    assert PASSWORD not in text and "k" * 32 not in text and json.loads(text)["meta"]["command"].endswith("u:***@h/0")


def test_serve_and_drive_out_hold_no_redis_password(procs, tmp_path, monkeypatch):
    """The probe's finding: both documents had ``--directory redis://:PASSWORD@...`` in meta.command."""
    monkeypatch.delenv("PEERCACHE_REDIS_PASSWORD", raising=False)
    rport, dport = free_port(), free_port()
    srv = procs.start(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                       "--appendonly", "no", "--requirepass", PASSWORD, "--dir", str(tmp_path)])
    procs.wait_line(srv, "Ready to accept connections")
    url = f"redis://:{PASSWORD}@127.0.0.1:{rport}/0"
    small = ["--directory", url, "--discovery-addr", f"127.0.0.1:{dport}", "--working-set", "16",
             "--page-size", "4096"]
    serve_out, drive_out = tmp_path / "serve.json", tmp_path / "drive.json"
    serve = procs.start([*BENCH, "serve", *small, "--readers", "1", "--max-wait", "120", "--out", str(serve_out)])
    procs.wait_line(serve, READY_LINE)
    import subprocess
    r = subprocess.run([*BENCH, "drive", *small, "--batch-size", "4", "--duration", "0.5", "--warmup", "0.1",
                        "--ready-timeout", "30", "--out", str(drive_out)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert serve.wait(timeout=scaled(30)) == 0
    for out in (serve_out, drive_out):
        text = out.read_text()
        assert PASSWORD not in text, out
        assert f"redis://:***@127.0.0.1:{rport}/0" in json.loads(text)["meta"]["command"], out
    assert PASSWORD not in r.stdout + r.stderr


def _run_meta(command: str):
    from peercache.lab import tidy
    return tidy.RunMeta(run_id="r1", testbed="t", experiment="t", scenario="s", point="p", repetition=0,
                        hosts={}, commands={"server": ["peercache-bench", "serve", "--directory", command],
                                            "client": f"peercache-bench drive --directory {command}"},
                        start="2025-01-01T00:00:00Z", end="2025-01-01T00:00:01Z", git_revision=None,
                        params={"note": f"directory {command}"})


def test_lab_raw_folders_and_tidy_tables_hold_no_secret(tmp_path):
    from peercache.lab import tidy
    from peercache.lab.analysis import collect
    url = f"redis://:{PASSWORD}@10.0.0.1:6379/0"
    raw = tmp_path / "raw" / "s" / "p" / "rep0"
    raw.mkdir(parents=True)
    (raw / "server.log").write_text(f"starting with {url}\nPEERCACHE_AUTH_KEY=abcdefgh12345678 ok\n")
    (raw / "drive.json").write_text(json.dumps({"meta": {"command": f"drive --directory {url}"},
                                                "cfg": {"auth_key": "k" * 40}}))
    (raw / "blob.bin").write_bytes(b"\xff\xfe" + url.encode())      # not text: left alone
    changed = tidy.redact_folder(raw)
    assert sorted(p.name for p in changed) == ["drive.json", "server.log"]
    for name in ("server.log", "drive.json"):
        text = (raw / name).read_text()
        assert PASSWORD not in text and "abcdefgh12345678" not in text and "k" * 40 not in text, name
    tidy.write_result(raw / tidy.RESULT_FILE, _run_meta(url), [])
    assert PASSWORD not in (raw / tidy.RESULT_FILE).read_text()
    # tidy tables, even from a raw file written before the fix
    runs = collect.runs_frame([_run_meta(url)])
    row = tidy.Row(experiment="t", scenario="s", run_id="r1", repetition=0, tool="peercache-bench", side="client",
                   host="h", metric="m", value=None, unit="s", status="failed", reason=f"could not reach {url}")
    rows = collect.rows_frame([row])
    assert PASSWORD not in runs.to_csv() + rows.to_csv()
    assert "redis://:***@10.0.0.1:6379/0" in runs.to_csv()


@pytest.mark.parametrize("text", ["plain redis://h:1/0 text", "no secrets at all", ""])
def test_text_without_secrets_is_unchanged(text):
    from peercache import redact as R
    assert R.redact(text) == text
