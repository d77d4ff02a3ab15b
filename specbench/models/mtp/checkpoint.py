"""Reading a few tensors out of a safetensors checkpoint: one file or a sharded folder.

A sharded folder's ``model.safetensors.index.json`` tells which shard holds which tensor, so only the
shards holding the wanted tensors are opened. ``mx.load`` maps a file lazily: names and metadata come
from its header, and only the tensors evaluated are read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import mlx.core as mx

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
        self._lazy: dict[str, Any] = {}  # shard name -> its lazily mapped tensors
        if (path / INDEX).is_file():
            try:
                self.weight_map = dict(json.loads((path / INDEX).read_text())["weight_map"])
            except (KeyError, ValueError) as e:
                raise ValueError(f"{path / INDEX} is not a safetensors index (no 'weight_map'): {e}") from e
            return
        if path.is_dir():
            files = sorted(path.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"{path} holds no .safetensors files (and no {INDEX})")
        elif path.suffix == ".safetensors":
            files = [path]
        else:
            raise ValueError(f"{path} is neither a .safetensors file nor a checkpoint folder")
        for file in files:
            try:
                loaded: Any = mx.load(str(file), return_metadata=True)
            except Exception as e:  # mlx raises its own error types
                raise ValueError(f"{file} is not a readable safetensors file: {e}") from e
            self._lazy[file.name], metadata = loaded
            self.weight_map.update(dict.fromkeys(self._lazy[file.name], file.name))
        if len(files) == 1:
            self.file_metadata = dict(metadata)

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

    def load(self, names: Iterable[str]) -> dict[str, mx.array]:
        """Lazy arrays for ``names`` (opening only the shards that hold them)."""
        names = list(names)
        for shard in sorted({self.weight_map[n] for n in names} - set(self._lazy)):
            file = self.folder / shard
            if not file.exists():
                raise FileNotFoundError(
                    f"shard {shard} (listed in {INDEX}) is missing from {self.folder}; it holds "
                    f"{', '.join(n for n in names if self.weight_map[n] == shard)[:200]}"
                )
            self._lazy[shard] = mx.load(str(file))
        return {n: self._lazy[self.weight_map[n]][n] for n in names}
