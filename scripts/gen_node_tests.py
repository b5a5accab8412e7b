#!/usr/bin/env python3
"""Generate the ONNX backend *node* test cases from the pinned onnx package.

The cases are built from `onnx.backend.test.case.node` (nothing is downloaded) and written in
the standard layout that kiln's conformance runner reads:

    OUT/<case>/model.onnx
    OUT/<case>/test_data_set_<k>/input_<i>.pb
    OUT/<case>/test_data_set_<k>/output_<i>.pb

A file `OUT/ONNX_VERSION` records the onnx version that made them; the script does nothing when
it already matches (pass --force to rebuild).
"""
import argparse
import os
import shutil
import sys
import warnings


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".cache/onnx-node-tests", help="output folder (default: %(default)s)")
    ap.add_argument("--force", action="store_true", help="rebuild even if the cache is current")
    args = ap.parse_args()

    import numpy as np
    import onnx
    from onnx import numpy_helper
    import onnx.backend.test.case.node as node_cases

    stamp = os.path.join(args.out, "ONNX_VERSION")
    if not args.force and os.path.exists(stamp) and open(stamp).read().strip() == onnx.__version__:
        print(f"node tests for onnx {onnx.__version__} already in {args.out}")
        return 0
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np.seterr(all="ignore")
        cases = node_cases.collect_testcases()

    def write_value(path, value, vi):
        if vi.type.HasField("sequence_type"):
            proto = numpy_helper.from_list(value, vi.name)
        elif vi.type.HasField("optional_type"):
            proto = numpy_helper.from_optional(value, vi.name)
        elif vi.type.HasField("map_type"):
            proto = numpy_helper.from_dict(value, vi.name)
        elif isinstance(value, onnx.TensorProto):
            proto = value
        else:
            proto = numpy_helper.from_array(np.asarray(value), vi.name)
        with open(path, "wb") as f:
            f.write(proto.SerializeToString())

    for case in cases:
        d = os.path.join(args.out, case.name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        for k, (inputs, outputs) in enumerate(case.data_sets):
            ds = os.path.join(d, f"test_data_set_{k}")
            os.makedirs(ds, exist_ok=True)
            for i, v in enumerate(inputs):
                write_value(os.path.join(ds, f"input_{i}.pb"), v, case.model.graph.input[i])
            for i, v in enumerate(outputs):
                write_value(os.path.join(ds, f"output_{i}.pb"), v, case.model.graph.output[i])
    with open(stamp, "w") as f:
        f.write(onnx.__version__ + "\n")
    print(f"wrote {len(cases)} node test cases for onnx {onnx.__version__} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
