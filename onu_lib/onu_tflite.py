"""TensorFlow Lite models of an exported ONU classifier, for phones and small boxes (the TFLite part of onu_export.py).

    calibration = calibration_pixels(run_config, data_dir, 300)        # photos of the train split
    val_pixels = onu_serving.known_val_pixels(run_config, data_dir)[0]  # photos of the val split
    path = write_tflite(version_dir, 'float16', run_config, None, val_pixels)  # model_float16.tflite, labels.txt, .known.json

Every format takes the same input and gives the same outputs, so an app swaps one for another unchanged:
  input   uint8 [1, size, size, 3]: RGB resized to the model's size, as a camera gives them. The scaling to the
          model's range is inside the model: it is the SavedModel's predict_pixels signature, converted.
  outputs probabilities float32 [1, num_classes], in the order of labels.txt (one class name per line), and for the
          formats with `known` (float32, float16) from a SavedModel with a calibration, known_score float32 [1]: the
          photo is of a known class when it is at least the threshold in model_<format>.known.json beside the model
          (read_known). That threshold is the TFLite model's own: it rejects as many val photos as the SavedModel's
          does (rounding to uint8 pixels and float16 move the scores a little).
The formats are TFLITE_FORMATS; int8 is full-integer post-training quantization, calibrated on train photos. A
model file is written beside its SavedModel under a temporary name renamed when complete, so it is always whole.

A library module: explicit arguments only, no flags.
"""
import contextlib
import dataclasses
import json
import os
import time
from typing import Callable

from ai_edge_litert.interpreter import Interpreter
import numpy as np
import tensorflow as tf

from onu_lib import onu_checkpoint
from onu_lib import onu_cli
from onu_lib import onu_errors
from onu_lib import onu_files
from onu_lib import onu_serving
import onu_input

LABELS_FILENAME = 'labels.txt'  # one class name per line, line i = output i: the form TFLite image-classifier apps read
KNOWN_SUFFIX = '.known.json'  # model_<format>.known.json: the threshold of a .tflite's known_score
DEFAULT_CALIBRATION_EXAMPLES = 300


def _float32(converter, calibration):
    """The weights as trained."""
    del converter, calibration


def _float16(converter, calibration):
    """Weights stored as float16: half the size; computed in float32 on a CPU."""
    del calibration
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_types = [tf.float16]


def _int8(converter, calibration):
    """Weights and activations int8, their ranges calibrated on the pixels given; input uint8, output float32."""
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([pixels[np.newaxis]] for pixels in calibration)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]


@dataclasses.dataclass(frozen=True)
class TFLiteFormat:
    """One kind of .tflite file: its name (--tflite=NAME) and what the converter is told for it."""
    name: str
    configure: Callable  # (converter, calibration pixels or None)
    calibrated: bool = False  # needs calibration pixels
    known: bool = True  # outputs known_score too (when its SavedModel has it)

    @property
    def filename(self):
        return f'model_{self.name}.tflite'


TFLITE_FORMATS = (
    TFLiteFormat('float32', _float32),
    TFLiteFormat('float16', _float16),
    # No known_score in int8: in integers the score's distances lose their order (69-90% of photos that are not ONUs
    # called unknown on two models, against 86-90% in float) and its ops made the small model slower than the
    # SavedModel (BENCHMARKS.md, "Known or not").
    TFLiteFormat('int8', _int8, calibrated=True, known=False),
)
TFLITE_FORMAT_NAMES = tuple(entry.name for entry in TFLITE_FORMATS)


def tflite_format(name):
    """The TFLITE_FORMATS entry called name; ValueError for another name."""
    for entry in TFLITE_FORMATS:
        if entry.name == name:
            return entry
    raise ValueError(f'unknown TensorFlow Lite format {name!r}; choose one of {", ".join(TFLITE_FORMAT_NAMES)}')


def tflite_path(version_dir, format_name):
    """Where the .tflite of format_name converted from the SavedModel in version_dir goes."""
    return os.path.join(version_dir, tflite_format(format_name).filename)


def calibration_pixels(run_config, data_dir, num_examples):
    """Returns the uint8 pixels int8 calibrates on: up to num_examples photos of data_dir's train split (never val:
    the int8 model's precision is measured there), as eval preprocesses them; DataError when it has none."""
    return onu_input.eval_pixels(run_config.split_info('train', data_dir), run_config.image_size, num_examples)[0]


def _probabilities_function(version_dir, image_size, known):
    """Returns (the SavedModel loaded, a concrete function: uint8 pixels [1, size, size, 3] -> probabilities, and with
    known the known score when the SavedModel has one)."""
    loaded = tf.saved_model.load(version_dir, tags=onu_serving.SAVED_MODEL_TAGS)
    signature = loaded.signatures.get(onu_serving.PIXELS_SIGNATURE)
    if signature is None:
        raise onu_errors.DataError(
            f'{version_dir}: no {onu_serving.PIXELS_SIGNATURE} signature (exported before it existed); export the '
            f'checkpoint again into another --export_dir')

    @tf.function(input_signature=[tf.TensorSpec([1, image_size, image_size, 3], tf.uint8,
                                                name=onu_serving.PIXELS_INPUT)])
    def probabilities(pixels):
        outputs = signature(**{onu_serving.PIXELS_INPUT: pixels})
        names = (onu_serving.OUTPUT_PROBABILITIES,) + ((onu_serving.OUTPUT_KNOWN_SCORE,) if known else ())
        return {name: outputs[name] for name in names if name in outputs}
    return loaded, probabilities.get_concrete_function()


def convert(version_dir, format_name, image_size, calibration=None):
    """Returns the bytes of the .tflite of the SavedModel in version_dir; DataError if the converter refuses it."""
    entry = tflite_format(format_name)
    if entry.calibrated and (calibration is None or not len(calibration)):
        raise ValueError(f'--tflite={format_name} needs calibration pixels')
    loaded, function = _probabilities_function(version_dir, image_size, entry.known)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function], loaded)
    entry.configure(converter, calibration)
    try:
        return converter.convert()
    except Exception as e:  # pylint: disable=broad-except  (the converter raises many kinds, all for the user)
        raise onu_errors.DataError(
            f'{version_dir}: the TensorFlow Lite converter refused the model as {format_name} '
            f'({onu_checkpoint.one_line(e)}); try another --tflite format') from None


def output_details(interpreter):
    """{output name: LiteRT output detail} of a model convert() wrote (probabilities[, known_score])."""
    return interpreter.get_signature_runner().get_output_details()


def known_path(model_path):
    """The file of a .tflite's known threshold: model_<format>.known.json beside it."""
    return model_path[:-len('.tflite')] + KNOWN_SUFFIX


def read_known(model_path):
    """The known threshold file's contents ({threshold, score, ...}) of a .tflite, or None when there is none."""
    try:
        with open(known_path(model_path), encoding='utf-8') as f:
            return json.load(f)
    except OSError:
        return None


def known_scores(model, pixels):
    """The known_score output of the .tflite bytes model on each of uint8 pixels [n, size, size, 3]."""
    interpreter = Interpreter(model_content=model)
    with onu_cli.tflite_lines_dropped():
        runner = interpreter.get_signature_runner()
    return np.array([runner(**{onu_serving.PIXELS_INPUT: row[np.newaxis]})[onu_serving.OUTPUT_KNOWN_SCORE][0]
                     for row in pixels], np.float64)


def tflite_known(version_dir, model, pixels):
    """The known threshold of the .tflite bytes model and what it keeps: the SavedModel's (its export's known entry)
    moved so that it rejects as many of the val photos' uint8 pixels as the SavedModel's threshold does."""
    export = onu_serving.export_known(onu_serving.load_export_config(version_dir))
    signature = tf.saved_model.load(version_dir).signatures[onu_serving.PIXELS_SIGNATURE]
    saved = np.concatenate([signature(**{onu_serving.PIXELS_INPUT: tf.constant(pixels[start:start + 64])})[
        onu_serving.OUTPUT_KNOWN_SCORE].numpy() for start in range(0, len(pixels), 64)])
    rejected = int(np.sum(saved < export['threshold']))
    scores = np.sort(known_scores(model, pixels))
    threshold = float(scores[rejected]) if rejected < len(scores) else float('inf')
    return {'score': export['score'], 'threshold': threshold, 'temperature': export['temperature'],
            'known_recall': export['known_recall'], 'saved_model_threshold': export['threshold'],
            'val_examples': len(scores), 'val_known': float(np.mean(scores >= threshold))}


def write_tflite(version_dir, format_name, run_config, calibration=None, val_pixels=None):
    """Writes the .tflite of format_name and labels.txt into version_dir, and with a calibrated SavedModel its known
    threshold, fitted on the val photos' uint8 pixels val_pixels; returns its path. One existing is kept."""
    path = tflite_path(version_dir, format_name)
    if os.path.exists(path):
        print(f'{path} already exists: left unchanged; delete it to convert again', flush=True)
        return path
    started = time.time()
    model = convert(version_dir, format_name, run_config.image_size, calibration)
    known = None
    if tflite_format(format_name).known and onu_serving.export_known(onu_serving.load_export_config(version_dir)):
        if val_pixels is None:
            raise ValueError(f'{version_dir} has a known score: its .tflite needs val pixels for its threshold')
        known = tflite_known(version_dir, model, val_pixels)
    labels_path = os.path.join(version_dir, LABELS_FILENAME)
    new_labels = read_labels(path) != list(run_config.class_names)  # the other formats' labels are the same file
    if new_labels:
        onu_files.write_text_atomic(labels_path, ''.join(f'{name}\n' for name in run_config.class_names))
    try:
        if known:
            onu_files.write_text_atomic(known_path(path), json.dumps(known, indent=1) + '\n')
        onu_files.write_bytes_atomic(path, model)
    except BaseException:
        # Nothing written: a full or failing folder keeps no labels.txt or threshold without its model.
        for written in ([labels_path] if new_labels else []) + ([known_path(path)] if known else []):
            with contextlib.suppress(OSError):
                os.remove(written)
        raise
    calibrated = f', calibrated on {len(calibration)} train photos' if tflite_format(format_name).calibrated else ''
    known_text = (f'; known: {known["score"]} >= {known["threshold"]:.3f} ({known_path(path)}) keeps '
                  f'{known["val_known"]:.1%} of {known["val_examples"]} val photos' if known else '')
    print(f'Wrote {path} ({format_name}{calibrated}, {len(model) / 2**20:.2f} MB, uint8 pixels '
          f'{run_config.image_size}x{run_config.image_size} in, probabilities{" and known_score" if known else ""} '
          f'out) in {time.time() - started:.1f} s{known_text}', flush=True)
    return path


def read_labels(model_path):
    """The class names in the labels.txt beside a .tflite, or None when there is none."""
    try:
        with open(os.path.join(os.path.dirname(model_path), LABELS_FILENAME), encoding='utf-8') as f:
            return [line.rstrip('\n') for line in f if line.strip()]
    except OSError:
        return None
