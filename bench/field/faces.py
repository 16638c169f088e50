"""RetinaFace (MobileNet-0.25, the `retinaface` npm package's mnet.25_v2.onnx) on
scenes whose faces are known.

  faces.py data DIR           DIR/calib (8 scenes) and DIR/eval (24 scenes, with their
                              face boxes): 640x640, as the package feeds them (RGB 0-255,
                              channels first)
  faces.py score DIR MODEL    the average precision (%) at IoU 0.5 of the decoded, NMS-ed
                              faces against the pasted ones; prints one JSON object

Ground truth: python3-skimage's Labeled Faces in the Wild subset (100 face crops, 100 crops
of other things) pasted at known places and sizes (48-160 pixels) onto its textures, with
brightness and contrast changed; calibration and evaluation use different crops. The
model has nine outputs: per stride (8, 16, 32) a face probability map (two anchors), box
deltas and landmarks, decoded as the package decodes them.
"""
import json
import os
import sys

import numpy as np

SIZE = 640
STRIDES = ((32, (32, 16)), (16, (8, 4)), (8, (2, 1)))  # stride, anchor scales (base size 16)


def crops():
    import skimage.data
    lfw = np.load(os.path.join(os.path.dirname(skimage.data.__file__), "lfw_subset.npy"))
    return lfw[:100], lfw[100:]  # faces, then other things


def scene(rng, faces, others):
    from PIL import Image
    import skimage.data
    t = getattr(skimage.data, ["grass", "gravel", "brick", "moon", "camera"][rng.integers(5)])()
    image = np.asarray(Image.fromarray(t).resize((SIZE, SIZE), Image.BILINEAR), np.float32)
    image = np.repeat(image[:, :, None], 3, axis=2) * rng.uniform(0.6, 1.1, 3)
    boxes, taken = [], np.zeros((SIZE, SIZE), bool)
    for _ in range(40):  # up to 8 crops that do not overlap
        if len(boxes) + int(taken.any()) >= 8:
            break
        is_face = rng.random() < 0.6
        pool = faces if is_face else others
        side = int(rng.integers(48, 161))
        y, x = rng.integers(0, SIZE - side + 1, 2)
        if taken[y:y + side, x:x + side].any():
            continue
        crop = np.asarray(Image.fromarray((pool[rng.integers(len(pool))] * 255).astype(np.uint8))
                          .resize((side, side), Image.BICUBIC), np.float32)
        crop = np.clip((crop - 128) * rng.uniform(0.7, 1.3) + 128 + rng.uniform(-30, 30), 0, 255)
        image[y:y + side, x:x + side] = crop[:, :, None] * rng.uniform(0.85, 1.15, 3)
        taken[y:y + side, x:x + side] = True
        if is_face:
            boxes.append([x, y, x + side, y + side])
    return np.clip(image, 0, 255).transpose(2, 0, 1)[None].astype(np.float32), np.array(boxes, np.float32)


def make_data(directory):
    faces, others = crops()
    for split, count, seed, half in (("calib", 8, 1, 0), ("eval", 24, 2, 1)):
        os.makedirs(os.path.join(directory, split), exist_ok=True)
        rng = np.random.default_rng(seed)
        f, o = faces[half * 50:(half + 1) * 50], others[half * 50:(half + 1) * 50]
        for i in range(count):
            x, boxes = scene(rng, f, o)
            np.save(os.path.join(directory, split, f"{i:03d}.npy"), x)
            if split == "eval":
                np.save(os.path.join(directory, split, f"boxes_{i:03d}.npy"), boxes)


def decode(outputs, threshold=0.3, nms=0.5):
    """Faces as (probability, x0, y0, x1, y1), as the package decodes them."""
    faces = []
    for stride, scales in STRIDES:
        prob = outputs[f"face_rpn_cls_prob_reshape_stride{stride}"][0]
        delta = outputs[f"face_rpn_bbox_pred_stride{stride}"][0]
        for q, s in enumerate(scales):
            side = 16 * s
            p = prob[q + len(scales)]
            for y, x in zip(*np.nonzero(p >= threshold)):
                cx, cy = x * stride + 7.5, y * stride + 7.5  # the anchor's centre
                dx, dy, dw, dh = delta[4 * q:4 * q + 4, y, x]
                cx, cy, w, h = cx + side * dx, cy + side * dy, side * np.exp(dw), side * np.exp(dh)
                faces.append((float(p[y, x]), cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2))
    faces.sort(key=lambda f: -f[0])
    kept = []
    for f in faces:
        if all(iou(f[1:], k[1:]) <= nms for k in kept):
            kept.append(f)
    return kept


def iou(a, b):
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def score(directory, model):
    import onnx
    import vaiq
    names = [o.name for o in onnx.load(model, load_external_data=False).graph.output]
    d = os.path.join(directory, "eval")
    ranked, total = [], 0  # (probability, true positive)
    for f in sorted(f for f in os.listdir(d) if f[0].isdigit()):
        outputs = dict(zip(names, vaiq.infer(model, {"data": np.load(os.path.join(d, f))}, threads=2)))
        truth = [list(b) for b in np.load(os.path.join(d, "boxes_" + f))]
        total += len(truth)
        for p, *box in decode(outputs):
            best = max(range(len(truth)), key=lambda k: iou(box, truth[k]), default=None)
            hit = best is not None and iou(box, truth[best]) >= 0.5
            if hit:
                truth.pop(best)
            ranked.append((p, hit))
    ranked.sort(key=lambda r: -r[0])
    hits = np.cumsum([h for _, h in ranked])
    precision = hits / np.arange(1, len(ranked) + 1)
    recall = hits / max(total, 1)
    # All-point interpolated AP: precision made non-increasing, summed over recall steps.
    ap, previous = 0.0, 0.0
    for k in range(len(ranked)):
        if ranked[k][1]:
            ap += (recall[k] - previous) * precision[k:].max()
            previous = recall[k]
    at = [k for k in range(len(ranked)) if ranked[k][0] >= 0.75]  # the package's threshold
    return {"metric": round(100 * ap, 1), "faces": total, "detections_at_0.75": len(at),
            "recall_at_0.75": round(float(recall[at[-1]]) if at else 0.0, 3),
            "precision_at_0.75": round(float(precision[at[-1]]) if at else 0.0, 3)}


if __name__ == "__main__":
    if sys.argv[1] == "data":
        make_data(sys.argv[2])
    elif sys.argv[1] == "score":
        print(json.dumps(score(sys.argv[2], sys.argv[3])))
    else:
        sys.exit(__doc__)
