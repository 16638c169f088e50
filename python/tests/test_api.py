"""The Python API against the command line on the bundled MNIST example."""

import gc
import json
import os
import pathlib
import subprocess
import sys
import weakref

import numpy as np
import pytest

import vaiq

SOURCE = pathlib.Path(os.environ.get("VAIQ_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
EXAMPLE = SOURCE / "examples" / "mnist"
MODEL = EXAMPLE / "mnist_cnn.onnx"
CLI = os.environ.get("VAIQ_CLI", "vaiq")


class Reader:
    """The tutorial's reader shape: batches of the calibration set, then None."""

    def __init__(self, batch=20, raise_at=None, with_rewind=False):
        self.images = np.load(EXAMPLE / "calibration.npy")
        self.batch = batch
        self.raise_at = raise_at
        self.position = 0
        self.calls = 0
        self.rewinds = 0
        if with_rewind:
            self.rewind = self._rewind

    def get_next(self):
        self.calls += 1
        if self.raise_at is not None and self.calls == self.raise_at:
            raise RuntimeError("the dataset went away")
        if self.position >= len(self.images):
            return None
        chunk = self.images[self.position:self.position + self.batch]
        self.position += self.batch
        return {"pixels": chunk}

    def _rewind(self):
        self.rewinds += 1
        self.position = 0


def cli(*args, cwd=None):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd)


def cpu_arguments(**more):
    return dict(quant_format=vaiq.QuantFormat.QDQ, calibrate_method=vaiq.CalibrationMethod.MinMax,
                activation_type=vaiq.QuantType.QUInt8, weight_type=vaiq.QuantType.QInt8, target="cpu", **more)


def test_quantize_static_writes_the_bytes_vaiq_run_writes(tmp_path):
    run = cli("run", SOURCE / "recipes" / "cpu.yaml", "--model", MODEL, "--data", EXAMPLE / "calibration.npy",
              "--output", tmp_path / "cli.onnx")
    assert run.returncode == 0, run.stderr
    report = vaiq.quantize_static(MODEL, tmp_path / "python.onnx", Reader(), **cpu_arguments())
    assert (tmp_path / "python.onnx").read_bytes() == (tmp_path / "cli.onnx").read_bytes()
    assert report["quantized"] is True
    assert report["calibration"]["batches"] == 10
    assert json.loads((tmp_path / "python.report.json").read_text())["model"]["quantized_tensors"] > 0


def test_enums_and_strings_are_the_same_settings(tmp_path):
    vaiq.quantize_static(MODEL, tmp_path / "enums.onnx", Reader(), **cpu_arguments())
    vaiq.quantize_static(MODEL, tmp_path / "strings.onnx", Reader(), quant_format="QuantFormat.QDQ",
                         calibrate_method="CalibrationMethod.MinMax", activation_type="QuantType.QUInt8",
                         weight_type="QInt8", target="cpu")
    assert (tmp_path / "enums.onnx").read_bytes() == (tmp_path / "strings.onnx").read_bytes()


def test_block_float_types_as_quark_names_them(tmp_path):
    # ExtendedQuantType.QMX takes its element from MXAttributes, as the same recipe keys do.
    report = vaiq.quantize_static(MODEL, tmp_path / "mx.onnx", Reader(), quant_format=vaiq.QuantFormat.QDQ,
                                  activation_type=vaiq.ExtendedQuantType.QMX,
                                  weight_type=vaiq.ExtendedQuantType.QMX, target="cpu",
                                  extra_options={"MXAttributes": {"element_dtype": "fp4_e2m1", "block_size": 16}})
    tensors = [t for t in report["tensors"] if t["role"] != "bias"]
    assert tensors and all(t["type"] == "QMXFP4E2M1" and t["block_size"] == 16 for t in tensors)
    assert report["evaluation"]["outputs"][0]["sqnr_db"] > 5


def test_power_of_two_method_and_vitis_format(tmp_path):
    report = vaiq.quantize_static(MODEL, tmp_path / "npu.onnx", Reader(), quant_format=vaiq.VitisQuantFormat.QDQ,
                                  calibrate_method=vaiq.PowerOfTwoMethod.MinMSE, enable_dpu=True,
                                  extra_options={"ActivationSymmetric": True})
    assert report["quantized"] is True
    assert report["recipe"]["settings"]["quant_format"]["value"] == "VitisQuantFormat.QDQ"
    assert report["recipe"]["settings"]["target"]["value"] == "npu_cnn"


def test_a_recipe_file_as_the_starting_point(tmp_path):
    report = vaiq.quantize_static(MODEL, tmp_path / "npu.onnx", Reader(), recipe="cnn_npu.yaml")
    assert report["recipe"]["settings"]["calibrate_method"]["value"] == "MinMSE"
    assert report["quantized"] is True


def test_unknown_argument_is_the_recipe_error(tmp_path):
    with pytest.raises(ValueError) as raised:
        vaiq.quantize_static(MODEL, tmp_path / "out.onnx", Reader(), per_chanel=True)
    message = str(raised.value)
    assert message.startswith("quantize_static: unknown key 'per_chanel' in the recipe")
    # The same words as a recipe file with that key.
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("recipe_version: 1\nper_chanel: true\n")
    run = cli("validate", recipe)
    assert run.returncode == 1
    assert message.split(": ", 1)[1] in run.stderr
    assert not (tmp_path / "out.onnx").exists()


def test_bad_values_and_extra_options_raise_value_error(tmp_path):
    with pytest.raises(ValueError, match="ActivationSymetric"):
        vaiq.quantize_static(MODEL, tmp_path / "out.onnx", Reader(), extra_options={"ActivationSymetric": True})
    with pytest.raises(ValueError, match="calibrate_method 'Median' is not a calibration method"):
        vaiq.quantize_static(MODEL, tmp_path / "out.onnx", Reader(), calibrate_method="Median")
    with pytest.raises(ValueError, match="no such model file"):
        vaiq.quantize_static(tmp_path / "missing.onnx", tmp_path / "out.onnx", Reader())
    assert list(tmp_path.iterdir()) == []


def test_a_reader_that_raises_mid_calibration_raises_its_exception_and_writes_nothing(tmp_path):
    reader = Reader(raise_at=4)
    with pytest.raises(RuntimeError, match="the dataset went away") as raised:
        vaiq.quantize_static(MODEL, tmp_path / "out.onnx", reader, **cpu_arguments())
    assert reader.calls == 4
    assert list(tmp_path.iterdir()) == []
    # vaiq keeps no reference to the reader once the call is over.
    del raised
    gone = weakref.ref(reader)
    del reader
    gc.collect()
    assert gone() is None


def test_bad_samples_name_the_call(tmp_path):
    class ListReader:
        def get_next(self):
            return [np.zeros((1, 1, 28, 28), np.uint8)]

    with pytest.raises(ValueError, match=r"get_next\(\) call 1 is a list, not a dict"):
        vaiq.quantize_static(MODEL, tmp_path / "out.onnx", ListReader(), **cpu_arguments())

    class FloatReader:
        def get_next(self):
            return {"pixels": np.zeros((1, 1, 28, 28), np.float64)}

    with pytest.raises(ValueError, match="pixels"):
        vaiq.quantize_static(MODEL, tmp_path / "out.onnx", FloatReader(), **cpu_arguments())

    with pytest.raises(ValueError, match="get_next"):
        vaiq.quantize_static(MODEL, tmp_path / "out.onnx", object(), **cpu_arguments())
    assert list(tmp_path.iterdir()) == []


def test_a_reader_without_rewind_is_read_once(tmp_path):
    reader = Reader()
    report = vaiq.quantize_static(MODEL, tmp_path / "out.onnx", reader, **cpu_arguments())
    # Calibration and evaluation both read the ten batches; the object saw them once.
    assert report["evaluation"]["batches"] == 10
    assert reader.calls == 11


def test_a_reader_with_rewind_is_rewound_for_each_pass(tmp_path):
    reader = Reader(with_rewind=True)
    report = vaiq.quantize_static(MODEL, tmp_path / "out.onnx", reader, **cpu_arguments())
    assert report["evaluation"]["batches"] == 10
    # Calibration and evaluation each rewind and read all ten batches (and the end).
    assert reader.rewinds >= 1
    assert reader.calls >= 22


def test_data_path_and_random_data(tmp_path):
    report = vaiq.quantize_static(MODEL, tmp_path / "files.onnx", str(EXAMPLE / "calibration.npy"), **cpu_arguments())
    assert report["calibration"]["batches"] == 1
    report = vaiq.quantize_static(MODEL, tmp_path / "random.onnx", None, **cpu_arguments())
    assert report["quantized"] is True


def test_infer_runs_the_quantized_model(tmp_path):
    vaiq.quantize_static(MODEL, tmp_path / "q.onnx", Reader(), **cpu_arguments())
    images = np.load(EXAMPLE / "test_images.npy")[:200]
    labels = np.load(EXAMPLE / "test_labels.npy")[:200]
    (float_logits,) = vaiq.infer(MODEL, {"pixels": images})
    (logits,) = vaiq.infer(tmp_path / "q.onnx", {"pixels": images}, threads=1)
    assert logits.dtype == np.float32 and logits.shape == (200, 10)
    assert (float_logits.argmax(1) == labels).mean() > 0.9
    assert (logits.argmax(1) == float_logits.argmax(1)).mean() > 0.95
    with pytest.raises(ValueError):
        vaiq.infer(MODEL, {"pixels": images.astype(np.float32)})


def test_run_recipe_with_overrides(tmp_path):
    report = vaiq.run_recipe(EXAMPLE / "mnist_cpu.yaml", model_output=tmp_path / "r.onnx",
                             overrides={"extra_options.WeightSymmetric": True})
    assert (tmp_path / "r.onnx").exists()
    assert report["evaluation"]["accuracy"]["quantized"] > 0.9
    assert report["recipe"]["settings"]["extra_options.WeightSymmetric"]["origin"] == "--set"
    with pytest.raises(ValueError, match="unknown key 'Nope' in extra_options"):
        vaiq.run_recipe(EXAMPLE / "mnist_cpu.yaml", model_output=tmp_path / "x.onnx",
                        overrides={"extra_options.Nope": 1})


def test_tune_with_a_metric_of_our_own_keeps_the_first_candidate_that_meets_it(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("candidates:\n"
                     "  - {name: clipped, set: {calibrate_method: Percentile,"
                     " plugin_options: {calibrator: {percentile: 50}}}}\n"
                     "  - {name: as written}\n"
                     "  - {name: per channel, set: {per_channel: true}}\n")
    images, labels = np.load(EXAMPLE / "test_images.npy")[:200], np.load(EXAMPLE / "test_labels.npy")[:200]
    seen = []

    def accuracy(model_path, report):  # the user's own measure: top-1 on 200 digits in vaiq's executor
        assert "evaluation" in report
        seen.append(model_path)
        logits = vaiq.infer(model_path, {"pixels": images})[0]
        return float((logits.argmax(axis=1) == labels).mean())

    result = vaiq.tune(EXAMPLE / "mnist_cpu.yaml", space, "metric>=0.9", metric=accuracy,
                       model_output=tmp_path / "m.onnx")
    assert [t["name"] for t in result["trials"]] == ["clipped", "as written"]
    assert result["trials"][0]["score"] < 0.9 <= result["trials"][1]["score"]
    assert result["kept"] == "as written" and result["met"]
    assert len(seen) == 2 and (tmp_path / "m.onnx").exists() and (tmp_path / "m.tune.json").exists()
    with pytest.raises(ValueError, match="no metric was given"):
        vaiq.tune(EXAMPLE / "mnist_cpu.yaml", space, "metric>=0.9", model_output=tmp_path / "x.onnx")

    def broken(model_path, report):
        raise RuntimeError("the evaluation set went away")

    with pytest.raises(RuntimeError, match="went away"):
        vaiq.tune(EXAMPLE / "mnist_cpu.yaml", space, "metric>=0.9", metric=broken, model_output=tmp_path / "y.onnx")
    assert not (tmp_path / "y.onnx").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".vaiq-tune")]


def test_calibrate_merge_and_quantize_from_statistics_as_the_command_does(tmp_path):
    images = np.load(EXAMPLE / "calibration.npy")
    np.save(tmp_path / "a.npy", images[:50])
    np.save(tmp_path / "b.npy", images[50:])
    a = vaiq.calibrate("cpu.yaml", tmp_path / "a.npy", tmp_path / "a.json", model_input=MODEL)
    vaiq.calibrate("cpu.yaml", Reader(batch=30), tmp_path / "all.json", model_input=MODEL)  # a reader too
    vaiq.calibrate("cpu.yaml", tmp_path / "b.npy", tmp_path / "b.json", model_input=MODEL)
    assert a["tensors"] > 0 and a["batches"] == 1
    assert json.loads((tmp_path / "all.json").read_text())["batches"] == 7
    merged = vaiq.merge_statistics([tmp_path / "a.json", tmp_path / "b.json"], tmp_path / "m.json", "cpu.yaml",
                                   model_input=MODEL)
    assert merged["batches"] == 2
    vaiq.run_recipe("cpu.yaml", statistics=[tmp_path / "m.json"], model_input=MODEL, model_output=tmp_path / "p.onnx")
    cli = subprocess.run([CLI, "-q", "run", "cpu.yaml", "--model", MODEL, "--calibration", tmp_path / "a.json",
                          tmp_path / "b.json", "--output", tmp_path / "c.onnx"], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    assert (tmp_path / "p.onnx").read_bytes() == (tmp_path / "c.onnx").read_bytes()
    with pytest.raises(ValueError, match="no statistics files"):
        vaiq.merge_statistics([], tmp_path / "n.json", "cpu.yaml", model_input=MODEL)
    with pytest.raises(ValueError, match="a.json"):  # statistics of the cpu plan, read for another recipe's
        vaiq.calibrate("cnn_npu.yaml", None, tmp_path / "x.json", statistics=[tmp_path / "a.json"], model_input=MODEL)
    assert not (tmp_path / "x.json").exists()


def test_openmp_threads_spin_briefly_unless_the_user_chose():
    script = "import os, vaiq; print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    seen = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert seen.stdout.split() == ["5000", "None"], seen.stderr
    seen = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**env, "OMP_WAIT_POLICY": "passive"})
    assert seen.stdout.split() == ["None", "passive"], seen.stderr


def test_quant_pre_process_and_dump_model(tmp_path):
    result = vaiq.quant_pre_process(MODEL, tmp_path / "pre.onnx", skip_symbolic_shape=True)
    assert (tmp_path / "pre.onnx").exists()
    assert [p["name"] for p in result["passes"]]
    vaiq.quantize_static(tmp_path / "pre.onnx", tmp_path / "q.onnx", Reader(), **cpu_arguments())
    counts = vaiq.dump_model(tmp_path / "q.onnx", Reader(batch=1), output_dir=tmp_path / "dump")
    assert counts["quantized_tensors"] > 0
    assert len(list((tmp_path / "dump").glob("*.bin"))) == counts["quantized_tensors"]
    counts = vaiq.dump_model(tmp_path / "q.onnx", None, {"pixels": [1, 1, 28, 28]}, dump_float=True,
                             output_dir=tmp_path / "random")
    assert counts["float_tensors"] > 0


def test_the_tutorial_example_runs_as_written_and_matches_its_recipe(tmp_path):
    script = subprocess.run([sys.executable, SOURCE / "examples" / "python" / "quantize_mnist.py", tmp_path / "py.onnx"],
                            capture_output=True, text=True)
    assert script.returncode == 0, script.stderr
    run = cli("run", SOURCE / "examples" / "python" / "tutorial.yaml", "--output", tmp_path / "cli.onnx")
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "py.onnx").read_bytes() == (tmp_path / "cli.onnx").read_bytes()


def test_every_documented_argument_at_its_documented_default(tmp_path):
    """The seed's signature, every argument spelled out with its default, is the plain call."""
    vaiq.quantize_static(MODEL, tmp_path / "plain.onnx", Reader())
    vaiq.quantize_static(
        MODEL, tmp_path / "spelled.onnx", Reader(),
        quant_format=vaiq.QuantFormat.QDQ,
        calibrate_method=vaiq.PowerOfTwoMethod.MinMSE,
        input_nodes=[],
        output_nodes=[],
        op_types_to_quantize=[],
        random_data_reader_input_shape=[],
        per_channel=False,
        reduce_range=False,
        activation_type=vaiq.QuantType.QInt8,
        weight_type=vaiq.QuantType.QInt8,
        nodes_to_quantize=None,
        nodes_to_exclude=None,
        optimize_model=True,
        use_external_data_format=False,
        execution_providers=['CPUExecutionProvider'],
        enable_dpu=False,
        convert_fp16_to_fp32=False,
        convert_nchw_to_nhwc=False,
        inclue_cle=False,
        include_fast_ft=False,
        extra_options={},
    )
    assert (tmp_path / "plain.onnx").read_bytes() == (tmp_path / "spelled.onnx").read_bytes()


def test_the_installed_package_finds_its_libraries_and_plugins(tmp_path):
    prefix = tmp_path / "prefix"
    install = subprocess.run(["cmake", "--install", os.environ["VAIQ_BINARY_DIR"], "--prefix", prefix],
                             capture_output=True, text=True)
    assert install.returncode == 0, install.stderr
    site = prefix / os.environ["VAIQ_PYTHON_INSTALL_DIR"]
    script = ("import json, sys, vaiq; r = vaiq.quantize_static(sys.argv[1], sys.argv[2], sys.argv[3], target='cpu'); "
              "print(json.dumps([vaiq.__file__, r['plugins'][0]['library']]))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    run = subprocess.run([sys.executable, "-c", script, MODEL, tmp_path / "q.onnx", EXAMPLE / "calibration.npy"],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    package, plugin = json.loads(run.stdout)
    assert package.startswith(str(site))
    assert plugin.startswith(str(prefix))
    assert (tmp_path / "q.onnx").exists()
    # python3 -m vaiq is the installed command; the SDK's CMake package is found beside it.
    command = subprocess.run([sys.executable, "-m", "vaiq", "--version"], capture_output=True, text=True, env=env)
    assert command.returncode == 0 and command.stdout.strip() == vaiq.__version__, command.stderr
    where = subprocess.run([sys.executable, "-c", "import vaiq; print(vaiq.cmake_dir())"], capture_output=True,
                           text=True, env=env)
    assert pathlib.Path(where.stdout.strip()).resolve() == (prefix / "lib" / "cmake" / "vaiq").resolve(), where
