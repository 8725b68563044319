"""The suite's processes take Ctrl-C however `make test` was started (tests/conftest.py)."""
import signal
import subprocess
import sys


def test_the_suite_and_the_processes_it_starts_take_sigint():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    child = subprocess.run([sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT))"],
                           capture_output=True, text=True, timeout=30)
    assert child.stdout.strip() == repr(signal.default_int_handler), child


def test_a_suite_started_as_a_background_job_still_takes_sigint(tmp_path):
    """A shell's background job starts with SIGINT ignored; the suite undoes that for itself."""
    r = subprocess.run(["bash", "-c", f"trap '' INT; {sys.executable} -m pytest -q -p no:cacheprovider "
                       f"{__file__}::test_the_suite_and_the_processes_it_starts_take_sigint"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path.parent)
    assert r.returncode == 0, r.stdout + r.stderr
