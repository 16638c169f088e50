#!/usr/bin/env python3
"""Pages for measuring the PP-OCRv4 text detector (DBNet) before and after quantization.

  ocr_pages.py render DIR N SEED     N pages (640x640) of 4 to 9 text lines in Debian's DejaVu fonts, words
                                     from Debian's license texts: DIR/page_<k>.npy (1x3x640x640, PaddleOCR's
                                     detector preprocessing)
  ocr_pages.py score REF... -- OUT...  boxes from REF/output_0.npy (the float model's maps, one folder a page)
                                     and OUT/output_0.npy (the quantized model's, same order): prints the
                                     recall of the reference boxes (a box is found when a box of OUT overlaps
                                     it with IoU >= 0.5), the precision, and the boxes per page

Boxes: the probability map above 0.3, 4-connected regions of at least 10 pixels, their bounding boxes
(DBNet's shrunk text kernels: the comparison is between two models, so no unclipping is needed).
Needs python3-numpy and python3-pil (Debian).
"""
import os, random, sys
import numpy as np

from ocr_lines import words

SIZE = 640
MEAN, STD = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)


def render(d, n, seed):
    from PIL import Image, ImageDraw, ImageFont
    fonts = [f"/usr/share/fonts/truetype/dejavu/{f}" for f in
             ["DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "DejaVuSans-Bold.ttf"]]
    vocabulary = words()
    os.makedirs(d, exist_ok=True)
    for k in range(n):
        r = random.Random(seed * 100003 + k)
        im = Image.new("RGB", (SIZE, SIZE), tuple(r.randint(180, 255) for _ in range(3)))
        draw = ImageDraw.Draw(im)
        y = r.randint(10, 40)
        for _ in range(r.randint(4, 9)):
            font = ImageFont.truetype(r.choice(fonts), r.randint(18, 40))
            text = " ".join(r.choice(vocabulary) for _ in range(r.randint(1, 4)))
            x = r.randint(10, 200)
            if y + 50 > SIZE:
                break
            draw.text((x, y), text, fill=tuple(r.randint(0, 90) for _ in range(3)), font=font)
            y += r.randint(45, 80)
        # PaddleOCR's detector preprocessing: BGR, x / 255 normalised by ImageNet's mean and std, CHW.
        a = np.asarray(im).astype(np.float32)[:, :, ::-1] / 255.0
        np.save(f"{d}/page_{k:03d}.npy", ((a - MEAN) / STD).transpose(2, 0, 1)[None].astype(np.float32))


def boxes(prob, threshold=0.3, min_pixels=10):
    mask = prob > threshold
    seen = np.zeros_like(mask)
    h, w = mask.shape
    out = []
    for sy, sx in zip(*np.nonzero(mask)):
        if seen[sy, sx]:
            continue
        seen[sy, sx] = True
        stack, ys, xs = [(sy, sx)], [], []
        while stack:
            y, x = stack.pop()
            ys.append(y)
            xs.append(x)
            for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    stack.append((ny, nx))
        if len(ys) >= min_pixels:
            out.append((min(xs), min(ys), max(xs) + 1, max(ys) + 1))
    return out


def iou(a, b):
    ix = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union else 0.0


def score(refs, outs):
    found = total = predicted = matched = 0
    for ref, out in zip(refs, outs):
        rb = boxes(np.load(os.path.join(ref, "output_0.npy"))[0, 0])
        ob = boxes(np.load(os.path.join(out, "output_0.npy"))[0, 0])
        total += len(rb)
        predicted += len(ob)
        found += sum(any(iou(r, o) >= 0.5 for o in ob) for r in rb)
        matched += sum(any(iou(r, o) >= 0.5 for r in rb) for o in ob)
    print(f'{{"pages": {len(refs)}, "reference_boxes": {total}, "recall": {found / max(total, 1)}, '
          f'"precision": {matched / max(predicted, 1)}}}')


if __name__ == "__main__":
    if sys.argv[1] == "render":
        render(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "score":
        cut = sys.argv.index("--")
        refs, outs = sys.argv[2:cut], sys.argv[cut + 1:]
        assert len(refs) == len(outs), "as many quantized outputs as reference outputs"
        score(refs, outs)
    else:
        sys.exit(__doc__)
