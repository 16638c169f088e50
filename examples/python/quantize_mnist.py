"""The Ryzen AI tutorial's quick start, with `vai_q_onnx` replaced by `vaiq`:
the bundled MNIST CNN through quantize_static with a CalibrationDataReader.

    PYTHONPATH=build/release/python python3 examples/python/quantize_mnist.py [OUTPUT.onnx]

(or `import vaiq` after `cmake --install build/release`). Writes the FixNeuron
model, power-of-two MinMSE scales, and its report beside it.
"""

import pathlib
import sys

import numpy as np

import vaiq

HERE = pathlib.Path(__file__).resolve().parent
MNIST = HERE.parent / "mnist"


class MnistDataReader(vaiq.CalibrationDataReader):
    """Calibration digits in batches of 10, as the tutorial's readers yield them."""

    def __init__(self, images_path, batch_size=10):
        self.images = np.load(images_path)
        self.batch_size = batch_size
        self.position = 0

    def get_next(self):
        if self.position >= len(self.images):
            return None
        batch = self.images[self.position:self.position + self.batch_size]
        self.position += self.batch_size
        return {"pixels": batch}

    def rewind(self):
        self.position = 0


model_input = str(MNIST / "mnist_cnn.onnx")
model_output = sys.argv[1] if len(sys.argv) > 1 else "mnist_fixneuron.onnx"
calibration_data_reader = MnistDataReader(MNIST / "calibration.npy")

vaiq.quantize_static(
    model_input,
    model_output,
    calibration_data_reader,
    quant_format=vaiq.VitisQuantFormat.FixNeuron,
    calibrate_method=vaiq.PowerOfTwoMethod.MinMSE)
