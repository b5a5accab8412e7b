"""Loads a model compiled by kiln as a shared library with ctypes and runs it, as a Python
application would, with the standard library only.

Usage: ctypes_run.py LIB.so NAME IN.bin OUT.bin OUT_BYTES
Reads the raw little-endian input (the model's only input), writes the only output.
"""

import ctypes
import json
import sys


def main() -> int:
    lib_path, name, in_path, out_path, out_bytes = sys.argv[1:]
    lib = ctypes.CDLL(lib_path)

    def fn(what, restype, *argtypes):
        f = getattr(lib, f"{name}_{what}")
        f.restype = restype
        f.argtypes = list(argtypes)
        return f

    create = fn("create", ctypes.c_void_p, ctypes.c_int32)
    destroy = fn("destroy", None, ctypes.c_void_p)
    run_generic = fn(
        "run_generic",
        ctypes.c_int32,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_void_p),
    )
    last_error = fn("last_error", ctypes.c_char_p, ctypes.c_void_p)
    info = fn("info", ctypes.c_char_p)

    signature = json.loads(info().decode())
    if len(signature["inputs"]) != 1 or len(signature["outputs"]) != 1:
        print(f"expected one input and one output: {signature}", file=sys.stderr)
        return 1

    with open(in_path, "rb") as f:
        data = f.read()
    input_buf = ctypes.create_string_buffer(data, len(data))
    output_buf = ctypes.create_string_buffer(int(out_bytes))
    ctx = create(2)
    if not ctx:
        print(f"{name}_create: {last_error(None).decode()}", file=sys.stderr)
        return 1
    try:
        ins = (ctypes.c_void_p * 1)(ctypes.cast(input_buf, ctypes.c_void_p))
        outs = (ctypes.c_void_p * 1)(ctypes.cast(output_buf, ctypes.c_void_p))
        if run_generic(ctx, ins, outs) != 0:
            print(f"{name}_run_generic: {last_error(ctx).decode()}", file=sys.stderr)
            return 1
    finally:
        destroy(ctx)
    with open(out_path, "wb") as f:
        f.write(output_buf.raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
