"""CudaPrefetcher: host-to-GPU copies of the next batch overlap training on the current one.

Works on anything that iterates batches and, for exact resume, has `state_dict` / `set_epoch`
(a `PackedLoader`, or any loader with the same three methods).
"""

from __future__ import annotations

from typing import Any, Iterator

import torch


def _to_device(data: Any, device: torch.device) -> Any:
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=True)
    if isinstance(data, dict):
        return {key: _to_device(value, device) for key, value in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_to_device(value, device) for value in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_to_device(value, device) for value in data)
    return data


def _record_stream(data: Any, stream: torch.cuda.Stream) -> None:
    """Tell the caching allocator these side-stream tensors are in use on `stream` too."""
    if isinstance(data, torch.Tensor):
        data.record_stream(stream)
    elif isinstance(data, dict):
        for value in data.values():
            _record_stream(value, stream)
    elif isinstance(data, (list, tuple)):
        for value in data:
            _record_stream(value, stream)


class CudaPrefetcher:
    """Iterate a loader with the next batch already on its way to the GPU.

    Tensors in (nested tuples, lists, dicts of) each batch are copied on a side stream with
    `non_blocking=True` while the current batch trains; the training stream waits for the copy
    before a batch is handed out. Without CUDA (or for a non-CUDA device) batches pass through
    unchanged. `state_dict()` discounts the batch fetched ahead, so resume stays exact.
    """

    def __init__(self, loader: Any, device: torch.device | str | int | None = None) -> None:
        self.loader = loader
        if device is None:
            device = "cuda"
        self.device = torch.device(f"cuda:{device}" if isinstance(device, int) else device)
        self.enabled = self.device.type == "cuda" and torch.cuda.is_available()
        self._ahead = 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        if not self.enabled:
            yield from self.loader
            return
        stream = torch.cuda.Stream(self.device)
        batches = iter(self.loader)

        def fetch() -> tuple[bool, Any]:
            try:
                batch = next(batches)
            except StopIteration:
                return False, None
            with torch.cuda.stream(stream):
                return True, _to_device(batch, self.device)

        # Not reset when the caller stops early: the batch fetched ahead was never handed out
        # (until a new epoch or a loaded state moves the loader's position).
        self._ahead = 0
        more, upcoming = fetch()
        while more:
            current_stream = torch.cuda.current_stream(self.device)
            current_stream.wait_stream(stream)
            batch = upcoming
            _record_stream(batch, current_stream)
            more, upcoming = fetch()
            self._ahead = 1 if more else 0
            yield batch

    def set_epoch(self, epoch: int) -> None:
        """A new epoch starts from its beginning, with no batch fetched ahead (the loader keeps the
        position of the epoch it is in, and so does this)."""
        if epoch != getattr(self.loader, "epoch", None):
            self._ahead = 0
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        state = dict(self.loader.state_dict())
        state["batches"] -= self._ahead
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The loader's next batch is the state's: none is fetched ahead of it."""
        self.loader.load_state_dict(state)
        self._ahead = 0
