#!/usr/bin/env python3
"""Writes a float model of LAYERS gated MLP blocks as decoder LLMs have them
(x + down(silu(gate(x)) * up(x)), random weights) and token inputs for it, for
bench/int4/matmul_nbits.sh.

    decoder_mlp.py OUT_DIR [--hidden 2048] [--inner 5632] [--layers 1] [--tokens 1 16 128]

Writes OUT_DIR/decoder_mlp.onnx (weights as external data) and
OUT_DIR/decoder_mlp/input_0_t<T>.npy ([1, T, hidden] float32) for each T.
Needs python3-numpy and python3-onnx.
"""
import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out_dir")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inner", type=int, default=5632)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 128])
    a = p.parse_args()
    rng = np.random.default_rng(7)
    nodes, inits = [], []
    x = "x"
    for i in range(a.layers):
        def weight(name, rows, cols):
            w = rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(rows)
            inits.append(numpy_helper.from_array(w, f"layers.{i}.mlp.{name}.weight"))
            return inits[-1].name

        pre = f"/layers.{i}/mlp"
        g, u, d = weight("gate_proj", a.hidden, a.inner), weight("up_proj", a.hidden, a.inner), weight(
            "down_proj", a.inner, a.hidden)
        nodes += [
            helper.make_node("MatMul", [x, g], [f"{pre}/gate"], name=f"{pre}/gate_proj/MatMul"),
            helper.make_node("MatMul", [x, u], [f"{pre}/up"], name=f"{pre}/up_proj/MatMul"),
            helper.make_node("Sigmoid", [f"{pre}/gate"], [f"{pre}/sig"], name=f"{pre}/Sigmoid"),
            helper.make_node("Mul", [f"{pre}/gate", f"{pre}/sig"], [f"{pre}/silu"], name=f"{pre}/Mul_silu"),
            helper.make_node("Mul", [f"{pre}/silu", f"{pre}/up"], [f"{pre}/h"], name=f"{pre}/Mul"),
            helper.make_node("MatMul", [f"{pre}/h", d], [f"{pre}/down"], name=f"{pre}/down_proj/MatMul"),
            helper.make_node("Add", [x, f"{pre}/down"], [f"/layers.{i}/out"], name=f"/layers.{i}/Add"),
        ]
        x = f"/layers.{i}/out"
    nodes.append(helper.make_node("Identity", [x], ["y"], name="/out/Identity"))
    graph = helper.make_graph(
        nodes, "decoder_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "tokens", a.hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "tokens", a.hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    os.makedirs(os.path.join(a.out_dir, "decoder_mlp"), exist_ok=True)
    onnx.save_model(model, os.path.join(a.out_dir, "decoder_mlp.onnx"), save_as_external_data=True,
                    location="decoder_mlp.onnx.data")
    for t in a.tokens:
        np.save(os.path.join(a.out_dir, "decoder_mlp", f"input_0_t{t}.npy"),
                rng.standard_normal((1, t, a.hidden), dtype=np.float32))


if __name__ == "__main__":
    main()
