"""A generation cache whose common beginning is held once for every row of the batch.

A group of G samples shares its prompt (and the Squid reference documents before it): the cache of
those positions is the same for every row. Repeating it G times (`batch_repeat_interleave`) holds
G copies for the whole of sampling: with 4 x 512 reference tokens, ~430 MiB for G = 4 where one
copy is ~110 MiB. `share_rows` turns each layer of a filled one-row cache into a `SharedRowsLayer`:
the common positions stay one row, the generated ones grow per row, and each update hands the
attention the rows' keys and values joined (the same tensors the repeated cache held, built for one
layer at a time as a growing cache rebuilds them at every token anyway). The samples are the same.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

__all__ = ["SharedRowsLayer", "share_rows"]


class SharedRowsLayer(DynamicLayer):
    """A `DynamicLayer` of `rows` rows whose first positions are one row shared by all."""

    def __init__(self, layer: DynamicLayer, rows: int):
        super().__init__()
        self.rows = rows
        self.shared_keys, self.shared_values = layer.keys, layer.values  # [1, heads, S, dim]
        self.device = layer.keys.device
        empty = (rows, *layer.keys.shape[1:-2], 0, layer.keys.shape[-1])
        self.keys = layer.keys.new_empty(empty)  # the rows' own positions: [rows, heads, N, dim]
        self.values = layer.values.new_empty(empty)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        return self._joined()

    def _joined(self) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (self.rows, -1, -1, -1)
        return (torch.cat([self.shared_keys.expand(shape), self.keys], dim=-2),
                torch.cat([self.shared_values.expand(shape), self.values], dim=-2))

    def get_seq_length(self) -> int:
        return self.shared_keys.shape[-2] + self.keys.shape[-2]

    def _unshare(self) -> None:
        """Every row's whole cache in `keys`/`values` (for the operations that reorder rows)."""
        self.keys, self.values = self._joined()
        self.shared_keys, self.shared_values = self.keys[:, :, :0], self.values[:, :, :0]

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._unshare()
        super().batch_repeat_interleave(repeats)
        self.rows *= repeats
        self.shared_keys, self.shared_values = self.keys[:1, :, :0], self.values[:1, :, :0]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._unshare()
        super().batch_select_indices(indices)
        self.rows = self.keys.shape[0]
        self.shared_keys, self.shared_values = self.keys[:1, :, :0], self.values[:1, :, :0]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def crop(self, tokens_to_remove: int) -> None:
        self._unshare()
        super().crop(tokens_to_remove)
        self.shared_keys, self.shared_values = self.keys[:1, :, :0], self.values[:1, :, :0]


def share_rows(cache, rows: int):
    """`cache` (a DynamicCache of one row) made a cache of `rows` rows sharing what it holds."""
    for layer in cache.layers:
        if type(layer) is not DynamicLayer or not layer.is_initialized or layer.keys.shape[0] != 1:
            cache.batch_repeat_interleave(rows)  # not a plain one-row cache: copies, as before
            return cache
    cache.layers = [SharedRowsLayer(layer, rows) for layer in cache.layers]
    return cache
