"""Choosing a device among profiles (:class:`DeviceInfo`), with no OpenCL: what a ``--device`` spec or
``$TUNER_DEVICE`` names (an index, or a platform, name, type or fingerprint substring), and the default where none
is named (in :func:`default_order`, the first device that passes the probe, ``tuner.runtime.base.probe_source``).

A backend hands in its list of devices and its probe (``probe(info) -> None``, or why the device cannot be used):
``tuner.runtime.opencl.device`` does for this machine's OpenCL devices. This module imports no OpenCL."""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence

from tuner.errors import TunerError
from tuner.target import DeviceInfo

# The default device for the CLI and the API: a choose_device spec (index, name substring or fingerprint).
DEVICE_ENV = "TUNER_DEVICE"

Probe = Callable[[DeviceInfo], "str | None"]


def device_table(infos: Sequence[DeviceInfo]) -> str:
    return "\n".join(f"  [{d.index}] {d.platform} / {d.name} ({d.type})" for d in infos) or "  (none)"


def default_order(infos: Sequence[DeviceInfo]) -> list[DeviceInfo]:
    """Candidates for the default, best first: GPUs, then PoCL's CPU device, then other CPUs, then the rest;
    never a simulator such as Oclgrind (which reports itself as a GPU)."""
    def rank(d: DeviceInfo) -> int:
        return 0 if d.type == "GPU" else 1 if d.platform_tag == "pocl" else 2 if d.type == "CPU" else 3
    return sorted((d for d in infos if not d.is_simulator), key=lambda d: (rank(d), d.index))


def pick(spec: int | str, infos: Sequence[DeviceInfo], probe: Probe, check: bool = True) -> DeviceInfo:
    """The device of ``infos`` that ``spec`` names: an int or digit string is an index into ``infos``; another
    string, the first device whose platform, name, type or fingerprint contains it (case-insensitive), e.g.
    "nvidia", "pocl", "intel", "cpu". ``check``: a device that fails ``probe`` raises TunerError with the reason
    (and a substring that several devices match picks the first that passes)."""
    if isinstance(spec, int) or (isinstance(spec, str) and spec.strip().isdigit()):
        i = int(spec)
        if not 0 <= i < len(infos):
            raise TunerError(f"no OpenCL device with index {i}; available devices:\n{device_table(infos)}")
        found = infos[i]
    else:
        text = str(spec).strip()
        matching = [d for d in infos if text and d.matches(text)]
        if not matching:
            raise TunerError(f"no OpenCL device matches {spec!r}; available devices:\n{device_table(infos)}")
        # "cpu" on a host where PoCL cannot build means the CPU device that can.
        found = next((d for d in matching if not check or probe(d) is None), matching[0])
    reason = probe(found) if check else None
    if reason:
        raise TunerError(f"device {spec!r} ({found.platform} / {found.name}) {reason}; "
                         f"pick another device (`tuner devices` lists them and why)")
    return found


def pick_default(infos: Sequence[DeviceInfo], probe: Probe, env: Mapping[str, str] | None = None,
                 hint: str = "") -> DeviceInfo:
    """The device used when none is named: the one ``$TUNER_DEVICE`` (a :func:`pick` spec) or pyopencl's
    ``$PYOPENCL_CTX`` selects when set, else the first of :func:`default_order` that passes ``probe``. ``env``:
    the environment (default ``os.environ``); ``hint``: how to get a device, said when none will do."""
    env = os.environ if env is None else env
    for var in (DEVICE_ENV, "PYOPENCL_CTX"):
        spec = env.get(var, "").strip()
        if spec:
            info = _from_env(var, spec, infos, probe)
            reason = probe(info)
            if reason:
                raise TunerError(f"${var}={spec} selects {info.platform} / {info.name}, which {reason}; "
                                 f"unset it or pick another device (`tuner devices` lists them)")
            return info
    failed = []
    for info in default_order(infos):
        reason = probe(info)
        if reason is None:
            return info
        failed.append(f"  [{info.index}] {info.platform} / {info.name}: {reason}")
    raise TunerError("no OpenCL device can build programs:\n" + "\n".join(failed or [device_table(infos)])
                     + (f"\n{hint}" if hint else ""))


def _from_env(var: str, spec: str, infos: Sequence[DeviceInfo], probe: Probe) -> DeviceInfo:
    if var == "PYOPENCL_CTX" and re.fullmatch(r"\d+(:\d+)?", spec):  # pyopencl's "platform[:device]"
        p, _, d = spec.partition(":")
        platforms = list(dict.fromkeys(i.platform for i in infos))
        if int(p) < len(platforms):
            on = [i for i in infos if i.platform == platforms[int(p)]]
            if int(d or 0) < len(on):
                return on[int(d or 0)]
        raise TunerError(f"${var}={spec} names no OpenCL device; available devices:\n{device_table(infos)}")
    try:
        return pick(spec, infos, probe, check=False)
    except TunerError as e:
        raise TunerError(f"${var}: {e}") from None
