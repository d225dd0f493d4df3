"""Job environments: the Python a facility's jobs run in.

A facility's framework module (its profile's `setup` lines name it, e.g. a `frameworks` module) has
torch but not mmm-orch, and its compute nodes run the job's `python3`. So each machine gets a
virtual environment on its shared filesystem, created on top of the profile's setup lines with
`--system-site-packages` (the facility's torch, oneCCL/NCCL builds stay in use), holding this very
mmm-orch version, installed from a wheel built here from the running package and uploaded (no
package index needed on the login node). Job scripts activate it after the setup lines.

`mmm-orch env create` makes or updates it and remembers it per machine in the user's
configuration (~/.config/mmm-orch/environments.json); `env check` reports what a job would run; `submit` checks,
once per environment and version (cached), that the job's interpreter imports mmm_orch.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

from mmm_orch.version import __version__

REPORT = "MMM_ORCH_ENV_REPORT "  # marks the line the report script prints
STEP = "MMM_ORCH_STEP "  # marks each step the create script says it did
# Run by the job's python after the setup lines and the activation: what a job would see.
_REPORT_PY = (
    "import json, sys\n"
    "info = {'python': sys.executable, 'prefix': sys.prefix, 'mmm_orch': None, 'torch': None,\n"
    "        'device': 'cpu', 'error': ''}\n"
    "try:\n"
    "    import mmm_orch; info['mmm_orch'] = mmm_orch.__version__\n"
    "except Exception as exc:\n"
    "    info['error'] = f'{type(exc).__name__}: {exc}'\n"
    "if not __import__('os').environ.get('MMM_ORCH_CHECK_QUICK'):\n"
    "    try:\n"
    "        import torch; info['torch'] = torch.__version__\n"
    "        for kind in ('cuda', 'xpu'):\n"
    "            api = getattr(torch, kind, None)\n"
    "            if api is not None and api.is_available():\n"
    "                info['device'] = f'{kind} x{api.device_count()}'; break\n"
    "    except Exception as exc:\n"
    "        info['torch_error'] = f'{type(exc).__name__}: {exc}'\n"
    f"print({REPORT!r} + json.dumps(info))\n"
)


def config_file() -> Path:
    home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(home) / "mmm-orch" / "environments.json"


def _remembered_all() -> dict[str, Any]:
    try:
        data = json.loads(config_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remembered(machine: str) -> dict[str, Any] | None:
    """What `env create` recorded for `machine` (path, host, version), or None."""
    entry = _remembered_all().get(machine)
    return entry if isinstance(entry, dict) and entry.get("path") else None


def built_on(machine: str, stacks: list[str]) -> str | None:
    """The stack of `stacks` the remembered environment of `machine` was made on; None where it
    was made before environments recorded theirs, or on a stack the profile no longer has."""
    stack = (remembered(machine) or {}).get("stack")
    return stack if stack in stacks else None


def remember(machine: str, entry: dict[str, Any]) -> None:
    data = {**_remembered_all(), machine: entry}
    path = config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


# -- the wheel ----------------------------------------------------------------------------------


def package_files() -> list[tuple[str, bytes]]:
    """(archive name, bytes) of every file of the running mmm_orch package, symlinked data
    directories (machines, workloads, templates) followed, caches left out."""
    root = Path(__file__).resolve().parent.parent  # mmm_orch/, from mmm_orch/hosts/
    files = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = Path(dirpath) / name
            files.append((f"mmm_orch/{path.relative_to(root).as_posix()}", path.read_bytes()))
    return files


def build_wheel() -> tuple[str, bytes]:
    """(file name, bytes) of a pure-Python wheel of this mmm-orch, the same bytes for the same
    files. Installed with --no-deps: a job needs only the standard library, torch and numpy,
    which the facility's module provides."""
    import zipfile  # ~3 ms (with shutil and lzma) that every plan would pay: only `env create`

    dist = f"mmm_orch-{__version__}.dist-info"
    files = package_files()
    files.append(
        (
            f"{dist}/METADATA",
            f"Metadata-Version: 2.1\nName: mmm-orch\nVersion: {__version__}\n"
            "Summary: job-side part of mmm-orch (trainers, runtime, watchdog)\n".encode(),
        )
    )
    files.append(
        (
            f"{dist}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: mmm-orch\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
    )
    record = (
        "".join(
            f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
            f"{len(data)}\n"
            for name, data in files
        )
        + f"{dist}/RECORD,,\n"
    )
    files.append((f"{dist}/RECORD", record.encode()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files:
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    return f"mmm_orch-{__version__}-py3-none-any.whl", buffer.getvalue()


def wheel_digest() -> str:
    """Identifies this exact mmm-orch (version and files), for the submit-time check's cache."""
    digest = hashlib.sha256(__version__.encode())
    for name, data in package_files():
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()[:16]


# -- scripts run on the login node ---------------------------------------------------------------


def _setup(lines: tuple[str, ...] | list[str]) -> str:
    return "\n".join(lines)


def create_script(setup: list[str] | tuple[str, ...], path_word: str, wheel: str) -> str:
    """bash that makes (or updates) the environment at `path_word` (a shell word) on top of the
    setup lines, installs `wheel`, and prints the report. Every step says what it did. A
    failure removes the directories it made (a read-only or full file system leaves nothing)."""
    return f"""set -e
{_setup(setup)}
env_dir={path_word}
base=$(command -v python3) || {{ echo "no python3 after the setup lines" >&2; exit 3; }}
# The outermost directory this run makes (none where the environment's directory is there).
made=""
if [ ! -e "$env_dir" ] && [ ! -L "$env_dir" ]; then
    made=$env_dir
    while parent=$(dirname -- "$made") && [ ! -e "$parent" ] && [ ! -L "$parent" ]; do
        made=$parent
    done
fi
trap 'rc=$?; if [ "$rc" -ne 0 ] && [ -n "$made" ]; then rm -rf -- "$made"; fi' EXIT
if [ -x "$env_dir/bin/python" ]; then
    echo "MMM_ORCH_STEP kept the virtual environment $env_dir"
else
    mkdir -p -- "$(dirname -- "$env_dir")"
    python3 -m venv --system-site-packages -- "$env_dir"
    echo "MMM_ORCH_STEP created $env_dir on top of $base"
fi
# A base that is itself a virtual environment: its packages are not the system's, so they are
# added by path (venv's --system-site-packages reaches only the base installation).
base_site=$(python3 -c 'import site, sys; print(":".join(site.getsitepackages()) if sys.prefix != sys.base_prefix else "")')
env_site=$("$env_dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ -n "$base_site" ]; then
    python3 -c 'import sys; open(sys.argv[2], "w").write("".join("import site; site.addsitedir(%r)\\n" % p for p in sys.argv[1].split(":")))' "$base_site" "$env_site/_mmm_orch_base.pth"
    echo "MMM_ORCH_STEP linked the packages of $base_site"
fi
have=$("$env_dir/bin/python" -c 'import mmm_orch; print(mmm_orch.__version__)' 2>/dev/null || true)
"$env_dir/bin/python" -m pip install --quiet --no-index --no-deps --force-reinstall --disable-pip-version-check {shlex.quote(wheel)}
echo "MMM_ORCH_STEP installed mmm-orch {__version__}${{have:+ (was $have)}}"
"$env_dir/bin/python" - <<'MMM_ORCH_PY'
{_REPORT_PY}MMM_ORCH_PY
"""


def check_script(
    setup: list[str] | tuple[str, ...], activate: str, python: str, quick: bool = False
) -> str:
    """bash that does what a job does before its launch (setup lines, activation) and reports
    what its python then is."""
    # An environment that is not there is said as such (the python after a failed activation
    # would be whatever the setup lines put on PATH, never the job's).
    absent = shlex.quote(REPORT + json.dumps(_ABSENT))
    return f"""{_setup(setup)}
{f"{activate} || {{ echo {absent}; exit 0; }}" if activate else ""}
{"export MMM_ORCH_CHECK_QUICK=1" if quick else ""}
{shlex.quote(python)} - <<'MMM_ORCH_PY'
{_REPORT_PY}MMM_ORCH_PY
"""


_ABSENT = {"python": None, "mmm_orch": None, "error": "no virtual environment there to activate"}


def read_report(stdout: str) -> dict[str, Any] | None:
    for line in stdout.splitlines():
        if line.startswith(REPORT):
            return json.loads(line[len(REPORT) :])
    return None


def activation(path_word: str) -> str:
    return f"source {path_word}/bin/activate"


# -- the check at submission ----------------------------------------------------------------------


def _cache_file() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "mmm-orch" / "env-checks.json"


def check_key(
    machine: str, host: str, setup: tuple[str, ...], environment: str, python: str
) -> str:
    text = json.dumps([machine, host, list(setup), environment, python, wheel_digest()])
    return hashlib.sha256(text.encode()).hexdigest()


def checked_before(key: str) -> bool:
    try:
        return key in json.loads(_cache_file().read_text())
    except (OSError, ValueError):
        return False


def remember_check(key: str) -> None:
    path = _cache_file()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[key] = time.time()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except OSError:
        pass  # an unwritable cache only costs the check next time


def missing_message(machine: str, report: dict[str, Any] | None, host: str, output: str) -> str:
    where = f" on {host}" if host else ""
    if report is None:
        last = output.strip().splitlines()[-1] if output.strip() else "no output"
        return (
            f"the job's Python for {machine}{where} could not be started after the profile's "
            f"setup lines ({last}); check them with `mmm-orch env check {machine}`"
        )
    if report["mmm_orch"] is None:
        why = report["error"] or "mmm_orch is not installed"
    else:
        why = f"it has mmm-orch {report['mmm_orch']}, this is {__version__}"
    python = f" ({report['python']})" if report.get("python") else ""
    return (
        f"the job's Python for {machine}{where}{python} cannot run mmm-orch "
        f"{__version__}: {why}; fix it with `mmm-orch env create {machine}`"
    )
