//! The geometry of a product node, derived once from the node and read by both the CPU GEMM
//! kernel (`gen::gemm`, `gen::conv`) and the GPU one (`nvptx::kernels::gemm`): the matrix
//! product of a MatMul or Gemm (M, N, K, operand strides, broadcast batch axes), and a 2-D
//! convolution's extents and resolved window.

use crate::error::Result;
use crate::node::NodeInfo;
use kiln_ir::{AutoPad, ConvAttrs};

/// Where element (row, column) of a matrix lies: `row * rs + column * cs` elements from the
/// start of its batch entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatrixStrides {
    pub rs: usize,
    pub cs: usize,
}

/// The matrix product of a MatMul or Gemm node: `C[M, N] = op(A)[M, K] · op(B)[K, N]` for
/// every entry of the batch axes, A and B row-major in their inputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Product {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Element (i, kk) of op(A) and element (kk, j) of op(B) (Gemm's transposes applied).
    pub a: MatrixStrides,
    pub b: MatrixStrides,
    /// The batch axes of A and B, padded with leading 1s to the output's batch rank, and of
    /// the output (numpy broadcasting); empty for a Gemm or a product of matrices.
    pub batch_a: Vec<usize>,
    pub batch_b: Vec<usize>,
    pub batch_out: Vec<usize>,
}

/// One batch axis of a product: its extent and how many matrices a step along it skips in
/// A, B and the output (0 where that operand is broadcast along it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchAxis {
    pub extent: usize,
    pub a: usize,
    pub b: usize,
    pub out: usize,
}

impl Product {
    /// A MatMul (numpy semantics: a 1-D operand is a row or column, batch axes broadcast).
    /// None when an operand is a scalar; an error when the inner dimensions differ.
    pub fn matmul(node: &NodeInfo) -> Result<Option<Product>> {
        let sa = node.input_shape(0)?;
        let sb = node.input_shape(1)?;
        if sa.is_empty() || sb.is_empty() {
            return Ok(None);
        }
        let (ra, rb) = (sa.len(), sb.len());
        let m = if ra >= 2 { sa[ra - 2] } else { 1 };
        let k = sa[ra - 1];
        let n = if rb >= 2 { sb[rb - 1] } else { 1 };
        let kb = if rb >= 2 { sb[rb - 2] } else { sb[0] };
        if k != kb {
            return Err(node.unsupported("inner dimensions differ"));
        }
        let ba: Vec<usize> = if ra > 2 { sa[..ra - 2].to_vec() } else { vec![] };
        let bb: Vec<usize> = if rb > 2 { sb[..rb - 2].to_vec() } else { vec![] };
        let nd = ba.len().max(bb.len());
        let pad = |v: &[usize]| -> Vec<usize> {
            let mut r = vec![1; nd - v.len()];
            r.extend_from_slice(v);
            r
        };
        let (batch_a, batch_b) = (pad(&ba), pad(&bb));
        let batch_out = (0..nd).map(|i| batch_a[i].max(batch_b[i])).collect();
        Ok(Some(Product {
            m,
            n,
            k,
            a: MatrixStrides { rs: k, cs: 1 },
            b: MatrixStrides { rs: n, cs: 1 },
            batch_a,
            batch_b,
            batch_out,
        }))
    }

    /// A Gemm's `op(A) · op(B)` (C and the scale factors are the epilogue's). None unless
    /// both operands are matrices; an error when the inner dimensions differ.
    pub fn gemm(node: &NodeInfo, trans_a: bool, trans_b: bool) -> Result<Option<Product>> {
        let sa = node.input_shape(0)?;
        let sb = node.input_shape(1)?;
        if sa.len() != 2 || sb.len() != 2 {
            return Ok(None);
        }
        let (m, k) = if trans_a { (sa[1], sa[0]) } else { (sa[0], sa[1]) };
        let (kb, n) = if trans_b { (sb[1], sb[0]) } else { (sb[0], sb[1]) };
        if k != kb {
            return Err(node.unsupported("inner dimensions differ"));
        }
        Ok(Some(Product {
            m,
            n,
            k,
            a: if trans_a {
                MatrixStrides { rs: 1, cs: m }
            } else {
                MatrixStrides { rs: k, cs: 1 }
            },
            b: if trans_b {
                MatrixStrides { rs: 1, cs: k }
            } else {
                MatrixStrides { rs: n, cs: 1 }
            },
            batch_a: vec![],
            batch_b: vec![],
            batch_out: vec![],
        }))
    }

    /// The same product as one matrix product when that computes the same thing: B is one
    /// matrix for every batch entry and A's matrices lie one after another row-major, so row
    /// `i` of A's batch entry `b` is row `b·M + i` of a single `(batch·M)×K` matrix, and the
    /// output's rows follow in the same order. An exporter's `[seq, 1, d] · [d, n]` then runs
    /// as one GEMM with `seq` rows instead of `seq` matrix-vector products. The caller checks
    /// that its epilogue does not tell the rows of one entry apart
    /// (`Epilogue::allows_batch_folding`).
    pub fn with_batch_in_rows(self) -> Product {
        let a_row_major = self.a == MatrixStrides { rs: self.k, cs: 1 };
        if self.batch_a.is_empty() || self.b_matrices() != 1 || !a_row_major {
            return self;
        }
        Product {
            m: self.a_matrices() * self.m,
            batch_a: vec![],
            batch_b: vec![],
            batch_out: vec![],
            ..self
        }
    }

    /// The matrices A's input holds (the product of its batch extents).
    pub fn a_matrices(&self) -> usize {
        self.batch_a.iter().product()
    }

    /// The matrices B's input holds.
    pub fn b_matrices(&self) -> usize {
        self.batch_b.iter().product()
    }

    /// The batch axes, outermost first, with their steps in matrices.
    pub fn batch_axes(&self) -> Vec<BatchAxis> {
        let (sa, sb, so) = (
            row_major_strides(&self.batch_a),
            row_major_strides(&self.batch_b),
            row_major_strides(&self.batch_out),
        );
        (0..self.batch_out.len())
            .map(|i| BatchAxis {
                extent: self.batch_out[i],
                a: if self.batch_a[i] == 1 { 0 } else { sa[i] },
                b: if self.batch_b[i] == 1 { 0 } else { sb[i] },
                out: so[i],
            })
            .collect()
    }
}

/// The row-major strides (in elements) of a tensor of `shape`.
pub fn row_major_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// A 2-D convolution window resolved against its input (pads from `auto_pad`) and checked
/// against the output extents. `c` is the input channels the kernel walks with it: a group's
/// channels for the GEMM kernels' im2col, all of them for the depthwise kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvWindow {
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub kh: usize,
    pub kw: usize,
    pub sh: usize,
    pub sw: usize,
    pub dh: usize,
    pub dw: usize,
    pub ph: usize,
    pub pw: usize,
    pub oh: usize,
    pub ow: usize,
}

impl ConvWindow {
    /// The window of `attrs` over a `c`×`h`×`w` input with a `kh`×`kw` kernel; None unless
    /// it produces `oh`×`ow`.
    #[allow(clippy::too_many_arguments)]
    pub fn resolve(
        a: &ConvAttrs,
        c: usize,
        h: usize,
        w: usize,
        kh: usize,
        kw: usize,
        oh: usize,
        ow: usize,
    ) -> Option<ConvWindow> {
        if !a.kernel_shape.is_empty() && a.kernel_shape != [kh, kw] {
            return None;
        }
        let get = |v: &Vec<usize>, i: usize| if v.is_empty() { 1 } else { v[i] };
        let (sh, sw) = (get(&a.strides, 0), get(&a.strides, 1));
        let (dh, dw) = (get(&a.dilations, 0), get(&a.dilations, 1));
        if sh == 0 || sw == 0 || dh == 0 || dw == 0 || kh == 0 || kw == 0 {
            return None;
        }
        let axis = |input: usize, k: usize, s: usize, d: usize, i: usize| -> Option<(usize, usize)> {
            let ext = (k - 1) * d + 1;
            let (pb, pe) = match a.auto_pad {
                AutoPad::NotSet if a.pads.is_empty() => (0, 0),
                AutoPad::NotSet => (*a.pads.get(i)?, *a.pads.get(i + 2)?),
                AutoPad::Valid => (0, 0),
                AutoPad::SameUpper | AutoPad::SameLower => {
                    let out = input.div_ceil(s);
                    let total = ((out.max(1) - 1) * s + ext).saturating_sub(input);
                    let b = if a.auto_pad == AutoPad::SameUpper {
                        total / 2
                    } else {
                        total.div_ceil(2)
                    };
                    return Some((b, out));
                }
            };
            let padded = input + pb + pe;
            if padded < ext {
                return None;
            }
            Some((pb, (padded - ext) / s + 1))
        };
        let (ph, o_h) = axis(h, kh, sh, dh, 0)?;
        let (pw, o_w) = axis(w, kw, sw, dw, 1)?;
        if o_h != oh || o_w != ow {
            return None;
        }
        Some(ConvWindow {
            c,
            h,
            w,
            kh,
            kw,
            sh,
            sw,
            dh,
            dw,
            ph,
            pw,
            oh,
            ow,
        })
    }
}

/// A 2-D convolution's extents as its tensors give them, in either layout: X `[N, C, H, W]`
/// (channels-last `[N, H, W, C]`), W `[M, C/group, KH, KW]`, Y `[N, M, OH, OW]`
/// (`[N, OH, OW, M]`). Which combinations a kernel takes is the kernel's to check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvShape {
    pub batch: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    /// W's extents: output channels, the input channels each one reads, the kernel window.
    pub m: usize,
    pub cg: usize,
    pub kh: usize,
    pub kw: usize,
    /// Y's batch and channel extents (which should be `batch` and `m`) and its spatial ones.
    pub y_batch: usize,
    pub y_channels: usize,
    pub oh: usize,
    pub ow: usize,
    pub groups: usize,
    /// A 1-D convolution (X `[N, C, L]`) seen as a 2-D one of height 1: [`Self::window`] lifts
    /// its attributes to match.
    pub one_d: bool,
}

impl ConvShape {
    /// The extents of a Conv node; None unless X, W and Y are 4-D, or 3-D in the NCHW layout
    /// (a 1-D convolution: height 1, so every 2-D kernel computes it).
    pub fn of(node: &NodeInfo, attrs: &ConvAttrs) -> Result<Option<ConvShape>> {
        let xs = node.input_shape(0)?;
        let ws = node.input_shape(1)?;
        let ys = node.output_shape(0)?;
        if xs.len() == 3 && ws.len() == 3 && ys.len() == 3 && !attrs.channels_last {
            return Ok(Some(ConvShape {
                batch: xs[0],
                c: xs[1],
                h: 1,
                w: xs[2],
                m: ws[0],
                cg: ws[1],
                kh: 1,
                kw: ws[2],
                y_batch: ys[0],
                y_channels: ys[1],
                oh: 1,
                ow: ys[2],
                groups: attrs.group.max(1),
                one_d: true,
            }));
        }
        if xs.len() != 4 || ws.len() != 4 || ys.len() != 4 {
            return Ok(None);
        }
        let ((batch, c, h, w), (y_batch, y_channels, oh, ow)) = if attrs.channels_last {
            ((xs[0], xs[3], xs[1], xs[2]), (ys[0], ys[3], ys[1], ys[2]))
        } else {
            ((xs[0], xs[1], xs[2], xs[3]), (ys[0], ys[1], ys[2], ys[3]))
        };
        Ok(Some(ConvShape {
            batch,
            c,
            h,
            w,
            m: ws[0],
            cg: ws[1],
            kh: ws[2],
            kw: ws[3],
            y_batch,
            y_channels,
            oh,
            ow,
            groups: attrs.group.max(1),
            one_d: false,
        }))
    }

    /// Whether each input channel is a group of its own with one output channel: a depthwise
    /// convolution, whose kernels (CPU `gen::dwconv` and `gen::conv_nhwc`, GPU
    /// `nvptx::kernels::gemm::dwconv`) walk the window over all `c` channels of `batch` images.
    pub fn is_depthwise(&self) -> bool {
        self.groups > 1 && self.groups == self.c && self.groups == self.m && self.cg == 1
    }

    /// The window of `attrs` over `c` of the input channels (see [`ConvWindow`]), None unless
    /// it produces the output's extents.
    pub fn window(&self, attrs: &ConvAttrs, c: usize) -> Option<ConvWindow> {
        let lifted;
        let attrs = if self.one_d {
            lifted = lift_1d(attrs)?;
            &lifted
        } else {
            attrs
        };
        ConvWindow::resolve(attrs, c, self.h, self.w, self.kh, self.kw, self.oh, self.ow)
    }
}

/// A 1-D convolution's attributes for the same convolution over a height of 1: a leading
/// axis of extent, stride and dilation 1 and no padding. None when they are not 1-D.
fn lift_1d(a: &ConvAttrs) -> Option<ConvAttrs> {
    let one = |v: &Vec<usize>| match v.as_slice() {
        [] => Some(vec![]),
        [x] => Some(vec![1, *x]),
        _ => None,
    };
    let pads = match a.pads.as_slice() {
        [] => vec![],
        [b, e] => vec![0, *b, 0, *e],
        _ => return None,
    };
    Some(ConvAttrs {
        kernel_shape: one(&a.kernel_shape)?,
        strides: one(&a.strides)?,
        dilations: one(&a.dilations)?,
        pads,
        ..a.clone()
    })
}
