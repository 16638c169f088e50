"""IMG.LY's background removal model (ISNet, dichotomous image segmentation) on
composites whose foreground is known.

  segment.py convert IN.onnx OUT.onnx   the package's model (float16 weights between
                                        Casts) widened to float32, exactly: every
                                        float16 weight and constant to float32, the
                                        Casts between the two to Identity; only the
                                        output the package reads ("output", the
                                        mask), the side outputs and the nodes only they
                                        need removed
  segment.py data DIR                   DIR/calib (2 images) and DIR/eval (6 images,
                                        with masks): 1024x1024, as the package feeds
                                        them ((RGB - 128) / 256)
  segment.py score DIR MODEL.onnx       the mean IoU (%) of the mask at 0.5 against the
                                        pasted objects' masks; prints one JSON object

Ground truth: objects with known outlines from python3-skimage's data (the horse
silhouette filled with the cat's or the coffee's photo, elliptic cut-outs of the
astronaut and the rocket) pasted at
random places and scales onto its textures (grass, gravel, brick, moon), tinted.
"""
import json
import os
import sys

import numpy as np

SIZE = 1024


def convert(source, target):
    import onnx
    from onnx import numpy_helper, TensorProto
    m = onnx.load(source)
    g = m.graph
    for i, init in enumerate(g.initializer):
        if init.data_type == TensorProto.FLOAT16:
            g.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float32), init.name))
    for node in g.node:
        if node.op_type == "Cast" and node.attribute[0].i in (TensorProto.FLOAT16, TensorProto.FLOAT):
            node.op_type = "Identity"
            del node.attribute[:]
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value" and a.t.data_type == TensorProto.FLOAT16:
                    a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float32), a.t.name))
    for vi in list(g.value_info) + list(g.output) + list(g.input):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT16:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT
    # Only the mask, and what computes it.
    keep = onnx.ValueInfoProto()
    keep.CopyFrom(next(o for o in g.output if o.name == "output"))
    del g.output[:]
    g.output.append(keep)
    producer = {o: n for n in g.node for o in n.output}
    needed, pending = set(), ["output"]
    while pending:  # (the float16 tool appended its Casts at the end: not in order)
        t = pending.pop()
        if t in needed:
            continue
        needed.add(t)
        if t in producer:
            pending.extend(producer[t].input)
    nodes = []
    for node in g.node:
        if any(o in needed for o in node.output):
            nodes.append(onnx.NodeProto())
            nodes[-1].CopyFrom(node)
    del g.node[:]
    g.node.extend(nodes)
    used = []
    for i in g.initializer:
        if i.name in needed:
            used.append(onnx.TensorProto())
            used[-1].CopyFrom(i)
    del g.initializer[:]
    g.initializer.extend(used)
    del g.value_info[:]
    onnx.save(m, target)


def load(name):
    import skimage.data
    image = getattr(skimage.data, name)()
    return image


def texture(rng):
    from PIL import Image
    t = load(["grass", "gravel", "brick", "moon"][rng.integers(4)]).astype(np.float32)
    t = np.asarray(Image.fromarray(t.astype(np.uint8)).resize((SIZE, SIZE), Image.BILINEAR), np.float32)
    tint = rng.uniform(0.6, 1.1, 3)
    return np.clip(t[:, :, None] * tint[None, None, :], 0, 255)


def ellipse(h, w):
    y, x = np.mgrid[0:h, 0:w]
    return ((y - h / 2) / (h / 2)) ** 2 + ((x - w / 2) / (w / 2)) ** 2 <= 1


def obj(kind):
    """An object's RGB pixels and its mask."""
    from PIL import Image
    if kind in ("horse_cat", "horse_coffee"):
        mask = ~load("horse")  # the horse is False on True
        photo = load("chelsea" if kind == "horse_cat" else "coffee")
        photo = np.asarray(Image.fromarray(photo).resize(mask.shape[::-1], Image.BILINEAR))
        return photo.astype(np.float32), mask
    photo = load("astronaut" if kind == "astronaut" else "rocket").astype(np.float32)
    if kind == "astronaut":
        photo = photo[20:330, 120:380]  # the head and shoulders
    return photo, ellipse(*photo.shape[:2])


KINDS = ["horse_cat", "horse_coffee", "astronaut", "rocket"]


def composite(rng, kind):
    from PIL import Image
    image = texture(rng)
    truth = np.zeros((SIZE, SIZE), bool)
    pixels, mask = obj(kind)
    scale = rng.uniform(0.45, 0.85) * SIZE / max(mask.shape)
    h, w = int(mask.shape[0] * scale), int(mask.shape[1] * scale)
    pixels = np.asarray(Image.fromarray(pixels.astype(np.uint8)).resize((w, h), Image.BILINEAR), np.float32)
    mask = np.asarray(Image.fromarray(mask.astype(np.uint8) * 255).resize((w, h), Image.NEAREST)) > 127
    y, x = rng.integers(0, SIZE - h + 1), rng.integers(0, SIZE - w + 1)
    image[y:y + h, x:x + w][mask] = pixels[mask]
    truth[y:y + h, x:x + w] = mask
    return ((image - 128.0) / 256.0).transpose(2, 0, 1)[None].astype(np.float32), truth


def make_data(directory):
    for split, count, seed in (("calib", 2, 1), ("eval", 6, 2)):
        os.makedirs(os.path.join(directory, split), exist_ok=True)
        rng = np.random.default_rng(seed)
        for i in range(count):
            x, truth = composite(rng, KINDS[(i + seed) % len(KINDS)])
            np.save(os.path.join(directory, split, f"{i:03d}.npy"), x)
            if split == "eval":
                np.save(os.path.join(directory, split, f"mask_{i:03d}.npy"), truth)


def score(directory, model):
    import vaiq
    d = os.path.join(directory, "eval")
    ious = []
    for f in sorted(f for f in os.listdir(d) if f[0].isdigit()):
        prediction = vaiq.infer(model, {"input": np.load(os.path.join(d, f))})[0][0, 0] >= 0.5
        truth = np.load(os.path.join(d, "mask_" + f))
        ious.append((prediction & truth).sum() / max(1, (prediction | truth).sum()))
    print(json.dumps({"iou": [round(100 * float(v), 1) for v in ious], "metric": round(100 * float(np.mean(ious)), 1)}))


if __name__ == "__main__":
    if sys.argv[1] == "convert":
        convert(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "data":
        make_data(sys.argv[2])
    elif sys.argv[1] == "score":
        score(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
