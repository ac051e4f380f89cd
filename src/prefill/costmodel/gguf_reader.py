"""gguf.GGUFReader with its two slow paths replaced, nothing it returns changed. No torch.

gguf's reader builds a numpy view for every element of every metadata array: for the embedded model's
49,152-token vocabulary (strings, scores, token types) that is ~250,000 views and 2.8 s a parse here. This
reader finds where each element lies with one pass of `struct` over the bytes and makes an element's views
only when it is asked for (`_LazyParts`), so a field's `parts`, `data` and `contents()` read as gguf's do.
It also reads over a plain ndarray view of the memory map: a numpy.memmap slice runs Python code each time.
"""

from __future__ import annotations

import functools
import struct
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np


class _LazyParts(Sequence):
    """The parts gguf lists for an array field: [key length, key, value type, element type, count] and then,
    per element, [its length, its bytes] (strings) or [its value] (scalars); views made when indexed."""

    def __init__(self, reader, head: list, starts, end: int, dtype, strings: bool) -> None:
        self.reader, self.head, self.starts, self.end = reader, head, starts, end
        self.dtype, self.strings = dtype, strings
        self.per = 2 if strings else 1  # parts per element

    def values(self, errors: str = "strict") -> list:
        """Every element at once: the strings decoded as UTF-8, or the scalars as Python numbers."""
        if not self.starts:
            return []
        first = self.starts[0]
        raw = self.reader.data[first : self.end].tobytes()  # the array's bytes, sliced below as Python bytes
        if not self.strings:  # in the file's byte order, as gguf's _get reads it ("I": the host's, "S": swapped)
            return np.frombuffer(raw, dtype=np.dtype(self.dtype).newbyteorder(self.reader.byte_order)).tolist()
        ends = [*self.starts[1:], self.end]
        return [raw[a + 8 - first : b - first].decode("utf-8", errors) for a, b in zip(self.starts, ends, strict=True)]

    def __len__(self) -> int:
        return len(self.head) + self.per * len(self.starts)

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(len(self)))]
        if j < 0:
            j += len(self)
        if not 0 <= j < len(self):
            raise IndexError(j)
        if j < len(self.head):
            return self.head[j]
        element, which = divmod(j - len(self.head), self.per)
        offset = self.starts[element]
        if not self.strings:
            return self.reader._get(offset, self.dtype)
        length = self.reader._get(offset, np.uint64)
        return length if which == 0 else self.reader._get(offset + 8, np.uint8, length[0])


@functools.cache
def reader_class():
    """The reader class (built once: it subclasses gguf's, imported only when a GGUF is read)."""
    from gguf import GGUFReader, GGUFValueType, ReaderField

    class Reader(GGUFReader):
        @property
        def data(self):
            return self._array

        @data.setter
        def data(self, mapped) -> None:
            self._array = np.asarray(mapped)  # a view: its base keeps the map open

        def _build_fields(self, offs: int, count: int) -> int:
            """gguf's loop over the key/value fields, with arrays of strings or scalars read lazily."""
            for _ in range(count):
                orig_offs = offs
                key_len, key = self._get_str(offs)
                offs += int(key_len.nbytes + key.nbytes)
                raw_type = self._get(offs, np.uint32)
                offs += int(raw_type.nbytes)
                head = [key_len, key, raw_type]
                lazy = self._lazy_array(offs, head) if raw_type[0] == GGUFValueType.ARRAY else None
                if lazy is None:
                    size, parts, idxs, types = self._get_field_parts(offs, raw_type[0])
                    parts, idxs = head + parts, [i + len(head) for i in idxs]
                else:
                    size, parts, idxs, types = lazy
                name = str(bytes(key), encoding="utf-8")
                self._push_field(ReaderField(orig_offs, name, parts, idxs, types), skip_sum=True)
                offs += size
            return offs

        def _lazy_array(self, offs: int, head: list) -> tuple[int, Any, Any, list] | None:
            """(size, parts, data indices, types) of an array of strings or scalars, or None for gguf's path."""
            item_type = self._get(offs, np.uint32)
            count = self._get(offs + 4, np.uint64)
            element = GGUFValueType(item_type[0])
            strings = element == GGUFValueType.STRING
            dtype = self.gguf_scalar_to_np.get(element)
            if not strings and dtype is None:
                return None  # arrays of arrays: rare and short
            n, start = int(count[0]), offs + 12
            if strings:
                starts, end = _string_starts(self.data, start, n, self.byte_order)
            else:
                size = np.dtype(dtype).itemsize
                starts, end = range(start, start + n * size, size), start + n * size
            if end > len(self.data):
                raise ValueError(f"array field runs past the end of the file ({end:,} > {len(self.data):,} bytes)")
            parts = _LazyParts(self, [*head, item_type, count], starts, end, dtype, strings)
            first = len(head) + 2 + strings  # the data part of element 0
            types = [GGUFValueType.ARRAY, element] if n else [GGUFValueType.ARRAY]  # as gguf types an empty one
            return end - offs, parts, range(first, len(parts), parts.per), types

    return Reader


def array_values(field, errors: str = "strict") -> list:
    """The elements of an array field (strings decoded with `errors`): at once from this reader's lazy parts,
    else (gguf's own reader, an array of arrays) one by one as gguf's contents() reads them."""
    if isinstance(field.parts, _LazyParts):
        return field.parts.values(errors)
    from gguf import GGUFValueType

    if field.types[-1] == GGUFValueType.STRING:
        return [bytes(field.parts[i]).decode("utf-8", errors) for i in field.data]
    return [field.parts[i].tolist()[0] for i in field.data]


def _string_starts(buffer: np.ndarray, offset: int, n: int, byte_order: str) -> tuple[list[int], int]:
    """Where each of n GGUF strings (a uint64 length, then the bytes) starts, and where the last one ends;
    `byte_order` is the reader's: "I" the host's, "S" the other one."""
    swapped = ">" if sys.byteorder == "little" else "<"
    read = struct.Struct(f"{'=' if byte_order == 'I' else swapped}Q").unpack_from
    starts, size = [], len(buffer)
    for _ in range(n):
        if offset + 8 > size:
            raise ValueError("a string runs past the end of the file")
        starts.append(offset)
        offset += 8 + read(buffer, offset)[0]
    return starts, offset
