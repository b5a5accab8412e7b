#!/usr/bin/env python3
"""Export Hugging Face architectures beyond the benchmark set, at their published base sizes
with seeded random weights, into scripts/bench.py's layout, to look for graphs kiln compiles
slowly or not at all:

    python scripts/hf_sweep.py DIR [MODEL ...]          # a Python with torch and transformers
    python3 scripts/bench.py --models-dir DIR --runs 5 --rounds 2

MODEL (default: all): deberta_v3 (the DeBERTa-v2 config's defaults: 1536 wide, 24 layers, 2.9
GiB), deberta_v3_base (the same attention at 768 wide, 12 layers), t5_encoder
(t5-small), vit (ViT-base, 224), swin (Swin-tiny), distilbert, convnext (ConvNeXt-tiny),
wav2vec2 (base, 1 s of audio), whisper_enc (Whisper-base encoder, 30 s of mel frames),
clip_text (77 tokens). Text models get 128 tokens, the last 28 masked. Each export is
`torch.onnx.export` as scripts/torch_exports.py does it; expected outputs are torch's own.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_exports  # noqa: E402

MODELS = ["deberta_v3", "deberta_v3_base", "t5_encoder", "vit", "swin", "distilbert", "convnext", "wav2vec2",
          "whisper_enc", "clip_text"]


def make(name: str):
    """The module and its example inputs."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    seq = 128
    ids = torch.randint(0, 30000, (1, seq))
    mask = torch.ones(1, seq, dtype=torch.int64)
    mask[0, -28:] = 0
    text = {"input_ids": ids, "attention_mask": mask}
    image = {"pixel_values": torch.randn(1, 3, 224, 224)}
    if name in ("deberta_v3", "deberta_v3_base"):
        base = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
        cfg = T.DebertaV2Config(vocab_size=30000, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                position_buckets=256, max_relative_positions=-1,
                                norm_rel_ebd="layer_norm", share_att_key=True,
                                **(base if name == "deberta_v3_base" else {}))
        return T.DebertaV2Model(cfg), text
    if name == "t5_encoder":
        return T.T5EncoderModel(T.T5Config(vocab_size=32128)), text
    if name == "vit":
        return T.ViTModel(T.ViTConfig(), add_pooling_layer=False), image
    if name == "swin":
        return T.SwinModel(T.SwinConfig()), image
    if name == "distilbert":
        return T.DistilBertModel(T.DistilBertConfig()), text
    if name == "convnext":
        return T.ConvNextModel(T.ConvNextConfig()), image
    if name == "wav2vec2":
        return T.Wav2Vec2Model(T.Wav2Vec2Config()), {"input_values": torch.randn(1, 16000)}
    if name == "whisper_enc":
        cfg = T.WhisperConfig(d_model=512, encoder_layers=6, encoder_attention_heads=8, decoder_layers=6,
                              decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048)
        return T.WhisperModel(cfg).get_encoder(), {"input_features": torch.randn(1, 80, 3000)}
    if name == "clip_text":
        return T.CLIPTextModel(T.CLIPTextConfig()), {"input_ids": ids[:, :77]}
    raise ValueError(name)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        print(__doc__)
        return 2
    out, names = sys.argv[1], sys.argv[2:] or MODELS
    import torch

    os.makedirs(out, exist_ok=True)
    manifest_path = os.path.join(out, "manifest.json")
    manifest = json.load(open(manifest_path)) if os.path.exists(manifest_path) else []
    manifest = [e for e in manifest if e["name"] not in names]
    for name in names:
        module, inputs = make(name)
        module.eval()
        d = os.path.join(out, name)
        os.makedirs(os.path.join(d, "inputs"), exist_ok=True)
        os.makedirs(os.path.join(d, "expected"), exist_ok=True)
        with torch.no_grad():
            torch_exports.export(name, module, inputs, os.path.join(d, "model.onnx"))
            y = torch_exports.First(module)(**inputs).float().numpy()
        entry = {"name": name, "model": f"{name}/model.onnx", "inputs": {},
                 "outputs": {"y": f"{name}/expected/y.npy"}, "family": "benchmark", "opset": 17,
                 "description": f"Hugging Face {name} as torch.onnx.export writes it, random weights"}
        for k, v in inputs.items():
            np.save(os.path.join(d, "inputs", k + ".npy"), v.numpy())
            entry["inputs"][k] = f"{name}/inputs/{k}.npy"
        np.save(os.path.join(d, "expected", "y.npy"), y)
        manifest.append(entry)
        print(f"{name}: exported", flush=True)
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
