#!/usr/bin/env python3
"""Trains the bundled language-model example: a character-level GPT (2 layers,
96 features, 4 heads, 64 characters of context) on the licence texts Debian
ships in /usr/share/common-licenses, and writes beside this script:

  charlm.onnx                 opset 17, inputs input_ids [batch, sequence] and
                              past_key_values.<layer>.key/value [batch, 4, past, 24],
                              outputs logits [batch, sequence, vocabulary] and
                              present.<layer>.key/value (the decoder form exporters write)
  calibration/<n>/*.npy       16 training sequences, empty past
  evaluation/<n>/*.npy        32 held-out sequences, empty past
  evaluation_labels.npy       their next characters [32, 64] (int64)

Usage: train.py OUTPUT_DIR
"""
import os
import sys

import numpy as np
import torch
import torch.nn as nn

CONTEXT, FEATURES, HEADS, LAYERS, HIDDEN = 64, 96, 4, 2, 288
HEAD = FEATURES // HEADS


def corpus():
    root = "/usr/share/common-licenses"
    text = ""
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                text += f.read()
    return text


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(FEATURES), nn.LayerNorm(FEATURES)
        self.qkv, self.proj = nn.Linear(FEATURES, 3 * FEATURES), nn.Linear(FEATURES, FEATURES)
        self.up, self.down = nn.Linear(FEATURES, HIDDEN), nn.Linear(HIDDEN, FEATURES)

    def forward(self, x, past_k, past_v):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(FEATURES, dim=2)
        q, k, v = (z.view(b, t, HEADS, HEAD).transpose(1, 2) for z in (q, k, v))
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        past = k.shape[2] - t
        scores = q @ k.transpose(2, 3) / HEAD**0.5
        rows = torch.arange(t).unsqueeze(1) + past
        cols = torch.arange(k.shape[2]).unsqueeze(0)
        scores = scores.masked_fill(cols > rows, float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, FEATURES)
        x = x + self.proj(y)
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x)))), k, v


class CharLM(nn.Module):
    def __init__(self, vocabulary):
        super().__init__()
        self.embed, self.position = nn.Embedding(vocabulary, FEATURES), nn.Embedding(CONTEXT, FEATURES)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln, self.head = nn.LayerNorm(FEATURES), nn.Linear(FEATURES, vocabulary)

    def forward(self, ids, *past):
        past_length = past[0].shape[2] if past else 0
        x = self.embed(ids) + self.position(torch.arange(ids.shape[1]) + past_length)
        presents = []
        for i, block in enumerate(self.blocks):
            empty = torch.zeros(ids.shape[0], HEADS, 0, HEAD)
            k, v = (past[2 * i], past[2 * i + 1]) if past else (empty, empty)
            x, k, v = block(x, k, v)
            presents += [k, v]
        return (self.head(self.ln(x)), *presents)


def save_samples(folder, sequences):
    for n, seq in enumerate(sequences):
        sample = os.path.join(folder, f"{n:03d}")
        os.makedirs(sample, exist_ok=True)
        np.save(os.path.join(sample, "input_ids.npy"), seq[None, :].astype(np.int64))
        for i in range(LAYERS):
            for kind in ("key", "value"):
                np.save(os.path.join(sample, f"past_key_values.{i}.{kind}.npy"),
                        np.zeros((1, HEADS, 0, HEAD), dtype=np.float32))


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    np.random.seed(0)
    text = corpus()
    chars = sorted(set(text))
    data = np.array([chars.index(c) for c in text], dtype=np.int64)
    split = int(len(data) * 0.9)
    train, held_out = data[:split], data[split:]
    model = CharLM(len(chars))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    steps = 2000
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps)
    for step in range(steps):
        starts = np.random.randint(0, len(train) - CONTEXT - 1, 32)
        x = torch.tensor(np.stack([train[s:s + CONTEXT] for s in starts]))
        y = torch.tensor(np.stack([train[s + 1:s + CONTEXT + 1] for s in starts]))
        loss = nn.functional.cross_entropy(model(x)[0].reshape(-1, len(chars)), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 500 == 0 or step == steps - 1:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
    model.eval()

    evaluation = [held_out[i * CONTEXT:(i + 1) * CONTEXT + 1] for i in range(32)]
    with torch.no_grad():
        x = torch.tensor(np.stack([s[:-1] for s in evaluation]))
        y = torch.tensor(np.stack([s[1:] for s in evaluation]))
        nll = nn.functional.cross_entropy(model(x)[0].reshape(-1, len(chars)), y.reshape(-1))
    print(f"held-out perplexity {float(torch.exp(nll)):.3f}")

    past = [torch.zeros(1, HEADS, 3, HEAD) for _ in range(2 * LAYERS)]
    names = [f"past_key_values.{i}.{kind}" for i in range(LAYERS) for kind in ("key", "value")]
    presents = [f"present.{i}.{kind}" for i in range(LAYERS) for kind in ("key", "value")]
    dynamic = {"input_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch", 1: "sequence"}}
    for name in names + presents:
        dynamic[name] = {0: "batch", 2: "past" if name.startswith("past") else "total"}
    torch.onnx.export(model, (torch.zeros(1, 5, dtype=torch.int64), *past), os.path.join(out, "charlm.onnx"),
                      input_names=["input_ids"] + names, output_names=["logits"] + presents,
                      dynamic_axes=dynamic, opset_version=17)
    starts = np.random.randint(0, len(train) - CONTEXT, 16)
    save_samples(os.path.join(out, "calibration"), [train[s:s + CONTEXT] for s in starts])
    save_samples(os.path.join(out, "evaluation"), [s[:-1] for s in evaluation])
    np.save(os.path.join(out, "evaluation_labels.npy"), np.stack([s[1:] for s in evaluation]).astype(np.int64))


if __name__ == "__main__":
    main()
