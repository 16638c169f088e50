"""vaiq: post-training quantization of ONNX models.

The documented vai_q_onnx API over vaiq's pipeline: a script written for
``vai_q_onnx.quantize_static(...)`` runs with ``vaiq`` in its place. Every
argument and ``extra_options`` key is a recipe key of the same name, checked by
the same schema (an unknown one raises ``ValueError`` with the recipe's message).
"""

import enum
import json
import os

# OpenMP's idle threads spin briefly, then sleep: libgomp's default spinning
# takes the cores a busy machine's other work holds from the thread with work
# (docs/performance.md). Read as the module loads libgomp; a user's setting wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "5000")

from . import _vaiq  # noqa: E402

__version__ = _vaiq.version()

__all__ = [
    "CalibrationDataReader", "CalibrationMethod", "ExtendedQuantType", "PowerOfTwoMethod", "QuantFormat", "QuantType",
    "VitisQuantFormat", "VitisQuantType", "dump_model", "infer", "quant_pre_process", "quantize_static",
    "calibrate", "cmake_dir", "merge_statistics", "run_recipe", "set_log_level", "tune",
]


class _Spelling(str, enum.Enum):
    """An enum whose value is its documented spelling, which recipes accept."""

    def __str__(self):
        return self.value


class QuantFormat(_Spelling):
    QOperator = "QOperator"
    QDQ = "QDQ"
    MatMulNBits = "MatMulNBits"


class VitisQuantFormat(_Spelling):
    QDQ = "VitisQuantFormat.QDQ"
    FixNeuron = "VitisQuantFormat.FixNeuron"


class QuantType(_Spelling):
    QInt8 = "QInt8"
    QUInt8 = "QUInt8"
    QInt16 = "QInt16"
    QUInt16 = "QUInt16"
    QInt32 = "QInt32"
    QUInt32 = "QUInt32"
    QFloat16 = "QFloat16"
    QBFloat16 = "QBFloat16"
    QInt4 = "QInt4"
    QUInt4 = "QUInt4"
    QFloat8E4M3FN = "QFloat8E4M3FN"
    QFloat8E5M2 = "QFloat8E5M2"


VitisQuantType = QuantType


class ExtendedQuantType(_Spelling):
    """Block floating point and MX (docs/formats.md): QBFP with
    extra_options BFPAttributes, QMX with MXAttributes' element_dtype, or an
    MX element named directly."""
    QBFP = "QBFP16"
    QBFP16 = "QBFP16"
    QMX = "QMX"
    QMXINT8 = "QMXINT8"
    QMXFP8E4M3 = "QMXFP8E4M3"
    QMXFP8E5M2 = "QMXFP8E5M2"
    QMXFP6E3M2 = "QMXFP6E3M2"
    QMXFP6E2M3 = "QMXFP6E2M3"
    QMXFP4E2M1 = "QMXFP4E2M1"


class CalibrationMethod(_Spelling):
    MinMax = "MinMax"
    Entropy = "Entropy"
    Percentile = "Percentile"
    NonOverflow = "NonOverflow"
    MinMSE = "MinMSE"


class PowerOfTwoMethod(_Spelling):
    NonOverflow = "PowerOfTwoMethod.NonOverflow"
    MinMSE = "PowerOfTwoMethod.MinMSE"


class CalibrationDataReader:
    """The protocol calibration data follows: ``get_next()`` returns a dict of
    input name to numpy array, or None at the end. ``rewind()``, when a reader
    has it, starts again; a reader without it is read once and its batches kept
    in memory for the passes that need the data again. Subclassing is optional:
    any object with ``get_next()`` is a reader."""

    def get_next(self):
        raise NotImplementedError

    def __iter__(self):
        return self

    def __next__(self):
        sample = self.get_next()
        if sample is None:
            raise StopIteration
        return sample


def _plain(value):
    """A Python argument as the JSON a recipe holds."""
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    return value


def _reader_and_path(reader):
    """(reader object, data path): a reader is an object with get_next(); a
    path is a string (files, as recipes take them); None is random data."""
    if reader is None:
        return None, None
    if isinstance(reader, (str, os.PathLike)):
        return None, os.fspath(reader)
    return reader, None


def _report(text):
    return json.loads(text)


def quantize_static(model_input, model_output, calibration_data_reader=None, **kwargs):
    """Quantizes ``model_input`` into ``model_output`` as vai_q_onnx.quantize_static
    does; returns the run's report (also written as ``<output>.report.json``).

    ``calibration_data_reader``: a CalibrationDataReader, a data path (a folder
    or .npy file, as recipes take it), or None for random data. Keyword
    arguments are quantize_static's documented ones and any other recipe key
    (``target``, ``evaluation_data``, ``overrides``, ...); ``extra_options`` is a
    dict of the documented extra options. ``recipe="cnn_npu.yaml"`` starts from
    a shipped (or your own) recipe instead of the documented defaults. Without
    a target, recipes quantize for ``cpu``, or ``npu_cnn`` with enable_dpu.
    """
    reader, data_path = _reader_and_path(calibration_data_reader)
    document = {"recipe_version": 1}
    recipe = kwargs.pop("recipe", None)
    if recipe is not None:
        document["extends"] = os.fspath(recipe)
    if "inclue_cle" in kwargs:  # the documented signature's spelling of include_cle
        kwargs["include_cle"] = kwargs.pop("inclue_cle")
    document["model_input"] = os.fspath(model_input)
    document["model_output"] = os.fspath(model_output)
    if data_path is not None:
        document["calibration_data_reader"] = data_path
    for key, value in kwargs.items():
        if value is None and key in ("nodes_to_quantize", "nodes_to_exclude"):
            continue  # the documented default None: every node, none excluded
        document[key] = _plain(value)
    text = json.dumps(document, indent=1)
    return _report(_vaiq.run_document(text, "quantize_static", os.getcwd(), reader))


_PATH_SETTINGS = ("model_input", "model_output", "calibration_data_reader", "report")


def _absolute_paths(settings):
    """Settings as JSON values, the paths among them absolute (resolved here,
    where the caller's current folder is meant)."""
    out = {}
    for key, value in settings.items():
        value = _plain(value)
        out[key] = os.path.abspath(value) if key in _PATH_SETTINGS and isinstance(value, str) else value
    return out


def _assignments(settings, overrides, data_path):
    """`--set` assignments for top-level settings and dotted overrides; paths absolute."""
    settings = dict(settings)
    if data_path is not None:
        settings["calibration_data_reader"] = data_path
    merged = _absolute_paths({**settings, **(overrides or {})})
    return [f"{key}={json.dumps(value)}" for key, value in merged.items()]


def _paths(statistics):
    return [os.path.abspath(os.fspath(p)) for p in (statistics or ())]


def run_recipe(path, calibration_data_reader=None, overrides=None, statistics=None, **settings):
    """Runs a recipe file as ``vaiq run`` does. ``settings`` are top-level keys
    (``model_input=...``), ``overrides`` a dict of dotted keys
    (``{"extra_options.ActivationSymmetric": True}``); both act like ``--set``.
    ``calibration_data_reader`` as in quantize_static. ``statistics``: files
    written by :func:`calibrate` (one per data shard) to calibrate from instead
    of the data, merged as if one process had seen every shard (``vaiq run
    --calibration``). A bare recipe name not in the current folder is a shipped
    recipe. Returns the report."""
    reader, data_path = _reader_and_path(calibration_data_reader)
    return _report(_vaiq.run_recipe(os.fspath(path), _assignments(settings, overrides, data_path), reader,
                                    _paths(statistics)))


def tune(recipe, space, target, metric=None, calibration_data_reader=None, overrides=None, **settings):
    """Runs the candidates of ``space`` (a space file, or a shipped space's
    name: ``cpu.yaml``, ``cnn_npu.yaml``, ``transformer_npu.yaml``) over
    ``recipe``, cheapest first, until one's model meets ``target``, and keeps
    that one at the recipe's output (``vaiq tune``). ``target`` is
    ``"MEASURE>=X"`` or ``"MEASURE<=X"`` over the report (accuracy,
    accuracy_drop, perplexity, perplexity_increase, sqnr_db, cosine,
    top1_agreement), or ``"metric>=X"`` with ``metric`` a callable of the
    quantized model's path and its report (a dict) returning a number, e.g.
    your own accuracy in ONNX Runtime. ``calibration_data_reader``,
    ``settings`` and ``overrides`` as in run_recipe. Returns the tune report:
    every trial with its settings, seconds and score, ``kept`` and ``met``
    (False when no candidate met the target and the best was written)."""
    reader, data_path = _reader_and_path(calibration_data_reader)
    return json.loads(_vaiq.tune(os.fspath(recipe), _assignments(settings, overrides, data_path), os.fspath(space),
                                 target, metric, reader))


def calibrate(recipe, data, output, overrides=None, statistics=None, **settings):
    """Calibrates as ``recipe`` says on ``data`` (a data path, or a
    CalibrationDataReader) and writes the statistics file ``output`` (``vaiq
    calibrate``): what one shard of a data set contributes, to be merged by
    :func:`merge_statistics` or passed to :func:`run_recipe` as ``statistics``.
    ``settings`` and ``overrides`` as in run_recipe. Returns the tensor and
    batch counts written."""
    reader, data_path = _reader_and_path(data)
    return _vaiq.calibrate(os.fspath(recipe), _assignments(settings, overrides, data_path), reader,
                           _paths(statistics), os.path.abspath(os.fspath(output)))


def merge_statistics(statistics, output, recipe, overrides=None, **settings):
    """Merges statistics files of the same recipe and model (one per shard) into
    one file ``output``, equal to what one process calibrating on every shard
    writes. Files of another model, plan or calibrator options are refused
    (ValueError naming the file)."""
    if not statistics:
        raise ValueError("merge_statistics: no statistics files given")
    return calibrate(recipe, None, output, overrides=overrides, statistics=statistics, **settings)


def quant_pre_process(input_model_path, output_model_path, skip_optimization=False, skip_onnx_shape=False,
                      skip_symbolic_shape=False, auto_merge=False, int_max=2**31 - 1, guess_output_rank=False,
                      verbose=0, save_as_external_data=False, all_tensors_to_one_file=False,
                      external_data_location="./", external_data_size_threshold=1024, passes=()):
    """quant_pre_process: symbolic shape inference, optimization and ONNX shape
    inference (each unless skipped), then any further pass plugins by name.
    Returns what ran."""
    args = dict(skip_optimization=skip_optimization, skip_onnx_shape=skip_onnx_shape,
                skip_symbolic_shape=skip_symbolic_shape, auto_merge=auto_merge, int_max=int_max,
                guess_output_rank=guess_output_rank, verbose=verbose, save_as_external_data=save_as_external_data,
                all_tensors_to_one_file=all_tensors_to_one_file, external_data_location=external_data_location,
                external_data_size_threshold=external_data_size_threshold, passes=list(passes))
    return json.loads(_vaiq.preprocess(os.fspath(input_model_path), os.fspath(output_model_path), args))


def dump_model(model, dump_data_reader=None, random_data_reader_input_shape=None, dump_float=False,
               output_dir="./dump_results"):
    """dump_model: the integers every DequantizeLinear/FixNeuron reads on the
    first batch of ``dump_data_reader`` (random inputs when None), as
    ``<output>.bin`` and ``.txt`` in ``output_dir``; with ``dump_float`` every
    node's float output too. Returns the counts written."""
    reader, data_path = _reader_and_path(dump_data_reader)
    if data_path is not None:
        raise ValueError("dump_model: dump_data_reader takes a CalibrationDataReader or None")
    shapes = _plain(random_data_reader_input_shape or {})
    return _vaiq.dump(os.fspath(model), reader, json.dumps(shapes), bool(dump_float), os.fspath(output_dir))


def infer(model, feeds, threads=0):
    """Runs ``model`` on vaiq's executor: ``feeds`` a dict of input name to numpy
    array; returns the outputs as numpy arrays, in output order."""
    return _vaiq.infer(os.fspath(model), feeds, int(threads))


def set_log_level(level):
    """'debug', 'info' (the default), 'warn', 'err' or 'off'."""
    _vaiq.set_log_level(level)


def cmake_dir():
    """The folder of vaiq's CMake package (the plugin SDK) when it is installed
    with the module (the wheel): ``cmake -Dvaiq_DIR=$(python3 -c 'import vaiq;
    print(vaiq.cmake_dir())')``. None when it is not (the build tree)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, "lib", "cmake", "vaiq"),
                      os.path.join(here, "..", "..", "..", "cmake", "vaiq")):
        if os.path.isfile(os.path.join(candidate, "vaiqConfig.cmake")):
            return os.path.normpath(candidate)
    return None
