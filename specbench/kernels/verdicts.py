"""The kernels' probe verdicts, stored: a probe runs once per device, MLX version and kernel source, not per process.

A probe (``specbench.kernels.probe``) builds one kernel per row count and variant and runs it against MLX's
own products (MLX keeps compiled kernels on the machine's disk, so on a fresh machine each is a compile). Its
verdict (the variant proved bit-identical to MLX, or none, and why) is kept in memory for the process and in
``kernel-probes.json`` beside exact mode's calibrations (``$SPECBENCH_HOME/exact``), keyed by the device, its
driver, the MLX and specbench versions, the probe's arguments (dtype, bits, group size, head dimension, the
variants, rows and shapes it runs) and a digest of the source files the verdict rests on (the kernel's CUDA
source and launch code, and the probe): a changed kernel is probed anew. Only conclusive verdicts are stored;
a kernel that failed to compile or run is probed again by the next process. A damaged store, or one whose
verdict is not for what it is stored under (another device, driver, version, argument or source, or a variant
the kernel has not), is moved aside with one warning and the kernel probed anew.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbench.common.files import home, locked, set_aside, write_json_atomic
from specbench.common.identity import device_name, versions

#: The store's file name inside ``$SPECBENCH_HOME/exact`` (exact mode's calibrations are ``<model key>.json``).
STORE_NAME = "kernel-probes.json"
#: Where Linux tells the NVIDIA driver's version.
DRIVER_VERSION = Path("/proc/driver/nvidia/version")
#: The modules each kernel's verdict rests on: its own (CUDA source and launch), those it takes constants
#: from, and the probe that compares it with MLX.
SOURCES: dict[str, tuple[str, ...]] = {
    "qmv_rows": ("specbench.kernels.qmv", "specbench.kernels.probe"),
    "qmv_rows_metal": ("specbench.kernels.qmv_metal", "specbench.kernels.qmv", "specbench.kernels.probe"),
    "gemv_rows": ("specbench.kernels.gemv", "specbench.kernels.qmv", "specbench.kernels.probe"),
    "attention_rows": ("specbench.kernels.attention", "specbench.kernels.probe"),
}


@dataclass(frozen=True)
class Verdict:
    """What a probe found: the variant that reproduces MLX (None: none does, ``reason`` says why)."""

    variant: str | None
    reason: str | None = None


#: Verdicts of this process, by (kernel, arguments as JSON).
_memory: dict[tuple[str, str], Verdict] = {}
#: The variants looked up in this process, by the lookup's own arguments (``specbench.kernels.probe``): exact
#: verification asks for them on every kernel call, and this answers without building the verdict's key.
variants_seen: dict[tuple[Any, ...], str | None] = {}


def store_path() -> Path:
    """The stored verdicts: ``$SPECBENCH_HOME/exact/kernel-probes.json``."""
    return home() / "exact" / STORE_NAME


def source_digest(kernel: str | None = None) -> str:
    """A digest of the text of the modules ``kernel``'s verdict rests on (``SOURCES``); None: of every kernel's
    (what exact mode's calibration, which times the kernels, is keyed by on CUDA)."""
    names = SOURCES[kernel] if kernel is not None else sorted({n for modules in SOURCES.values() for n in modules})
    digest = hashlib.sha1()
    for name in names:
        digest.update(Path(sys.modules[name].__file__).read_bytes())
    return digest.hexdigest()[:16]


def _arguments(args: dict[str, Any]) -> str:
    return json.dumps(args, sort_keys=True, default=str)


def driver_version() -> str:
    """The NVIDIA driver's version line ("" where there is none): where MLX hands the driver PTX, the driver's
    assembler makes the machine code, and may contract a multiply and an add differently in another version."""
    try:
        return DRIVER_VERSION.read_text(encoding="utf-8", errors="replace").splitlines()[0].strip()
    except (OSError, IndexError):
        return ""


def verdict_key(kernel: str, args: dict[str, Any]) -> str:
    """The stored verdict's key: device, driver, MLX and specbench versions, kernel, arguments and source digest."""
    vers = versions()
    text = f"{device_name()}|{driver_version()}|mlx {vers['mlx']}|specbench {vers['specbench']}|{kernel}"
    return hashlib.sha1(f"{text}|{_arguments(args)}|source {source_digest(kernel)}".encode()).hexdigest()[:20]


def _read(path: Path) -> dict[str, dict[str, Any]]:
    """The stored verdicts by key ({} when there are none; a damaged file is moved aside with a warning)."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        stored = data["verdicts"]
        if not isinstance(stored, dict):
            raise TypeError(f"verdicts must be a JSON object, not {type(stored).__name__}")
        for entry in stored.values():
            if not isinstance(entry.get("variant"), (str, type(None))):
                raise TypeError(f"a variant must be text or null, not {entry.get('variant')!r}")
        return stored
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        set_aside(path, "store of kernel probe verdicts", f"{type(err).__name__}: {err}")
        return {}


def _expected(kernel: str, args: dict[str, Any]) -> dict[str, Any]:
    """What a stored verdict of ``kernel`` with ``args`` must hold besides its variant: its key's parts."""
    vers = versions()
    return {
        "kernel": kernel,
        "args": json.loads(_arguments(args)),
        "device": device_name(),
        "driver": driver_version(),
        "mlx": vers["mlx"],
        "specbench": vers["specbench"],
        "source": source_digest(kernel),
    }


def _wrong(entry: dict[str, Any], kernel: str, args: dict[str, Any], variants: Sequence[str] | None) -> str:
    """What is wrong with a stored verdict for ``kernel`` with ``args`` ("" when nothing is): parts of its key
    that are not those it is stored under, a variant the kernel has not, a reason that is not text."""
    wrong = [part for part, value in _expected(kernel, args).items() if entry.get(part) != value]
    if wrong:
        return f"its {', '.join(wrong)} are not those it is stored for"
    variant = entry.get("variant")
    if variant is not None and variants is not None and variant not in variants:
        return f"its variant {variant!r} is none of {kernel}'s ({', '.join(variants)})"
    if not isinstance(entry.get("reason"), (str, type(None))):
        return "its reason is not text"
    return ""


def load(kernel: str, args: dict[str, Any], variants: Sequence[str] | None = None) -> Verdict | None:
    """The verdict of ``kernel``'s probe with ``args`` on this device, from memory or the store (None: never probed).
    A stored verdict that is not for this key, or names none of ``variants``, is not trusted: the store is moved
    aside with a warning naming it, and None returned (the kernel is probed anew)."""
    memo = (kernel, _arguments(args))
    if memo in _memory:
        return _memory[memo]
    path = store_path()
    key = verdict_key(kernel, args)
    entry = _read(path).get(key)
    if entry is None:
        return None
    wrong = _wrong(entry, kernel, args, variants)
    if wrong:
        set_aside(path, "store of kernel probe verdicts", f"the verdict stored under {key}: {wrong}")
        return None
    verdict = _memory[memo] = Verdict(entry["variant"], entry.get("reason"))
    return verdict


def keep(kernel: str, args: dict[str, Any], verdict: Verdict, store: bool = True) -> None:
    """Remember ``verdict`` for this process and, with ``store``, in the store (merged with the verdicts other
    processes stored meanwhile, under the store's lock)."""
    _memory[(kernel, _arguments(args))] = verdict
    if not store:
        return
    entry = {**_expected(kernel, args), "variant": verdict.variant, "reason": verdict.reason}
    entry["probed"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    path = store_path()
    with locked(path):
        stored = _read(path)
        stored[verdict_key(kernel, args)] = entry
        write_json_atomic(path, {"verdicts": stored})


def forget() -> None:
    """Drop this process's verdicts (the store keeps them): the next lookup reads the store, as a new process does."""
    _memory.clear()
    variants_seen.clear()
