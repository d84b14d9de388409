"""A stand-in for ``adb`` (tests of ``adb://``): the "phone" is a folder on this machine, ``shell`` runs there
(``/data/local/tmp`` mapped into it), ``push`` copies, ``forward`` is the identity (the phone's port is this
machine's). Every call is logged to ``PHONE/adb.log``.

``FAKE_PHONE_RUN`` (or ``install(..., run=...)``): a command that the phone runs the pushed agent with, e.g.
``native/cross/qemu-arm64.sh run``: an arm64 "phone" under qemu-aarch64 with the arm64 OpenCL."""
from __future__ import annotations

import os
import shlex
import socket
import sys
from pathlib import Path

FAKE_ADB = r'''#!PYTHON
"""A stand-in for adb: the "phone" is a directory on this machine; shell runs there, forward is the identity."""
import os, shutil, sys
root = os.environ.get("FAKE_PHONE_ROOT") or PHONE_ROOT
run = os.environ.get("FAKE_PHONE_RUN") or PHONE_RUN
args = sys.argv[1:]
if args[:1] == ["-s"]:
    args = args[2:]
with open(os.path.join(root, "adb.log"), "a") as f:
    f.write(" ".join(args) + "\n")
local = lambda p: p.replace("/data/local/tmp", root + "/data/local/tmp")
if args[0] == "shell":
    command = " ".join(args[1:])
    if run and command.startswith("/data/local/tmp/tuner/tuner-agent "):
        command = run + " " + command  # the phone's programs run under an emulator
    os.execvp("sh", ["sh", "-c", local(command)])
elif args[0] == "push":
    dst = local(args[2])
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copy(args[1], dst)
    print(f"{args[1]}: 1 file pushed")
elif args[0] == "forward" and args[1] == "--remove":
    pass
elif args[0] == "forward":
    print(args[2].split(":")[1])  # the phone's port is this machine's
else:
    sys.exit(f"fake adb: {args}")
'''


def script(root: str = "", run: str = "") -> str:
    """The stand-in's text: this Python, and the phone's folder and emulator baked in (the environment's
    ``FAKE_PHONE_ROOT`` and ``FAKE_PHONE_RUN`` take precedence)."""
    return (FAKE_ADB.replace("#!PYTHON", f"#!{sys.executable}")
            .replace("or PHONE_ROOT", f"or {root!r}").replace("or PHONE_RUN", f"or {run!r}"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def install(folder: Path, agent: str, run: str = "") -> dict:
    """Write ``folder/adb`` and the phone ``folder/phone``; the environment ``adb://`` then needs (``ADB``,
    ``TUNER_AGENT_ANDROID``: ``agent``, a free ``TUNER_AGENT_PORT``), to be set while the AgentRuntime starts."""
    phone = folder / "phone"
    phone.mkdir(parents=True, exist_ok=True)
    adb = folder / "adb"
    if run:  # a relative emulator path is the checkout's
        argv = shlex.split(run)
        root = Path(__file__).resolve().parent.parent
        if not os.path.isabs(argv[0]) and (root / argv[0]).exists():
            argv[0] = str(root / argv[0])
        run = shlex.join(argv)
    adb.write_text(script(str(phone), run))
    adb.chmod(0o755)
    return {"ADB": str(adb), "TUNER_AGENT_ANDROID": str(agent), "TUNER_AGENT_PORT": str(free_port())}
