//! The text form of a graph, for golden tests, `--print-after` and debugging.
//!
//! ```text
//! graph tiny(%x: f32[1,4]) {
//!   %w = Constant #0 : f32[4,2]
//!   %y = MatMul(%x, %w) : f32[1,2]
//!   return %y
//! }
//! ```

use crate::{Graph, Op, ValueId};
use std::fmt::{self, Write};

pub(crate) fn write_graph(g: &Graph, f: &mut fmt::Formatter<'_>, indent: usize) -> fmt::Result {
    let pad = "  ".repeat(indent);
    let name = |v: ValueId| value_label(g, v);
    write!(f, "graph {}(", g.name)?;
    for (i, &id) in g.inputs().iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        let v = id.out(0);
        write!(f, "{}: {}", name(v), g.value_type(v))?;
    }
    writeln!(f, ") {{")?;
    for id in g.node_ids() {
        let node = g.node(id);
        if node.op == Op::Input {
            continue;
        }
        write!(f, "{pad}  ")?;
        let outs: Vec<String> = (0..node.outputs.len() as u32).map(|i| name(id.out(i))).collect();
        write!(f, "{} = ", outs.join(", "))?;
        match &node.op {
            Op::Constant(c) => write!(f, "Constant #{}", c.0)?,
            op => {
                f.write_str(&op_label(op))?;
                let args: Vec<String> = node
                    .inputs
                    .iter()
                    .map(|v| v.map(name).unwrap_or_else(|| "_".into()))
                    .collect();
                write!(f, "({})", args.join(", "))?;
            }
        }
        let types: Vec<String> = node.outputs.iter().map(|o| o.ty.to_string()).collect();
        writeln!(f, " : {}", types.join(", "))?;
        for sub in node.op.subgraphs() {
            write!(f, "{pad}    ")?;
            write_graph(sub, f, indent + 2)?;
        }
    }
    let outs: Vec<String> = g.outputs().iter().map(|o| name(o.value)).collect();
    writeln!(f, "{pad}  return {}", outs.join(", "))?;
    writeln!(f, "{pad}}}")
}

/// `%name`, or `%nN.i` for an unnamed value.
fn value_label(g: &Graph, v: ValueId) -> String {
    let n = g.value_name(v);
    if n.is_empty() {
        format!("%n{}.{}", v.node.0, v.output)
    } else {
        format!("%{n}")
    }
}

/// The operator with its attributes: `Conv{strides: [2, 2], ...}`. Attribute-free operators
/// print their name only.
pub fn op_label(op: &Op) -> String {
    let debug = match op {
        Op::If { .. } => return "If".into(),
        Op::Loop { num_carried, .. } => return format!("Loop{{num_carried: {num_carried}}}"),
        Op::Unary(u) => format!("{u:?}"),
        Op::Binary(b) => format!("{b:?}"),
        Op::Conv(a) | Op::Quant(crate::QuantOp::ConvInteger(a) | crate::QuantOp::QLinearConv(a)) => {
            format!("Conv{a:?}")
        }
        Op::ConvTranspose(a) => format!("ConvTranspose{a:?}"),
        Op::Pool(a) => format!("Pool{a:?}"),
        Op::Resize(a) => format!("Resize{a:?}"),
        Op::Rnn(a) => format!("Rnn{a:?}"),
        Op::Attention(a) => format!("Attention{a:?}"),
        other => format!("{other:?}"),
    };
    // Debug gives `Name { a: 1 }` or `Name(Struct { a: 1 })`; keep `Name{a: 1}`.
    let mut out = String::with_capacity(debug.len());
    let name = op.name();
    let attrs = match debug.find(['{', '(']) {
        Some(i) => debug[i..].trim().to_string(),
        None => String::new(),
    };
    out.push_str(name);
    if !attrs.is_empty() {
        let attrs = attrs
            .trim_start_matches('(')
            .trim_end_matches(')')
            .trim_start_matches(|c: char| c.is_alphanumeric())
            .trim();
        let _ = write!(out, "{}", attrs.replace("{ ", "{").replace(" }", "}"));
    }
    // The channels-first default is the ONNX layout: only the channels-last form is spelled out.
    out.replace(", channels_last: false", "")
}
