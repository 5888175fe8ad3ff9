"""Classifies photos with a trained ONU classifier: one line per image with its class and probability.

    python onu_predict.py photo.jpg more_photos/ --model_dir=/tmp/onu_train/export
    python onu_predict.py DATA/val --model_dir=/tmp/onu_train --json

--model_dir is an exported SavedModel version folder, an export folder of versions (the newest is used), a
training run's train_dir (its latest checkpoint, with the moving averages of the weights, built in-process with
onu_serving's graph), or a .tflite file of onu_export.py --tflite (run by LiteRT on the pixels eval's resize gives,
rounded to uint8 as an app would feed them; class names from the labels.txt beside it). Folders are searched
recursively; hidden files are ignored. Each image is sent to the serving signature as the bytes an encoded TFRecord
of it would hold: the file itself for an upright JPEG, else the upright image re-encoded (EXIF orientation applied,
as convert_to_tfrecord.py does), so predictions equal evaluation on encoded records.
A photo of more pixels than the model's limit (onu_export.py --max_image_pixels, recorded in the export; the
default for a train_dir or a .tflite) is refused from its header, before Pillow or TensorFlow decodes it.

Output: `path<TAB>class name<TAB>probability` per image, or `path<TAB>unknown (closest: F603, 0.41)` for a photo the
model does not take for any class it knows (onu_known: its known score is below the threshold the export fitted on
val photos); with --json one JSON object per line (path, class_id, class_name, probability, probabilities by class
name, known, known_score). stderr names the model used, and at the end how many photos were unknown. A model without
a calibration (exported before there was one) prints classes only, as it always did; a train_dir is calibrated on
its val photos as it loads. A file that cannot be
classified prints `error: <path>: <reason>` to stderr (and, with --json, an object with `error`); the others still
run. Exit code: 0 if at least one image was classified, 1 if none, 2 for a bad --model_dir or no paths.
"""
import functools
import itertools
import json
import os
import sys

from onu_lib import onu_cli  # first: quiet start
onu_cli.import_tensorflow()  # noqa: E402  (TensorFlow's start-up lines dropped)
from absl import app
from absl import flags
from ai_edge_litert.interpreter import Interpreter
import numpy as np
import tensorflow as tf

from onu_lib import onu_checkpoint
from onu_lib import onu_errors
from onu_lib import onu_converter
from onu_lib import onu_flags
from onu_lib import onu_photos
from onu_lib import onu_run_config
from onu_lib import onu_serving
from onu_lib import onu_settings
from onu_lib import onu_tflite
import onu_input


class Classifier:
    """A session running the serving signature (encoded image bytes in, probabilities out); max_image_pixels: the
    limit the model refuses images over (onu_photos.read_image_header applies it before Pillow decodes)."""

    def __init__(self, session, image_bytes, outputs, class_names, source,
                 max_image_pixels=onu_photos.MAX_IMAGE_PIXELS):
        self.max_image_pixels = max_image_pixels
        self.session = session
        self.image_bytes = image_bytes
        self.outputs = outputs
        self.class_names = list(class_names)
        self.source = source

    def classify(self, encoded_images):
        """Returns {probabilities, classes, class_names[, known, known_score]} as numpy arrays for a list of encoded
        images."""
        return self.session.run(self.outputs, {self.image_bytes: encoded_images})

    def close(self):
        """Releases the session."""
        self.session.close()


class TFLiteClassifier:
    """A TensorFlow Lite model run by LiteRT, one image at a time, on the pixels eval's resize gives them; its known
    threshold from the file beside it (onu_tflite.read_known), when there is one."""

    def __init__(self, model_path):
        self.interpreter = Interpreter(model_path=model_path)
        with onu_cli.tflite_lines_dropped():
            self.interpreter.allocate_tensors()
            self.outputs = onu_tflite.output_details(self.interpreter)
        self.input = self.interpreter.get_input_details()[0]
        size = int(self.input['shape'][1])
        num_classes = int(self.outputs[onu_serving.OUTPUT_PROBABILITIES]['shape'][-1])
        self.class_names = onu_tflite.read_labels(model_path) or [str(index) for index in range(num_classes)]
        self.known = onu_tflite.read_known(model_path) if onu_serving.OUTPUT_KNOWN_SCORE in self.outputs else None
        self.max_image_pixels = onu_photos.MAX_IMAGE_PIXELS
        if len(self.class_names) != num_classes:
            raise onu_errors.DataError(
                f'{model_path}: {num_classes} outputs but {len(self.class_names)} classes in the '
                f'{onu_tflite.LABELS_FILENAME} beside it; export it again with python onu_export.py --tflite=...')
        graph = tf.Graph()
        with graph.as_default():
            self.image_bytes = tf.compat.v1.placeholder(tf.string, [])
            self.pixels = onu_input.to_pixels(
                onu_serving.decode_within_limit(self.image_bytes, size, self.max_image_pixels))
        self.session = tf.compat.v1.Session(graph=graph)
        self.source = f'TensorFlow Lite model {model_path} (LiteRT)'

    def classify(self, encoded_images):
        """Returns {probabilities[, known, known_score]} as numpy arrays for a list of encoded images."""
        rows = []
        for encoded in encoded_images:
            pixels = self.session.run(self.pixels, {self.image_bytes: encoded})
            self.interpreter.set_tensor(self.input['index'], pixels[np.newaxis])
            self.interpreter.invoke()
            rows.append({name: self.interpreter.get_tensor(detail['index'])[0] for name, detail in self.outputs.items()})
        outputs = {onu_serving.OUTPUT_PROBABILITIES: np.array([row[onu_serving.OUTPUT_PROBABILITIES] for row in rows])}
        if self.known is not None:
            scores = np.array([row[onu_serving.OUTPUT_KNOWN_SCORE] for row in rows], np.float32).reshape(-1)
            outputs[onu_serving.OUTPUT_KNOWN_SCORE] = scores
            outputs[onu_serving.OUTPUT_KNOWN] = scores >= self.known['threshold']
        return outputs

    def close(self):
        """Releases the session."""
        self.session.close()


def _saved_model_classifier(version_dir):
    """Returns a Classifier over the serving signature of the SavedModel in version_dir."""
    graph = tf.Graph()
    session = tf.compat.v1.Session(graph=graph)
    try:
        meta_graph = tf.compat.v1.saved_model.load(session, onu_serving.SAVED_MODEL_TAGS, version_dir)
    except BaseException:
        session.close()
        raise
    signature = meta_graph.signature_def.get(onu_serving.SERVING_SIGNATURE)
    if signature is None or onu_serving.BYTES_INPUT not in signature.inputs:
        session.close()
        raise onu_errors.DataError(
            f'{version_dir}: no {onu_serving.SERVING_SIGNATURE} signature taking '
            f'{onu_serving.BYTES_INPUT}; export the model with python onu_export.py')
    image_bytes = graph.get_tensor_by_name(signature.inputs[onu_serving.BYTES_INPUT].name)
    outputs = {key: graph.get_tensor_by_name(info.name) for key, info in signature.outputs.items()}
    run_config = onu_serving.load_export_config(version_dir)
    num_classes = outputs[onu_serving.OUTPUT_PROBABILITIES].shape[-1]
    class_names = (run_config and run_config.class_names) or [str(index) for index in range(num_classes)]
    return Classifier(session, image_bytes, outputs, class_names, f'SavedModel {version_dir}',
                      onu_serving.export_max_image_pixels(run_config))


def export_instead(train_dir, checkpoint_path):
    """What to do when train_dir's newest checkpoint is damaged: export checkpoint_path and classify with that."""
    command = onu_errors.shell_command('onu_export.py', checkpoint_dir=train_dir, checkpoint_path=checkpoint_path)
    return (f'export it ({command}) and classify with '
            f'{onu_errors.shell_flag("model_dir", onu_serving.default_export_dir(train_dir))}')


def _checkpoint_classifier(train_dir, allow_raw_weights):
    """Returns a Classifier over the serving graph with train_dir's latest checkpoint."""
    run_config = onu_serving.load_training_config(train_dir)
    checkpoint_path = onu_checkpoint.find_checkpoint(
        train_dir, use_instead=functools.partial(export_instead, train_dir))
    try:
        calibration = onu_serving.calibrate_known(checkpoint_path, run_config, allow_raw_weights=allow_raw_weights)
    except onu_errors.DataError as e:
        print(f'warning: every photo is named a class, none unknown: {e}', file=sys.stderr, flush=True)
        calibration = None
    graph = tf.Graph()
    with graph.as_default():
        inputs, outputs = onu_serving.build_serving_graph(run_config, calibration=calibration)[
            onu_serving.SERVING_SIGNATURE]
    session = tf.compat.v1.Session(graph=graph)
    try:
        weights = onu_checkpoint.restore(session, checkpoint_path, run_config.moving_average_decay,
                                         allow_raw_weights)
    except BaseException:
        session.close()
        raise
    return Classifier(session, inputs[onu_serving.BYTES_INPUT], outputs, run_config.class_names,
                      f'checkpoint {checkpoint_path} ({weights} weights)')


def load_classifier(model_dir, allow_raw_weights=False):
    """Returns the Classifier of a SavedModel, the newest version in an export folder, or a train_dir."""
    versions = onu_serving.version_dirs(model_dir)
    try:
        if model_dir.endswith('.tflite') and os.path.isfile(model_dir):
            return TFLiteClassifier(model_dir)
        if onu_serving.is_saved_model(model_dir):
            return _saved_model_classifier(model_dir)
        if versions:
            return _saved_model_classifier(versions[-1][1])
        if onu_run_config.RunConfig.load(model_dir):
            return _checkpoint_classifier(model_dir, allow_raw_weights)
    except (tf.errors.OpError, OSError, RuntimeError, ValueError) as e:  # ValueError: LiteRT's, for a damaged file
        raise onu_errors.DataError(
            f'{model_dir}: cannot load the model ({onu_checkpoint.one_line(e)}); export it again with '
            f'python onu_export.py, or pass another --model_dir') from None
    raise onu_errors.DataError(
        f'{model_dir}: neither a SavedModel, nor a folder of exported versions, nor a training run, nor a .tflite '
        f'file; pass --model_dir=<train_dir>/export (after python onu_export.py) or the --train_dir of '
        f'onu_train.py')


def image_paths(paths):
    """Returns (files, [(path, reason)]): the files given and those in the folders given, recursively."""
    files, errors = [], []
    for path in paths:
        if os.path.isfile(path):
            files.append(path)
        elif os.path.isdir(path):
            for folder, subfolders, names in os.walk(path):
                subfolders[:] = sorted(name for name in subfolders if not onu_photos.is_hidden(name))
                files += [os.path.join(folder, name) for name in sorted(names)
                          if not onu_photos.is_hidden(name)]
        else:
            errors.append((path, 'no such file or folder'))
    return files, errors


def model_input_bytes(path, max_image_pixels=onu_photos.MAX_IMAGE_PIXELS):
    """Returns the bytes to classify for the image at path; UnreadableImage(reason) if it is not usable (also one of
    more than max_image_pixels, refused from its header before Pillow decodes it)."""
    try:
        info = onu_photos.read_image_info(path, max_pixels=max_image_pixels)
        payload, payload_format = onu_converter.encoded_payload(info)
    except OSError as e:
        raise onu_photos.UnreadableImage(f'unreadable ({e.strerror or e})') from None
    if payload is None:
        raise onu_photos.UnreadableImage(payload_format)  # the reason it could not be decoded
    return payload


def _prediction(path, class_names, outputs, row):
    """Returns the result of image number row of a batch's outputs as a dict."""
    probabilities = outputs[onu_serving.OUTPUT_PROBABILITIES][row]
    class_id = int(probabilities.argmax())
    prediction = {'path': path, 'class_id': class_id, 'class_name': class_names[class_id],
                  'probability': float(probabilities[class_id]),
                  'probabilities': {name: float(p) for name, p in zip(class_names, probabilities)}}
    if onu_serving.OUTPUT_KNOWN in outputs:
        prediction['known'] = bool(outputs[onu_serving.OUTPUT_KNOWN][row])
        prediction['known_score'] = float(outputs[onu_serving.OUTPUT_KNOWN_SCORE][row])
    return prediction


def _classify_batch(classifier, batch):
    """Yields (path, prediction, None) or (path, None, reason) for a batch of (path, bytes)."""
    try:
        outputs = classifier.classify([data for _, data in batch])
    except tf.errors.InvalidArgumentError as e:
        if len(batch) == 1:
            yield batch[0][0], None, f'cannot be decoded ({onu_checkpoint.one_line(e)})'
            return
        for item in batch:  # find the image that broke the batch; classify the rest
            yield from _classify_batch(classifier, [item])
        return
    for row, (path, _) in enumerate(batch):
        yield path, _prediction(path, classifier.class_names, outputs, row), None


def classify_files(classifier, paths, batch_size):
    """Yields (path, prediction, None) or (path, None, reason) for each path, in order."""
    batch = []
    for path in paths:
        try:
            batch.append((path, model_input_bytes(path, classifier.max_image_pixels)))
        except onu_photos.UnreadableImage as e:
            yield from _classify_batch(classifier, batch)
            batch = []
            yield path, None, str(e)
            continue
        if len(batch) == batch_size:
            yield from _classify_batch(classifier, batch)
            batch = []
    yield from _classify_batch(classifier, batch) if batch else ()


def print_result(path, prediction, reason, as_json, out, err):
    """Prints one image's prediction to out, or its error to err (and with as_json to out too)."""
    if prediction is None:
        print(f'error: {path}: {reason}', file=err, flush=True)
        if as_json:
            print(json.dumps({'path': path, 'error': reason}, ensure_ascii=False), file=out, flush=True)
    elif as_json:
        print(json.dumps(prediction, ensure_ascii=False), file=out, flush=True)
    elif prediction.get('known', True):
        print(f'{path}\t{prediction["class_name"]}\t{prediction["probability"]:.4f}', file=out, flush=True)
    else:
        print(f'{path}\tunknown (closest: {prediction["class_name"]}, {prediction["probability"]:.2f})', file=out,
              flush=True)


def predict(paths, model_dir, as_json=False, batch_size=32, allow_raw_weights=False, out=None, err=None):
    """Classifies the images at paths (files or folders), printing one line each; returns the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    if not paths:
        print('error: no images given; usage: python onu_predict.py PHOTO_OR_FOLDER... '
              '--model_dir=<train_dir>/export', file=err)
        return 2
    try:
        classifier = load_classifier(model_dir, allow_raw_weights)
    except onu_errors.UserError as e:
        print(f'error: {e}', file=err)
        return 2
    print(f'Classifying with the {classifier.source}', file=err, flush=True)
    files, missing = image_paths(paths)
    not_found = [(path, None, reason) for path, reason in missing]
    classified, unknown, calibrated = 0, 0, False
    try:
        for path, prediction, reason in itertools.chain(not_found,
                                                        classify_files(classifier, files, batch_size)):
            print_result(path, prediction, reason, as_json, out, err)
            classified += prediction is not None
            calibrated |= prediction is not None and 'known' in prediction
            unknown += prediction is not None and not prediction.get('known', True)
    finally:
        classifier.close()
    if calibrated:
        print(f'{unknown} of {classified} photos unknown: not like the val photos of any class the model knows',
              file=err, flush=True)
    if not classified:
        print(f'error: none of the {len(files) + len(missing)} paths could be classified', file=err)
        return 1
    return 0


# ---------------------------------------------------------------------------------------------
# Script.

FLAGS = flags.FLAGS


def define_flags():
    """Declares this script's flags."""
    onu_flags.define_batch_size_flag()
    flags.DEFINE_string('model_dir', onu_settings.DEFAULT_TRAIN_DIR,
                        'SavedModel version folder, export folder (newest version), train_dir '
                        '(latest checkpoint), or a .tflite file of onu_export.py --tflite.')
    flags.DEFINE_boolean('json', False, 'Print one JSON object per image instead of text lines.')
    onu_flags.define_allow_raw_weights_flag(
        'With a train_dir whose checkpoint has no moving averages: use the raw weights.')


def main(argv):
    return onu_cli.run_script(
        lambda: predict(argv[1:], FLAGS.model_dir, FLAGS.json, FLAGS.batch_size, FLAGS.allow_raw_weights),
        argv, takes_arguments=True)


if __name__ == '__main__':
    define_flags()
    app.run(main)
