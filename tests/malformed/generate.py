#!/usr/bin/env python3
"""Writes the malformed-model suite: tests/malformed/<case>.onnx and <case>.expected.

Each case is a model a user could plausibly hand kiln (a truncated download, a hand-edited
graph, a converter bug) or a hostile one. <case>.expected says what kiln must answer:

    exit N          the exit status of `kiln compile` (3 invalid model, 4 unsupported)
    error TEXT      a substring of the one-line error (any number of lines)

cli/tests/malformed.rs runs `kiln inspect` and `kiln compile` on every case. Regenerate with
    .venv/bin/python tests/malformed/generate.py
"""

import os
import sys

import onnx
from onnx import TensorProto, helper

HERE = os.path.dirname(os.path.abspath(__file__))
INVALID, UNSUPPORTED = 3, 4


def vi(name, dims, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, dims)


def model(nodes, inputs=None, outputs=None, inits=(), opset=17, ir_version=8):
    g = helper.make_graph(
        nodes,
        "g",
        [vi("x", [1, 4])] if inputs is None else inputs,
        [vi("y", [1, 4])] if outputs is None else outputs,
        initializer=list(inits),
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir_version
    return m


def relu():
    return model([helper.make_node("Relu", ["x"], ["y"], name="relu")])


def raw_init(name, dims, nbytes, dtype=TensorProto.FLOAT):
    t = TensorProto(name=name, data_type=dtype, dims=dims)
    t.raw_data = bytes(nbytes)
    return t


def add_w(w):
    """y = x + w, with w an initializer."""
    return model([helper.make_node("Add", ["x", w.name], ["y"], name="add_w")], inits=[w])


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


CASES = {}


def case(name, exit_status, *errors):
    def register(f):
        CASES[name] = (f, exit_status, errors)
        return f

    return register


@case("empty", INVALID, "not a valid ONNX model", "empty")
def _():
    return b""


@case("not_protobuf", INVALID, "not a valid ONNX model")
def _():
    return b"this is plainly a text file and not a protobuf\n"


@case("truncated", INVALID, "not a valid ONNX model", "truncated")
def _():
    b = add_w(raw_init("w", [64], 256)).SerializeToString()
    return b[: len(b) - 40]


@case("wrong_wire_type", INVALID, "not a valid ONNX model", "wire type")
def _():
    # ModelProto.graph (field 7) written as a varint instead of a length-delimited message.
    return relu().SerializeToString() + varint(7 << 3 | 0) + varint(1)


@case("wrong_wire_type_nested", INVALID, "not a valid ONNX model", "wire type")
def _():
    # NodeProto.op_type (field 4, a string) written as a 32-bit fixed value inside the graph.
    m = relu()
    g = m.graph.SerializeToString() + varint(1 << 3 | 2)
    node = relu().graph.node[0].SerializeToString() + varint(4 << 3 | 5) + b"\0\0\0\0"
    g += varint(len(node)) + node
    m.ClearField("graph")
    return m.SerializeToString() + varint(7 << 3 | 2) + varint(len(g)) + g


@case("no_graph", INVALID, "no graph")
def _():
    m = relu()
    m.ClearField("graph")
    return m.SerializeToString()


@case("no_ir_version", INVALID, "IR version")
def _():
    m = relu()
    m.ir_version = 0
    return m.SerializeToString()


@case("opset_too_new", INVALID, "opset 99", "newer")
def _():
    return model([helper.make_node("Relu", ["x"], ["y"])], opset=99).SerializeToString()


@case("opset_too_old", INVALID, "opset 1", "older", "version_converter")
def _():
    return model([helper.make_node("Relu", ["x"], ["y"])], opset=1).SerializeToString()


@case("cycle", INVALID, "cycle")
def _():
    return model(
        [
            helper.make_node("Add", ["x", "c"], ["b"], name="a"),
            helper.make_node("Relu", ["b"], ["c"], name="r"),
            helper.make_node("Relu", ["c"], ["y"], name="out"),
        ]
    ).SerializeToString()


@case("dangling_input", INVALID, "add_w", "'w'", "not produced")
def _():
    return model([helper.make_node("Add", ["x", "w"], ["y"], name="add_w")]).SerializeToString()


@case("output_not_produced", INVALID, "'z'")
def _():
    return model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], outputs=[vi("z", [1, 4])]
    ).SerializeToString()


@case("no_outputs", INVALID, "the graph has no outputs")
def _():
    return model([helper.make_node("Relu", ["x"], ["y"], name="relu")], outputs=[]).SerializeToString()


@case("duplicate_value_names", INVALID, "'y'", "more than one node", "second")
def _():
    return model(
        [
            helper.make_node("Relu", ["x"], ["y"], name="first"),
            helper.make_node("Neg", ["x"], ["y"], name="second"),
        ]
    ).SerializeToString()


@case("input_shadowed_by_node", INVALID, "'x'", "more than once")
def _():
    return model(
        [helper.make_node("Relu", ["x"], ["x"], name="again"), helper.make_node("Relu", ["x"], ["y"])]
    ).SerializeToString()


@case("initializer_size_mismatch", INVALID, "'w'", "20 bytes", "needs 24")
def _():
    return add_w(raw_init("w", [1, 6], 20)).SerializeToString()


@case("initializer_huge_shape_little_data", INVALID, "'w'", "more than kiln accepts")
def _():
    # 2^40 floats declared, 16 bytes present: must be rejected before allocating 4 TiB.
    return add_w(raw_init("w", [1 << 20, 1 << 20], 16)).SerializeToString()


@case("initializer_big_shape_little_data", INVALID, "'w'", "16 bytes")
def _():
    # 2^28 floats (1 GiB) declared, within kiln's limits, 16 bytes present.
    return add_w(raw_init("w", [1 << 14, 1 << 14], 16)).SerializeToString()


@case("huge_dim_in_attribute_tensor", INVALID, "more than kiln accepts")
def _():
    # A Constant whose tensor declares 2^50 elements.
    t = TensorProto(name="c", data_type=TensorProto.FLOAT, dims=[1 << 25, 1 << 25])
    t.raw_data = bytes(4)
    return model(
        [helper.make_node("Constant", [], ["c"], value=t), helper.make_node("Add", ["x", "c"], ["y"])]
    ).SerializeToString()


@case("deeply_nested_subgraphs", INVALID, "not a valid ONNX model")
def _():
    # If inside If, 300 levels deep: beyond protobuf's recursion limit, refused while decoding
    # instead of overflowing the stack. Written by hand: the protobuf library refuses to build it.
    def field(tag, payload):
        return varint(tag << 3 | 2) + varint(len(payload)) + payload

    out = vi("y", [1, 4]).SerializeToString()
    graph = relu().graph.SerializeToString()
    for _ in range(300):
        attr = field(1, b"then_branch") + varint(20 << 3) + varint(5) + field(6, graph)
        node = field(1, b"c") + field(2, b"y") + field(4, b"If") + field(5, attr)
        graph = field(1, node) + field(12, out)
    m = relu()
    m.ClearField("graph")
    return m.SerializeToString() + field(7, graph)


@case("initializer_typed_data_count", INVALID, "'w'")
def _():
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1, 4])
    w.float_data.extend([1.0, 2.0, 3.0])
    return add_w(w).SerializeToString()


@case("unknown_dtype", INVALID, "'w'", "unknown data type 77")
def _():
    return add_w(raw_init("w", [1, 4], 16, dtype=77)).SerializeToString()


@case("negative_dim", INVALID, "negative dimension -4")
def _():
    return model(
        [helper.make_node("Relu", ["x"], ["y"])], inputs=[vi("x", [1, -4])], outputs=[vi("y", [1, -4])]
    ).SerializeToString()


@case("huge_dim", INVALID, "'x'", "more elements than kiln accepts")
def _():
    big = [1 << 40, 1 << 40]
    return model([helper.make_node("Relu", ["x"], ["y"])], inputs=[vi("x", big)], outputs=[vi("y", big)]).SerializeToString()


@case("external_data_outside_folder", INVALID, "'w'", "inside the model's folder")
def _():
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1, 4])
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value="../../../../etc/passwd")
    return add_w(w).SerializeToString()


@case("external_data_missing", INVALID, "'w'", "weights_missing.bin")
def _():
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1, 4])
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value="weights_missing.bin")
    return add_w(w).SerializeToString()


@case("unsupported_op", UNSUPPORTED, "FrobnicateTensor")
def _():
    return model([helper.make_node("FrobnicateTensor", ["x"], ["y"], name="frob")]).SerializeToString()


@case("custom_domain_op", UNSUPPORTED, "com.example")
def _():
    m = model([helper.make_node("Gelu2", ["x"], ["y"], name="g2", domain="com.example")])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    return m.SerializeToString()


@case("missing_required_attribute", INVALID, "Concat", "axis")
def _():
    return model(
        [helper.make_node("Concat", ["x", "x"], ["y"], name="cat")], outputs=[vi("y", [2, 4])]
    ).SerializeToString()


@case("attribute_wrong_type", INVALID, "cat", "attribute 'axis' is a string, expected an int")
def _():
    return model(
        [helper.make_node("Concat", ["x", "x"], ["y"], name="cat", axis="zero")],
        outputs=[vi("y", [2, 4])],
    ).SerializeToString()


@case("too_few_inputs", INVALID, "add1")
def _():
    return model([helper.make_node("Add", ["x"], ["y"], name="add1")]).SerializeToString()


@case("if_missing_branch", INVALID, "if", "else_branch")
def _():
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [vi("t", [1, 4])])
    cond = helper.make_tensor("c", TensorProto.BOOL, [], [True])
    return model(
        [helper.make_node("If", ["c"], ["y"], name="if", then_branch=then)], inits=[cond]
    ).SerializeToString()


@case("if_branch_output_count", INVALID, "if")
def _():
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [vi("t", [1, 4])])
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"]), helper.make_node("Relu", ["x"], ["f"])],
        "else",
        [],
        [vi("e", [1, 4]), vi("f", [1, 4])],
    )
    cond = helper.make_tensor("c", TensorProto.BOOL, [], [True])
    node = helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)
    return model([node], inits=[cond]).SerializeToString()


@case("shape_mismatch", INVALID, "mm")
def _():
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 2], [0.0] * 6)
    return model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], inits=[w], outputs=[vi("y", [1, 2])]
    ).SerializeToString()


def main():
    only = set(sys.argv[1:])
    for name, (make, exit_status, errors) in CASES.items():
        if only and name not in only:
            continue
        with open(os.path.join(HERE, name + ".onnx"), "wb") as f:
            f.write(make())
        with open(os.path.join(HERE, name + ".expected"), "w") as f:
            f.write(f"exit {exit_status}\n")
            for e in errors:
                f.write(f"error {e}\n")
    print(f"wrote {len(CASES) if not only else len(only)} cases to {HERE}")


if __name__ == "__main__":
    main()
