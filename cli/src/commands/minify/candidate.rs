//! Reduced models: a subset of the original graph's nodes, with every value the subset reads but
//! does not produce turned into a graph input (or kept as an initializer), and every value it
//! produces but does not read, plus the original outputs it still produces, as graph outputs.
//! Each candidate is a plain ONNX model any tool can open.

use anyhow::{bail, Context, Result};
use kiln_frontend::onnx::import::node_reads;
use kiln_frontend::onnx::proto::{
    DimValue, Dimension, ModelProto, NodeProto, TensorProto, TensorShapeProto, TypeProto, TypeTensor,
    TypeValue, ValueInfoProto,
};
use kiln_frontend::onnx::tensor::{
    dtype_from_onnx, dtype_to_onnx, tensor_from_proto, tensor_to_proto, tensor_type_from_proto, ExternalData,
};
use kiln_frontend::ImportOptions;
use kiln_ir::{Dim, Tensor, TensorType};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::Path;

/// What becomes of an initializer when shrinking constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Shrink {
    /// Dropped from the file; the model reads it as a graph input of the same type.
    Input,
    Zeros,
    Ones,
}

/// The original model, prepared once: external data and `--weights` inlined, `--input-shape`
/// bindings written into the input types, nodes in dependency order.
pub struct Base {
    model: ModelProto,
    nodes: Vec<NodeProto>,
    /// Per node, the names it reads (inputs and subgraph captures), without empty names.
    reads: Vec<Vec<String>>,
    initializers: HashMap<String, TensorProto>,
    /// Graph inputs that are not initializers, in model order.
    inputs: Vec<String>,
    outputs: Vec<String>,
    types: HashMap<String, TensorType>,
}

impl Base {
    pub fn load(path: &Path, opts: &ImportOptions) -> Result<Base> {
        let mut model = kiln_frontend::onnx::read_model_proto(path)?;
        let base_dir = kiln_frontend::files::model_folder(path);
        // kiln's own type inference, with the user's shape bindings and weights, types the
        // values that become inputs of a reduced model; declared value infos fill gaps (values
        // downstream of a node kiln cannot import).
        let mut types = kiln_frontend::onnx::value_types(&model, base_dir.clone(), opts)
            .with_context(|| path.display().to_string())?;
        let mut g = model.graph.take().context("the model has no graph")?;
        for vi in g.value_info.iter().chain(&g.input).chain(&g.output) {
            if let Ok(Some(t)) = tensor_type_from_proto(&vi.name, vi.r#type.as_ref()) {
                types.entry(vi.name.clone()).or_insert(t);
            }
        }

        let mut ext = ExternalData::new(base_dir);
        let mut initializers = HashMap::new();
        for init in &g.initializer {
            let t = if init.data_location == 1 {
                // Inlined so that reduced models, written elsewhere, stand alone.
                let t = tensor_from_proto(init, Some(&mut ext))?;
                tensor_to_proto(&init.name, &t)
            } else {
                init.clone()
            };
            initializers.insert(init.name.clone(), t);
        }
        for (name, w) in &opts.weights {
            initializers.insert(name.clone(), tensor_to_proto(name, w));
        }
        let inputs: Vec<String> = g
            .input
            .iter()
            .map(|vi| vi.name.clone())
            .filter(|n| !initializers.contains_key(n))
            .collect();
        let outputs = g.output.iter().map(|vi| vi.name.clone()).collect();
        let order = topo_order(&g.node)?;
        let nodes: Vec<NodeProto> = order.into_iter().map(|i| g.node[i].clone()).collect();
        let reads = nodes
            .iter()
            .map(|n| node_reads(n).into_iter().filter(|s| !s.is_empty()).collect())
            .collect();
        g.node.clear();
        g.initializer.clear();
        g.input.clear();
        g.output.clear();
        g.value_info.clear();
        g.doc_string.clear();
        model.graph = Some(g);
        model.metadata_props.clear();
        model.functions.clear();
        model.doc_string.clear();
        Ok(Base {
            model,
            nodes,
            reads,
            initializers,
            inputs,
            outputs,
            types,
        })
    }

    pub fn num_nodes(&self) -> usize {
        self.nodes.len()
    }

    pub fn node(&self, i: usize) -> &NodeProto {
        &self.nodes[i]
    }

    /// Elements of an initializer, from its declared dims.
    pub fn initializer_len(&self, name: &str) -> Option<u64> {
        let t = self.initializers.get(name)?;
        Some(t.dims.iter().map(|&d| d.max(0) as u64).product())
    }

    /// Initializers the nodes `keep` read, largest first.
    pub fn initializers_read(&self, keep: &[usize]) -> Vec<String> {
        let mut names: Vec<String> = keep
            .iter()
            .flat_map(|&i| self.reads[i].iter())
            .filter(|n| self.initializers.contains_key(*n))
            .cloned()
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        names.sort_by_key(|n| (std::cmp::Reverse(self.initializer_len(n).unwrap_or(0)), n.clone()));
        names
    }

    /// The model of nodes `keep` (indices in dependency order) with initializers changed as
    /// `shrink` says; `None` when it cannot be a valid model (no outputs, an input kiln cannot
    /// type, a constant that cannot be rebuilt).
    pub fn build(&self, keep: &[usize], shrink: &BTreeMap<String, Shrink>) -> Option<ModelProto> {
        let produced: HashSet<&str> = keep
            .iter()
            .flat_map(|&i| self.nodes[i].output.iter())
            .filter(|s| !s.is_empty())
            .map(String::as_str)
            .collect();
        let mut read_order: Vec<&str> = vec![];
        let mut read: HashSet<&str> = HashSet::new();
        for &i in keep {
            for r in &self.reads[i] {
                if read.insert(r.as_str()) {
                    read_order.push(r.as_str());
                }
            }
        }
        let mut g = self.model.graph.clone().unwrap_or_default();
        g.node = keep.iter().map(|&i| self.nodes[i].clone()).collect();

        let mut new_inputs = vec![];
        for &name in &read_order {
            if produced.contains(name) {
                continue;
            }
            if let Some(init) = self.initializers.get(name) {
                match shrink.get(name) {
                    None => g.initializer.push(init.clone()),
                    Some(Shrink::Input) => new_inputs.push(self.value_info(name, true)?),
                    Some(&s) => g.initializer.push(filled(init, s)?),
                }
            } else if !self.inputs.iter().any(|n| n == name) {
                new_inputs.push(self.value_info(name, true)?);
            }
        }
        // The model's own inputs first, in its order: a reduced model reads like the original.
        for name in &self.inputs {
            if read.contains(name.as_str()) && !produced.contains(name.as_str()) {
                g.input.push(self.value_info(name, true)?);
            }
        }
        g.input.extend(new_inputs);

        let mut outputs: Vec<&str> = self
            .outputs
            .iter()
            .map(String::as_str)
            .filter(|o| produced.contains(o))
            .collect();
        for &i in keep {
            for o in &self.nodes[i].output {
                if !o.is_empty() && !read.contains(o.as_str()) && !outputs.contains(&o.as_str()) {
                    outputs.push(o);
                }
            }
        }
        if outputs.is_empty() {
            return None;
        }
        g.output = outputs
            .into_iter()
            .map(|o| self.value_info(o, false))
            .collect::<Option<_>>()?;
        let mut m = self.model.clone();
        m.graph = Some(g);
        Some(m)
    }

    /// A value info with the value's type; for an input the type is required.
    fn value_info(&self, name: &str, required: bool) -> Option<ValueInfoProto> {
        let ty = match self.types.get(name) {
            Some(t) => Some(type_proto(t)),
            None if required => return None,
            None => None,
        };
        Some(ValueInfoProto {
            name: name.to_string(),
            r#type: ty,
            doc_string: String::new(),
        })
    }
}

fn type_proto(t: &TensorType) -> TypeProto {
    let dim = t
        .shape
        .iter()
        .map(|d| Dimension {
            value: match d {
                Dim::Fixed(n) => Some(DimValue::DimValue(*n as i64)),
                Dim::Sym(s) if s == "?" => None,
                Dim::Sym(s) => Some(DimValue::DimParam(s.clone())),
            },
            denotation: String::new(),
        })
        .collect();
    TypeProto {
        value: Some(TypeValue::TensorType(TypeTensor {
            elem_type: dtype_to_onnx(t.dtype),
            shape: Some(TensorShapeProto { dim }),
        })),
        denotation: String::new(),
    }
}

/// An initializer of the same name, dtype and shape, filled with zeros or ones.
fn filled(init: &TensorProto, s: Shrink) -> Option<TensorProto> {
    let dtype = dtype_from_onnx(init.data_type).ok()?;
    let dims: Vec<usize> = init
        .dims
        .iter()
        .map(|&d| usize::try_from(d).ok())
        .collect::<Option<_>>()?;
    let n: usize = dims.iter().product();
    let value = if s == Shrink::Ones { 1.0 } else { 0.0 };
    let data = kiln_ir::tensor::TensorData::from_f64s(dtype, std::iter::repeat_n(value, n));
    let t = Tensor::new(dims, data).ok()?;
    Some(tensor_to_proto(&init.name, &t))
}

/// Node indices in dependency order, model order where it already is one.
fn topo_order(nodes: &[NodeProto]) -> Result<Vec<usize>> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            producer.insert(o, i);
        }
    }
    let mut indegree = vec![0usize; nodes.len()];
    let mut users: Vec<Vec<usize>> = vec![vec![]; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        let deps: HashSet<usize> = node_reads(n)
            .iter()
            .filter_map(|r| producer.get(r.as_str()).copied())
            .filter(|&p| p != i)
            .collect();
        for p in deps {
            users[p].push(i);
            indegree[i] += 1;
        }
    }
    let mut ready: VecDeque<usize> = (0..nodes.len()).filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(i) = ready.pop_front() {
        order.push(i);
        for &u in &users[i] {
            indegree[u] -= 1;
            if indegree[u] == 0 {
                ready.push_back(u);
            }
        }
    }
    if order.len() < nodes.len() {
        bail!("the graph has a cycle");
    }
    Ok(order)
}
