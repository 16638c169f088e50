#!/usr/bin/env python3
"""Text lines for measuring the PP-OCRv4 recognizer (SVTR-LCNet, CTC) before and after quantization.

  ocr_lines.py render DIR N SEED [other]
                                     N lines rendered with Debian's DejaVu fonts from words of Debian's
                                     license texts: DIR/line_<k>.npy (1x3x48x320, PaddleOCR's
                                     preprocessing) and DIR/labels.txt (the text, one a line); with
                                     `other`, lines a recipe was never tuned on: other faces (oblique,
                                     condensed, italic, light), words of other licenses with
                                     punctuation, and a wider range of ink and paper
  ocr_lines.py score KEYS LABELS OUT...  CTC-decodes OUT/output_0.npy for each line (OUT given once per
                                     line, in order) and prints exact-line accuracy, the same with spaces
                                     ignored (as PaddleOCR's recognition metric compares lines) and
                                     character error rate

Needs python3-numpy and python3-pil (Debian). Different seeds give disjoint sets of lines, so the
calibration and the evaluation lines are never the same.
"""
import glob, json, os, random, re, sys
import numpy as np

WIDTH, HEIGHT = 320, 48


FACES = ["DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "DejaVuSans-Bold.ttf"]
OTHER_FACES = ["DejaVuSans-Oblique.ttf", "DejaVuSansCondensed.ttf", "DejaVuSerif-Italic.ttf",
               "DejaVuSansMono-Bold.ttf", "DejaVuSans-ExtraLight.ttf", "DejaVuSerifCondensed-Bold.ttf"]


def words(other=False):
    licenses = ["MPL-2.0", "Artistic", "LGPL-2.1", "GFDL-1.3"] if other else ["GPL-3", "Apache-2.0"]
    text = "".join(open(f"/usr/share/common-licenses/{f}").read() for f in licenses)
    pattern = r"[A-Za-z0-9]+[.,:;)]?" if other else r"[A-Za-z0-9]+"
    return sorted({w for w in re.findall(pattern, text) if 2 <= len(w) <= 12})


def render(d, n, seed, other=False):
    from PIL import Image, ImageDraw, ImageFont
    fonts = [f"/usr/share/fonts/truetype/dejavu/{f}" for f in (OTHER_FACES if other else FACES)]
    vocabulary = words(other)
    os.makedirs(d, exist_ok=True)
    labels = []
    for k in range(n):
        r = random.Random(seed * 100003 + k)
        font = ImageFont.truetype(r.choice(fonts), r.randint(28, 36))
        while True:
            text = " ".join(r.choice(vocabulary) for _ in range(r.randint(1, 3)))
            w = int(font.getlength(text)) + 16
            if w <= WIDTH * 1.3:  # the line is 48 high: squeezed by at most 30 % to fit
                break
        bg = tuple(r.randint(140 if other else 180, 255) for _ in range(3))
        ink = tuple(r.randint(0, 110 if other else 90) for _ in range(3))
        im = Image.new("RGB", (max(w, HEIGHT), HEIGHT), bg)
        ImageDraw.Draw(im).text((8, 5), text, fill=ink, font=font)
        # PaddleOCR's recognizer preprocessing: height 48, width ceil(48 * ratio) up to 320, BGR,
        # (x / 255 - 0.5) / 0.5, zero padding on the right.
        nw = min(WIDTH, int(np.ceil(HEIGHT * im.width / im.height)))
        a = np.asarray(im.resize((nw, HEIGHT), Image.BILINEAR)).astype(np.float32)[:, :, ::-1] / 255.0
        x = np.zeros((3, HEIGHT, WIDTH), np.float32)
        x[:, :, :nw] = ((a - 0.5) / 0.5).transpose(2, 0, 1)
        np.save(f"{d}/line_{k:03d}.npy", x[None])
        labels.append(text)
    open(f"{d}/labels.txt", "w").write("\n".join(labels) + "\n")


def edit_distance(a, b):
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def score(keys, labels, outs):
    chars = [""] + open(keys, encoding="utf-8").read().splitlines() + [" "]
    truth = open(labels).read().splitlines()
    assert len(truth) == len(outs), f"{len(truth)} labels, {len(outs)} outputs"
    exact, spaceless, errors, total = 0, 0, 0, 0
    for text, out in zip(truth, outs):
        best = np.load(os.path.join(out, "output_0.npy"))[0].argmax(-1)
        read = "".join(chars[c] for i, c in enumerate(best) if c != 0 and (i == 0 or c != best[i - 1]))
        exact += read == text
        spaceless += read.replace(" ", "") == text.replace(" ", "")
        errors += edit_distance(read, text)
        total += len(text)
    print(json.dumps({"lines": len(truth), "exact": exact / len(truth),
                      "exact_ignoring_spaces": spaceless / len(truth), "cer": errors / total}))


if __name__ == "__main__":
    if sys.argv[1] == "render":
        render(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:] == ["other"])
    elif sys.argv[1] == "score":
        score(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        sys.exit(__doc__)
