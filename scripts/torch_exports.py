#!/usr/bin/env python3
"""The benchmark's PyTorch modules and how they are exported to ONNX: graphs as real exporters
write them (`torch.onnx.export` of torchvision, `torch.nn` and Hugging Face `transformers`
modules, seeded random weights, batch 1, static shapes).

Used by fixtures/make_benchmark_models.py (the full-size CPU benchmark exports) and
scripts/bench_gpu.py (the GPU benchmark), and on its own to write the small versions the
test fixtures use (fixtures/exported/):

    python3 scripts/torch_exports.py --tiny fixtures/exported

Needs torch (and torchvision, transformers for those models), onnx, numpy. On a machine where
PyTorch's own package index is unreachable, PyPI's `torch` wheel works (it also installs CUDA
libraries, unused here).

Models (MODELS): resnet50, mobilenet_v2, efficientnet_b0 (torchvision); encoder
(torch.nn.TransformerEncoder, BERT-base sizes: 12 layers, d=768, 12 heads, FFN 3072, GELU,
batch_first, sequence 128); bert (transformers BertModel base, no pooler, input_ids and
attention_mask); gpt2 (transformers GPT2LMHeadModel small, no KV cache, logits); llama_token
(transformers LlamaForCausalLM at GPT-2 small's sizes — 12 layers, d=768, 12 heads, FFN 3072,
vocabulary 32000 — on one token, no KV cache: every weight product is a
matrix-vector product, as when decoding a token, and a bias-free nn.Linear, which weight-only
quantizers turn into 4-bit MatMulNBits); xlnet (transformers XLNetModel at base sizes — 12
layers, d=768, 12 heads, FFN 3072, vocabulary 32000 — no memory: its projections and
relative-position attention are written with torch.einsum, which the exporter keeps as 96
Einsum nodes).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

MODELS = ["resnet50", "mobilenet_v2", "efficientnet_b0", "encoder", "bert", "gpt2", "llama_token", "xlnet"]
TRANSFORMERS = ("encoder", "bert", "gpt2", "xlnet")
SEQ = 128
# Tokens of the BERT input that are padding (attention_mask 0), as a batch padded to length
# SEQ has: the exported graph's mask path is exercised, not only its shapes.
BERT_PADDING = 28


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def make_module(name: str, tiny: bool = False):
    """The torch module (in eval mode) and its example inputs (a dict name -> CPU tensor), or
    None when a package it needs is missing. `tiny`: the same module class with small sizes
    (2 layers, width 64, sequence 16), for the structure of the exported graph without its
    weight."""
    import torch

    torch.manual_seed(0)
    d, layers, heads, ffn, seq = (64, 2, 4, 128, 16) if tiny else (768, 12, 12, 3072, SEQ)
    img = {"x": torch.randn(1, 3, 224, 224)}
    if name in ("resnet50", "mobilenet_v2", "efficientnet_b0"):
        try:
            import torchvision
        except ImportError:
            return None
        return getattr(torchvision.models, name)().eval(), img
    if name == "encoder":

        class Encoder(torch.nn.Module):
            """BERT-base-sized: 12 layers, d=768, 12 heads, GELU, batch_first, seq 128."""

            def __init__(self):
                super().__init__()
                layer = torch.nn.TransformerEncoderLayer(
                    d, heads, ffn, activation="gelu", batch_first=True, dropout=0.0
                )
                self.enc = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
                for p in self.enc.parameters():  # the 12 layers start as copies: make them differ
                    torch.nn.init.normal_(p, std=0.02)

            def forward(self, x):
                return self.enc(x)

        return Encoder().eval(), {"x": torch.randn(1, seq, d)}
    try:
        import transformers
    except ImportError:
        return None
    vocab = 1000 if tiny else 30000
    ids = torch.randint(0, vocab, (1, seq))
    if name == "bert":
        cfg = transformers.BertConfig()
        if tiny:
            cfg = transformers.BertConfig(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers,
                                          num_attention_heads=heads, intermediate_size=ffn)
        m = transformers.BertModel(cfg, add_pooling_layer=False)
        mask = torch.ones(1, seq, dtype=torch.int64)
        mask[0, seq - (4 if tiny else BERT_PADDING):] = 0
        return m.eval(), {"input_ids": ids, "attention_mask": mask}
    if name == "gpt2":
        cfg = transformers.GPT2Config(use_cache=False)
        if tiny:
            cfg = transformers.GPT2Config(use_cache=False, vocab_size=vocab, n_embd=d, n_layer=layers,
                                          n_head=heads, n_positions=64)
        return transformers.GPT2LMHeadModel(cfg).eval(), {"input_ids": ids}
    if name == "llama_token":
        cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=d, intermediate_size=ffn,
                                       num_hidden_layers=layers, num_attention_heads=heads,
                                       num_key_value_heads=heads, use_cache=False)
        return transformers.LlamaForCausalLM(cfg).eval(), {"input_ids": ids[:, :1] % 32000}
    if name == "xlnet":
        cfg = transformers.XLNetConfig(vocab_size=vocab if tiny else 32000, d_model=d, n_layer=layers,
                                       n_head=heads, d_inner=ffn, use_mems_eval=False)
        return transformers.XLNetModel(cfg).eval(), {"input_ids": ids}
    raise ValueError(name)


class First(object):
    """Calls a module with keyword inputs and returns its first output as a tensor."""

    def __init__(self, module):
        self.module = module

    def __call__(self, **kw):
        y = self.module(**kw)
        if isinstance(y, (tuple, list)):
            return y[0]
        if hasattr(y, "to_tuple"):
            return y.to_tuple()[0]
        return y


def export(name: str, module, inputs: dict, path: str, dynamic_batch: bool = False) -> None:
    """`torch.onnx.export` of the module's first output (named `y`), with the TorchScript
    exporter at opset 17 where it handles the model, else the dynamo exporter at opset 18.
    `dynamic_batch`: axis 0 of every input and of `y` is the symbolic dimension `batch`."""
    import torch

    names = list(inputs)

    class Positional(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = module

        def forward(self, *args):
            return First(self.m)(**dict(zip(names, args)))

    args = tuple(inputs.values())
    if dynamic_batch:
        # torch.export specializes a dim whose example size is 1: trace a batch of 2.
        args = tuple(torch.cat([a, a]) for a in args)
    axes = {n: {0: "batch"} for n in names + ["y"]} if dynamic_batch else None
    try:
        torch.onnx.export(Positional().eval(), args, path, input_names=names, output_names=["y"],
                          opset_version=17, dynamo=False, dynamic_axes=axes)
    except Exception as e:  # a torch without the TorchScript exporter, or an op it lacks
        log(f"{name}: TorchScript export failed ({str(e)[:160]}); using the dynamo exporter")
        batch = torch.export.Dim("batch", max=1024)
        shapes = {"args": tuple({0: batch} for _ in names)} if dynamic_batch else None
        torch.onnx.export(Positional().eval(), args, path, input_names=names, output_names=["y"],
                          opset_version=18, dynamo=True, external_data=False, dynamic_shapes=shapes)


def export_with_data(name: str, path: str, tiny: bool = False,
                     dynamic_batch: bool = False) -> tuple[dict, np.ndarray] | None:
    """Exports model `name` to `path`; returns its inputs (numpy) and torch's output, or None
    when a package it needs is missing."""
    import torch

    made = make_module(name, tiny=tiny)
    if made is None:
        return None
    module, inputs = made
    with torch.no_grad():
        export(name, module, inputs, path, dynamic_batch=dynamic_batch)
        y = First(module)(**inputs).float().numpy()
    return {k: v.numpy() for k, v in inputs.items()}, y


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", metavar="DIR", required=True,
                   help="export the small transformer models (encoder, bert, gpt2, xlnet) to DIR")
    p.add_argument("--models", nargs="+", default=list(TRANSFORMERS), choices=TRANSFORMERS)
    p.add_argument("--dynamic-batch", action="store_true",
                   help="export axis 0 of the inputs and the output as the symbolic dimension "
                        "'batch' (files named *_dynamic_batch.onnx)")
    args = p.parse_args()
    os.makedirs(args.tiny, exist_ok=True)
    names = {"encoder": "torch_transformer_encoder", "bert": "hf_bert", "gpt2": "hf_gpt2", "xlnet": "hf_xlnet"}
    suffix = "_dynamic_batch" if args.dynamic_batch else ""
    for name in args.models:
        out = export_with_data(name, os.path.join(args.tiny, names[name] + suffix + ".onnx"), tiny=True,
                               dynamic_batch=args.dynamic_batch)
        log(f"{name}: {'skipped (a package is missing)' if out is None else 'exported'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
