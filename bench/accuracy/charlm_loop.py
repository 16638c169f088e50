#!/usr/bin/env python3
"""The bundled language model (examples/charlm) inside a Loop, as decoders run
step by step: one character an iteration, its key/value cache carried from one
iteration to the next, every step's logits stacked. Its weights are initializers
of the main graph that the body reads, so EnableSubgraph quantizes a real
trained network that only runs inside a loop body.

  charlm_loop.py make CHARLM_DIR OUT_DIR   # OUT_DIR/charlm_loop.onnx, calibration/, evaluation/
  charlm_loop.py score CHARLM_DIR LOGITS_DIR...  # held-out perplexity and top-1 of each run's logits

`score` reads, per evaluation sequence NNN, LOGITS_DIR/NNN/output_0.npy (what
`vaiq infer` or an ONNX Runtime runner writes for OUT_DIR/evaluation/NNN).
"""
import math
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper


def make(charlm_dir, out_dir):
    model = onnx.load(os.path.join(charlm_dir, "charlm.onnx"))
    g = model.graph
    past = [i.name for i in g.input if i.name != "input_ids"]
    present = [o.name for o in g.output if o.name != "logits"]

    # The body: the token at position i of the outer `tokens`, then the model's own nodes.
    body_nodes = [
        helper.make_node("Unsqueeze", ["i", "axis1"], ["i_index"], name="step_index"),
        helper.make_node("Gather", ["tokens", "i_index"], ["input_ids"], axis=1, name="step_token"),
        helper.make_node("Identity", ["going"], ["going_out"], name="step_going"),
    ] + list(g.node)
    body_inputs = [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                   helper.make_tensor_value_info("going", TensorProto.BOOL, [])]
    body_inputs += [helper.make_tensor_value_info(p, TensorProto.FLOAT, ["batch", 4, "past", 24]) for p in past]
    body_outputs = [helper.make_tensor_value_info("going_out", TensorProto.BOOL, [])]
    body_outputs += [helper.make_tensor_value_info(p, TensorProto.FLOAT, ["batch", 4, "total", 24]) for p in present]
    body_outputs += [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1, 86])]
    body = helper.make_graph(body_nodes, "step", body_inputs, body_outputs)

    nodes = [
        helper.make_node("Shape", ["tokens"], ["tokens_shape"], name="length_shape"),
        helper.make_node("Gather", ["tokens_shape", "one"], ["length"], axis=0, name="length"),
        helper.make_node("Loop", ["length", ""] + [f"{p}.empty" for p in past],
                         [f"{p}.final" for p in present] + ["step_logits"], name="decode", body=body),
    ]
    inits = list(g.initializer)
    inits.append(helper.make_tensor("one", TensorProto.INT64, [], [1]))
    inits.append(helper.make_tensor("axis1", TensorProto.INT64, [1], [0]))
    for p in past:
        inits.append(helper.make_tensor(f"{p}.empty", TensorProto.FLOAT, [1, 4, 0, 24], []))
    graph = helper.make_graph(nodes, "charlm_loop",
                              [helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, "sequence"])],
                              [helper.make_tensor_value_info("step_logits", TensorProto.FLOAT,
                                                             ["sequence", 1, 1, 86])], inits)
    out = helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
    onnx.checker.check_model(out)
    os.makedirs(out_dir, exist_ok=True)
    onnx.save(out, os.path.join(out_dir, "charlm_loop.onnx"))
    for part in ("calibration", "evaluation"):
        for sample in sorted(os.listdir(os.path.join(charlm_dir, part))):
            target = os.path.join(out_dir, part, sample)
            os.makedirs(target, exist_ok=True)
            ids = np.load(os.path.join(charlm_dir, part, sample, "input_ids.npy"))
            np.save(os.path.join(target, "tokens.npy"), ids.astype(np.int64))


def score(charlm_dir, logits_dirs):
    labels = np.load(os.path.join(charlm_dir, "evaluation_labels.npy"))
    samples = sorted(os.listdir(os.path.join(charlm_dir, "evaluation")))
    for d in logits_dirs:
        nll, right, count = 0.0, 0, 0
        for k, sample in enumerate(samples):
            logits = np.load(os.path.join(d, sample, "output_0.npy")).reshape(labels.shape[1], -1).astype(np.float64)
            logits -= logits.max(axis=1, keepdims=True)
            logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
            nll -= logp[np.arange(labels.shape[1]), labels[k]].sum()
            right += int((logits.argmax(axis=1) == labels[k]).sum())
            count += labels.shape[1]
        print(f"{d}: perplexity {math.exp(nll / count):.4f}, top-1 {100.0 * right / count:.2f} % ({count} characters)")


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 4 and sys.argv[1] == "score":
        score(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)
