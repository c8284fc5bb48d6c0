"""Pickles that can only hold plain data: dicts, lists, tuples, strings, bytes, numbers,
booleans and None. Anything else (a class, a function, ``os.system`` by name) is refused
before it is built, so loading runs no code.

torch writes its Flight Recorder dumps as pickles; read with plain ``pickle.loads``, a
dump can run whatever code its author chose. Every dump distdoctor reads, its ranks' own
included, goes through here.
"""

from __future__ import annotations

import io
import pickle


class NotPlainData(ValueError):
    """The pickle names a class or a function: it is refused, and nothing of it runs."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: ANN201 (pickle's own signature)
        raise NotPlainData(f"the pickle names {module}.{name}; only plain data is read")

    def persistent_load(self, pid):  # noqa: ANN001, ANN201
        raise NotPlainData("the pickle refers to an object outside it; only plain data is read")


def loads_plain(data: bytes) -> object:
    """The plain data a pickle holds; NotPlainData if it names anything else, ValueError
    if it is cut short or not a pickle."""
    return load_plain(io.BufferedReader(io.BytesIO(data)))


def load_plain(file: io.BufferedIOBase) -> object:
    """``loads_plain`` from an open binary file. A buffered one (``open(path, "rb")``) is
    read in blocks; an unbuffered one costs a call per opcode (twice the time)."""
    try:
        return _PlainUnpickler(file).load()
    except NotPlainData:
        raise
    # Raised again as one ValueError that names it; truncated, garbage: pickle raises a zoo of
    # types.
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"not a readable pickle ({type(exc).__name__}: {exc})") from None
