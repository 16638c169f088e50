"""PaddleOCR's text direction classifier (ch_ppocr_mobile_v2.0_cls) on rendered lines.

  textdir.py data DIR            calibration (seed 1) and evaluation (seed 2) lines, half of each
                                 turned upside down: DIR/{calib,eval}/line_<k>.npy (1x3x48x192,
                                 PaddleOCR's preprocessing) and DIR/eval_labels.npy (0: upright, 1: 180)
  textdir.py score DIR MODEL     accuracy over the evaluation lines, run in vaiq's executor;
                                 prints one JSON object

Needs python3-numpy, python3-pil and fonts-dejavu-core (Debian).
"""
import json
import os
import random
import re
import sys

import numpy as np

WIDTH, HEIGHT = 192, 48
FONTS = ["DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "DejaVuSans-Bold.ttf"]


def vocabulary():
    text = open("/usr/share/common-licenses/GPL-3").read()
    return sorted({w for w in re.findall(r"[A-Za-z]+", text) if 3 <= len(w) <= 10})


def line(r, words):
    from PIL import Image, ImageDraw, ImageFont
    font = ImageFont.truetype("/usr/share/fonts/truetype/dejavu/" + r.choice(FONTS), r.randint(24, 34))
    text = " ".join(r.choice(words) for _ in range(r.randint(1, 3)))
    width = int(font.getlength(text)) + 12
    image = Image.new("RGB", (max(width, HEIGHT), HEIGHT), tuple(r.randint(170, 255) for _ in range(3)))
    ImageDraw.Draw(image).text((6, 6), text, fill=tuple(r.randint(0, 100) for _ in range(3)), font=font)
    return image


def preprocess(image):
    # PaddleOCR's classifier: height 48, width up to 192 keeping the ratio, BGR, (x/255 - 0.5)/0.5, padded.
    from PIL import Image
    width = min(WIDTH, int(np.ceil(HEIGHT * image.width / image.height)))
    a = np.asarray(image.resize((width, HEIGHT), Image.BILINEAR)).astype(np.float32)[:, :, ::-1] / 255.0
    x = np.zeros((3, HEIGHT, WIDTH), np.float32)
    x[:, :, :width] = ((a - 0.5) / 0.5).transpose(2, 0, 1)
    return x[None]


def make_data(directory):
    words = vocabulary()
    for split, seed, n in (("calib", 1, 32), ("eval", 2, 200)):
        os.makedirs(os.path.join(directory, split), exist_ok=True)
        labels = []
        for k in range(n):
            r = random.Random(seed * 7919 + k)
            image = line(r, words)
            flipped = k % 2 == 1
            if flipped:
                image = image.rotate(180)
            np.save(os.path.join(directory, split, f"line_{k:03d}.npy"), preprocess(image))
            labels.append(int(flipped))
        np.save(os.path.join(directory, f"{split}_labels.npy"), np.array(labels))


def score(directory, model):
    import vaiq
    labels = np.load(os.path.join(directory, "eval_labels.npy"))
    files = sorted(os.listdir(os.path.join(directory, "eval")))
    batch = np.concatenate([np.load(os.path.join(directory, "eval", f)) for f in files])
    try:
        probabilities = vaiq.infer(model, {"x": batch}, threads=2)[0]
    except ValueError:  # a fixed batch of one
        probabilities = np.concatenate([vaiq.infer(model, {"x": b[None]}, threads=2)[0] for b in batch])
    predicted = probabilities.argmax(axis=1)
    return {"metric": round(100 * float((predicted == labels).mean()), 1), "lines": int(labels.size)}


if __name__ == "__main__":
    if sys.argv[1] == "data":
        make_data(sys.argv[2])
    elif sys.argv[1] == "score":
        print(json.dumps(score(sys.argv[2], sys.argv[3])))
    else:
        sys.exit(__doc__)
