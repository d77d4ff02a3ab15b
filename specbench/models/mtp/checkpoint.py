"""Reading a few tensors out of a safetensors checkpoint: one file or a sharded folder.

Names, shapes and metadata come from the file headers (safetensors' ``safe_open``); a sharded
folder's ``model.safetensors.index.json`` tells which shard holds which tensor, so only the
shards holding the wanted tensors are opened. Tensor data is read lazily (``mx.load`` maps
the file; only the tensors evaluated are read).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import mlx.core as mx
from safetensors import safe_open

INDEX = "model.safetensors.index.json"


class Checkpoint:
    """The tensor names of a checkpoint and lazy access to chosen tensors."""

    def __init__(self, path: str | Path):
        self.path = path = Path(path).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"checkpoint not found: {path}")
        self.folder = path if path.is_dir() else path.parent
        self.weight_map: dict[str, str] = {}
        self.file_metadata: dict[str, str] = {}
        if path.is_dir():
            index = path / INDEX
            if index.exists():
                try:
                    self.weight_map = dict(json.loads(index.read_text())["weight_map"])
                except (KeyError, ValueError) as e:
                    raise ValueError(f"{index} is not a safetensors index (no 'weight_map'): {e}") from e
                missing = sorted({f for f in self.weight_map.values()} - {p.name for p in path.iterdir()})
                self.missing_shards = missing
            else:
                files = sorted(path.glob("*.safetensors"))
                if not files:
                    raise FileNotFoundError(f"{path} holds no .safetensors files (and no {INDEX})")
                for f in files:
                    for name in self._header(f)[0]:
                        self.weight_map[name] = f.name
                self.missing_shards = []
                if len(files) == 1:
                    self.file_metadata = self._header(files[0])[1]
        elif path.suffix == ".safetensors":
            names, self.file_metadata = self._header(path)
            self.weight_map = {n: path.name for n in names}
            self.missing_shards = []
        else:
            raise ValueError(f"{path} is neither a .safetensors file nor a checkpoint folder")
        self._lazy: dict[str, dict[str, mx.array]] = {}

    @staticmethod
    def _header(file: Path) -> tuple[list[str], dict[str, str]]:
        try:
            with safe_open(str(file), framework="numpy") as f:
                return list(f.keys()), dict(f.metadata() or {})
        except Exception as e:  # safetensors raises its own error types
            raise ValueError(f"{file} is not a readable safetensors file: {e}") from e

    @property
    def names(self) -> list[str]:
        return list(self.weight_map)

    def config(self) -> dict[str, Any] | None:
        """The model config: config.json next to the checkpoint, or one stored in the file's metadata."""
        if "config" in self.file_metadata:
            return json.loads(self.file_metadata["config"])
        file = self.folder / "config.json"
        if self.path.is_dir() and file.exists():
            return json.loads(file.read_text())
        return None

    def shards(self, names: Iterable[str]) -> list[str]:
        return sorted({self.weight_map[n] for n in names})

    def load(self, names: Iterable[str]) -> dict[str, mx.array]:
        """Lazy arrays for ``names`` (opening only the shards that hold them)."""
        names = list(names)
        out = {}
        for shard in self.shards(names):
            file = self.folder / shard
            if not file.exists():
                raise FileNotFoundError(
                    f"shard {shard} (listed in {INDEX}) is missing from {self.folder}; it holds "
                    f"{', '.join(n for n in names if self.weight_map[n] == shard)[:200]}"
                )
            if shard not in self._lazy:
                self._lazy[shard] = mx.load(str(file))
        for n in names:
            out[n] = self._lazy[self.weight_map[n]][n]
        return out
