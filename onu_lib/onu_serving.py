"""The serving graph and SavedModel export of a trained ONU classifier (the library of onu_export.py).

export_saved_model() writes a fresh inference graph (is_training=False) with the moving averages of
the weights of a checkpoint to export_dir/<global_step>/ (TF Serving's versioned layout). The version
is written to a hidden temporary folder inside export_dir and renamed only when complete, so a
folder named by a step is always a whole model; an existing version is never overwritten.

Signatures (each returns probabilities [batch, num_classes] float32, classes [batch] int64, class_names [batch]
string: the name of each image's most probable class, and with a calibration (every export since there was one):
known [batch] bool and known_score [batch] float32, the photo is of a class the model knows; the probabilities are
then temperature-scaled, see onu_known):
  serving_default  image_bytes: string [batch], encoded images (JPEG, PNG, GIF, BMP, WebP), decoded and
                   preprocessed exactly as evaluation does (onu_input.preprocess_for_eval). An image of more
                   than max_image_pixels (width x height read from its header; a GIF's frames each count) is
                   refused before it is decoded (refuse_too_many_pixels), naming the limit and its size.
  predict_images   images: float32 [batch, size, size, 3], RGB already resized to the model's size
                   and scaled to the model's range [-1, 1] (0 -> -1, 255 -> 1).
  predict_pixels   pixels: uint8 [batch, size, size, 3], RGB resized to the model's size, as a camera
                   gives them; scaled inside. onu_tflite converts this one (camera pixels in).
The graph does not apply EXIF orientation: send upright images (onu_predict.py turns them upright).
The version folder also holds assets.extra/run_config.json (the training run's RunConfig with an
`export` entry: global step, checkpoint, weights, max_image_pixels, known: the calibration's summary) and
assets.extra/labels.txt (id:name lines). calibrate_known() fits the calibration on the val split as it exports.

onu_train.py --export_every_n_epochs=N exports during training with PeriodicExportListener.
"""
import datetime
import json
import os
import re
import shutil
import sys
import time

import numpy as np
import tensorflow as tf

from onu_lib import onu_best
from onu_lib import onu_checkpoint
from onu_lib import onu_dataset
from onu_lib import onu_errors
from onu_lib import onu_known
from onu_lib import onu_photos
from onu_lib import onu_precision
import onu_input
import onu_model
from onu_lib import onu_run_config
from onu_lib import onu_run_folder

EXPORT_SUBDIR = 'export'  # default export_dir: train_dir/export
SERVING_SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY  # 'serving_default'
IMAGES_SIGNATURE = 'predict_images'
PIXELS_SIGNATURE = 'predict_pixels'
BYTES_INPUT = 'image_bytes'
IMAGES_INPUT = 'images'
PIXELS_INPUT = 'pixels'
OUTPUT_PROBABILITIES = 'probabilities'
OUTPUT_CLASSES = 'classes'
OUTPUT_CLASS_NAMES = 'class_names'
OUTPUT_KNOWN = 'known'
OUTPUT_KNOWN_SCORE = 'known_score'
KNOWN_CALIBRATION_EXAMPLES = 2000  # val photos at most (spread over the split) the calibration fits
SAVED_MODEL_TAGS = [tf.saved_model.SERVING]
METADATA_SUBDIR = 'assets.extra'  # TF Serving's place for files that are not part of the graph
EXPORT_LOG_FILENAME = 'exports.jsonl'
_TEMP_DIR = re.compile(r'^\.tmp-(\d+)-(\d+)$')  # .tmp-<step>-<pid>, hidden from TF Serving


def default_export_dir(checkpoint_dir):
    """Returns where the exports of checkpoint_dir go: checkpoint_dir/export, but for an evaluator's best/ folder
    (swapped whole at each new best, exports and all) its EVAL_DIR/export, where --export_best writes."""
    if os.path.isfile(os.path.join(checkpoint_dir, onu_best.BEST_FILENAME)):
        return os.path.join(os.path.dirname(os.path.abspath(checkpoint_dir)), EXPORT_SUBDIR)
    return os.path.join(checkpoint_dir, EXPORT_SUBDIR)


def load_training_config(train_dir):
    """Returns the RunConfig onu_train.py saved in train_dir; DataError if there is none."""
    run_config = onu_run_config.RunConfig.load(train_dir)
    if not run_config:
        raise onu_errors.DataError(
            f'{onu_run_config.path_in(train_dir)} not found: pass the --checkpoint_dir (train_dir) '
            f'that onu_train.py wrote, which holds the model, image size and class names')
    return run_config


def model_outputs(images, run_config, reuse):
    """Returns (logits float32 [batch, classes], known features: a tensor per block, their blocks) of the model on
    [-1, 1] images: what onu_known calibrates on and scores."""
    logits, end_points = onu_model.inference(images, run_config.num_classes, run_config.model,
                                             is_training=False, create_aux_logits=False, reuse=reuse)
    columns, blocks = onu_model.known_features(end_points, run_config.model)
    return tf.cast(logits, tf.float32), columns, blocks


def known_constants(calibration):
    """The parameters of a calibration's served score as graph constants, made once for every signature to share:
    {block name: (class means, precision, centre, scale)}."""
    with tf.compat.v1.name_scope('known'):
        return {name: (tf.constant(params['means'], tf.float32), tf.constant(params['precision'], tf.float32),
                       params['centre'], params['scale'])
                for name, params in calibration.params.items()}


def known_score(columns, blocks, constants):
    """onu_known's served score (layer_distance) of the features, a tensor per block of blocks (never one
    concatenated tensor: int8 quantizes each tensor to one range, and the blocks' ranges differ); constants:
    known_constants."""
    standardized = []
    for (name, _), block in zip(blocks, columns):
        means, precision, centre, scale = constants[name]
        centred = block[:, tf.newaxis, :] - means  # [batch, classes, d]
        nearest = -tf.reduce_min(tf.reduce_sum(tf.tensordot(centred, precision, axes=1) * centred, axis=2), axis=1)
        standardized.append((nearest - centre) / scale)
    return tf.reduce_min(tf.stack(standardized, axis=1), axis=1)


def _classifier_outputs(images, run_config, reuse, calibration=None, constants=None):
    """Returns {probabilities, classes, class_names} of the model on [-1, 1] images, with a calibration (and its
    known_constants) also {known, known_score} and temperature-scaled probabilities."""
    logits, columns, blocks = model_outputs(images, run_config, reuse)
    outputs = {}
    if calibration is not None:
        logits = logits / calibration.temperature
        outputs[OUTPUT_KNOWN_SCORE] = tf.identity(known_score(columns, blocks, constants), name=OUTPUT_KNOWN_SCORE)
        outputs[OUTPUT_KNOWN] = tf.greater_equal(outputs[OUTPUT_KNOWN_SCORE], calibration.threshold, name=OUTPUT_KNOWN)
    probabilities = tf.nn.softmax(logits, name='probabilities')
    classes = tf.argmax(probabilities, axis=1, name='classes')
    class_names = tf.gather(tf.constant(run_config.class_names), classes, name='class_names')
    return {OUTPUT_PROBABILITIES: probabilities, OUTPUT_CLASSES: classes, OUTPUT_CLASS_NAMES: class_names, **outputs}


def val_outputs(checkpoint_path, run_config, pixels, allow_raw_weights=False):
    """Returns (logits, known features, blocks) of the checkpoint's model on uint8 pixels [n, size, size, 3]."""
    with tf.Graph().as_default() as graph:
        batch = tf.compat.v1.placeholder(tf.uint8, [None] + list(pixels.shape[1:]))
        logits, columns, blocks = model_outputs(onu_input.pixels_to_model_range(batch), run_config, reuse=None)
        features = tf.concat(columns, axis=1)
        with tf.compat.v1.Session(graph=graph, config=onu_precision.session_config(hide_gpus=True)) as session:
            onu_checkpoint.restore(session, checkpoint_path, run_config.moving_average_decay, allow_raw_weights)
            parts = [session.run([logits, features], {batch: pixels[start:start + 64]})
                     for start in range(0, len(pixels), 64)]
    return np.concatenate([part[0] for part in parts]), np.concatenate([part[1] for part in parts]), blocks


def known_val_pixels(run_config, data_dir=None):
    """Returns (uint8 pixels, labels) of up to KNOWN_CALIBRATION_EXAMPLES val photos of the run's data (data_dir, or
    the run's own), spread over the split; DataError naming the fix when there are none."""
    data_dir = data_dir or run_config.data_dir
    try:
        return onu_input.eval_pixels(run_config.split_info('val', data_dir), run_config.image_size,
                                     KNOWN_CALIBRATION_EXAMPLES)
    except onu_errors.DataError as e:
        raise onu_errors.DataError(
            f'the model\'s known threshold is fitted on the val split, and there is none at hand '
            f'({str(e).split("; ")[0]}): pass --data_dir=<the training data>') from None


def calibrate_known(checkpoint_path, run_config, data_dir=None, known_recall=onu_known.DEFAULT_KNOWN_RECALL,
                    allow_raw_weights=False):
    """Fits the temperature and known threshold of the checkpoint's model on val photos (onu_known.calibrate);
    returns the Calibration. DataError when the val split is missing or has fewer than 2 photos of a class."""
    pixels, labels = known_val_pixels(run_config, data_dir)
    logits, features, blocks = val_outputs(checkpoint_path, run_config, pixels, allow_raw_weights)
    try:
        return onu_known.calibrate(logits, features, labels, blocks, known_recall)
    except ValueError as e:
        raise onu_errors.DataError(f'{run_config.split_info("val", data_dir or run_config.data_dir).data_dir}: {e}; '
                                   f'add val photos') from None


def calibration_line(calibration):
    """One line saying what a calibration accepts, for the export's output."""
    figures = calibration.figures
    precision = 'none' if figures['precision_known'] is None else f'{figures["precision_known"]:.3f}'
    return (f'known: {calibration.score} >= {calibration.threshold:.3f} keeps {figures["val_known"]:.1%} of '
            f'{figures["val_examples"]} val photos (each scored by a fit to the others; --known_recall='
            f'{figures["known_recall"]:g}), precision @ 1 {precision} on those; temperature '
            f'{calibration.temperature:.2f}: expected calibration error {figures["ece_before"]:.3f} -> '
            f'{figures["ece_after"]:.3f}')


# ---------------------------------------------------------------------------------------------
# The pixel limit: every image's size read from its header, in graph ops, before it is decoded.
#
# The formats and magic bytes are those TensorFlow's decode_image tells apart (onu_input.decode_image_bytes decodes
# what tf.io.is_jpeg accepts as a JPEG, everything else with decode_image). Bytes of no known format pass: the
# decoder refuses them without allocating an image.

_HEADER_BYTES = 32  # the fixed-offset fields below all lie in the first 32 bytes (zeros past the end of short data)
_PNG_MAGIC = b'\x89PNG\r\n\x1a\n'
_GIF_MAGIC = b'GIF8'
_BMP_MAGIC = b'BM'
_GIF_EXTENSION, _GIF_IMAGE = 0x21, 0x2C  # the blocks that may precede the trailer (0x3B)


def _starts_with(data, prefix, offset=0):
    """A bool tensor: the string data holds prefix at offset."""
    return tf.equal(tf.strings.substr(data, offset, len(prefix)), prefix)


def _uint(header, offset, count, big_endian=False):
    """The unsigned integer (int64) of count bytes of the uint8 [n] header at offset."""
    weights = [256 ** (count - 1 - i if big_endian else i) for i in range(count)]
    return tf.reduce_sum(tf.cast(header[offset:offset + count], tf.int64) * tf.constant(weights, tf.int64))


def _signed32(value):
    """An unsigned 32-bit int64 value read as a signed one."""
    return tf.where(value >= 2 ** 31, value - 2 ** 32, value)


def _webp_size(padded, header):
    """(width, height) of a WebP's first chunk: VP8 (lossy), VP8L (lossless) or VP8X (extended: the canvas)."""
    lossless = _uint(header, 21, 4)
    return tf.case([
        (_starts_with(padded, b'VP8 ', 12), lambda: (tf.bitwise.bitwise_and(_uint(header, 26, 2), 0x3FFF),
                                                      tf.bitwise.bitwise_and(_uint(header, 28, 2), 0x3FFF))),
        (_starts_with(padded, b'VP8L', 12), lambda: (
            tf.bitwise.bitwise_and(lossless, 0x3FFF) + 1,
            tf.bitwise.bitwise_and(tf.bitwise.right_shift(lossless, tf.constant(14, tf.int64)), 0x3FFF) + 1)),
        (_starts_with(padded, b'VP8X', 12), lambda: (_uint(header, 24, 3) + 1, _uint(header, 27, 3) + 1))],
        default=lambda: (tf.constant(0, tf.int64), tf.constant(0, tf.int64)))


def _gif_frames(data):
    """(largest frame width, largest frame height, frames) of a GIF, from its image descriptors.

    TensorFlow's decoder (giflib's DGifSlurp) makes a canvas of the largest frame (not the logical screen the
    header names) and reads every frame into memory, even when only the first is kept. The blocks are walked:
    extensions and frame data are chains of sub-blocks of at most 255 bytes, so a 1 MB GIF takes about 4000 steps.
    """
    octets = tf.cast(tf.io.decode_raw(data, tf.uint8), tf.int64)
    length = tf.size(octets, out_type=tf.int64)

    def byte(index):
        index = tf.convert_to_tensor(index, tf.int64)
        return tf.where(index < length, tf.gather(octets, tf.minimum(index, length - 1)), tf.constant(0, tf.int64))

    def u16(index):
        return byte(index) + 256 * byte(index + 1)

    def colour_table(flags):  # bytes of the colour table a flags byte announces
        return tf.where(tf.bitwise.bitwise_and(flags, 0x80) > 0,
                        3 * tf.bitwise.left_shift(tf.constant(2, tf.int64), tf.bitwise.bitwise_and(flags, 7)),
                        tf.constant(0, tf.int64))

    def step(position, in_blocks, frames, width, height, done):
        code = byte(position)
        is_image = tf.logical_and(tf.logical_not(in_blocks), tf.equal(code, _GIF_IMAGE))
        is_extension = tf.logical_and(tf.logical_not(in_blocks), tf.equal(code, _GIF_EXTENSION))
        after_image = position + 10 + colour_table(byte(position + 9)) + 1  # descriptor, table, LZW code size
        next_position = tf.where(in_blocks, position + code + 1,  # a sub-block, or the 0 that ends the chain
                                 tf.where(is_image, after_image, position + 2))
        return (next_position,
                tf.logical_or(is_image, tf.logical_or(is_extension, tf.logical_and(in_blocks, code > 0))),
                frames + tf.cast(is_image, tf.int64),
                tf.where(is_image, tf.maximum(width, u16(position + 5)), width),
                tf.where(is_image, tf.maximum(height, u16(position + 7)), height),
                tf.logical_not(tf.logical_or(in_blocks, tf.logical_or(is_image, is_extension))))  # trailer or junk

    start = 13 + colour_table(byte(10))  # header, logical screen, global colour table
    zero = tf.constant(0, tf.int64)
    _, _, frames, width, height, _ = tf.while_loop(
        lambda position, in_blocks, frames, width, height, done: tf.logical_and(
            tf.logical_not(done), position < length),
        step, (start, tf.constant(False), zero, zero, zero, tf.constant(False)), parallel_iterations=1)
    return width, height, frames


def image_header_size(encoded):
    """(width, height, frames) int64 of encoded image bytes, read from the header without decoding: JPEG (as
    tf.io.is_jpeg tells it, which decode_image_bytes decodes as JPEG), PNG, GIF (its largest frame; frames: how many),
    BMP (a top-down one's negative height counted as positive) and WebP; (0, 0, 1) for bytes of another kind."""
    padded = tf.strings.join([encoded, tf.constant(b'\0' * _HEADER_BYTES)])
    header = tf.io.decode_raw(tf.strings.substr(padded, 0, _HEADER_BYTES), tf.uint8)
    one = tf.constant(1, tf.int64)

    def jpeg():
        shape = tf.cast(tf.io.extract_jpeg_shape(encoded), tf.int64)  # [height, width, channels], header only
        return shape[1], shape[0], one

    def png():
        return _uint(header, 16, 4, big_endian=True), _uint(header, 20, 4, big_endian=True), one

    def bmp():
        return tf.abs(_signed32(_uint(header, 18, 4))), tf.abs(_signed32(_uint(header, 22, 4))), one

    def webp():
        width, height = _webp_size(padded, header)
        return width, height, one

    def other():
        return tf.constant(0, tf.int64), tf.constant(0, tf.int64), one

    is_webp = tf.logical_and(_starts_with(padded, b'RIFF'), _starts_with(padded, b'WEBP', 8))
    kinds = [tf.io.is_jpeg(encoded), _starts_with(padded, _PNG_MAGIC), _starts_with(padded, _GIF_MAGIC),
             _starts_with(padded, _BMP_MAGIC), is_webp]
    kind = tf.constant(len(kinds), tf.int32)  # other: the last branch
    for index in reversed(range(len(kinds))):  # the first match wins, as in TensorFlow's decoder
        kind = tf.where(kinds[index], index, kind)
    return tf.switch_case(kind, [jpeg, png, lambda: _gif_frames(encoded), bmp, webp, other])


def refuse_too_many_pixels(encoded, max_image_pixels):
    """Returns encoded (a string scalar) behind a check that its header's width x height x frames is at most
    max_image_pixels: whatever decodes the result runs only if it is; else InvalidArgumentError names both."""
    width, height, frames = image_header_size(encoded)
    pixels = tf.cast(width, tf.float64) * tf.cast(height, tf.float64) * tf.cast(frames, tf.float64)  # no overflow
    text = tf.strings.as_string
    frames_note = tf.where(frames > 1, tf.strings.join([' (', text(frames), ' frames)']), '')
    message = tf.strings.join([
        'too many pixels: ', text(width), ' x ', text(height), frames_note, ' = ',
        text(tf.cast(tf.minimum(pixels, 2.0 ** 62), tf.int64)), ' pixels, ',
        onu_photos.over_the_limit(max_image_pixels)])
    check = tf.debugging.Assert(pixels <= max_image_pixels, [message], name='max_image_pixels')
    with tf.control_dependencies([check]):
        return tf.identity(encoded)


def decode_within_limit(encoded, size, max_image_pixels):
    """The [size, size, 3] float32 model input of one encoded image, decoded only if within max_image_pixels."""
    return onu_input.preprocess_for_eval(
        onu_input.decode_image_bytes(refuse_too_many_pixels(encoded, max_image_pixels)), size)


def build_serving_graph(run_config, max_image_pixels=onu_photos.MAX_IMAGE_PIXELS, calibration=None):
    """Builds the serving signatures in the default graph; returns {name: (inputs, outputs)}. serving_default
    refuses an image of more than max_image_pixels before decoding it; with a Calibration, known outputs too."""
    size = run_config.image_size
    if calibration is not None and calibration.score != onu_known.SERVED_SCORE:
        raise ValueError(f'the serving graph computes {onu_known.SERVED_SCORE}, not {calibration.score}')
    known = {'calibration': calibration, 'constants': calibration and known_constants(calibration)}
    with tf.compat.v1.name_scope('from_bytes'):
        image_bytes = tf.compat.v1.placeholder(tf.string, [None], name=BYTES_INPUT)
        decoded = tf.map_fn(  # plain TensorFlow ops: nothing for AutoGraph to convert (it costs start-up time)
            tf.autograph.experimental.do_not_convert(
                lambda encoded: decode_within_limit(encoded, size, max_image_pixels)),
            image_bytes, fn_output_signature=tf.TensorSpec([size, size, 3], tf.float32))
        bytes_outputs = _classifier_outputs(decoded, run_config, reuse=None, **known)
    with tf.compat.v1.name_scope('from_images'):
        images = tf.compat.v1.placeholder(tf.float32, [None, size, size, 3], name=IMAGES_INPUT)
        images_outputs = _classifier_outputs(images, run_config, reuse=True, **known)
    with tf.compat.v1.name_scope('from_pixels'):
        pixels = tf.compat.v1.placeholder(tf.uint8, [None, size, size, 3], name=PIXELS_INPUT)
        pixels_outputs = _classifier_outputs(onu_input.pixels_to_model_range(pixels), run_config, reuse=True,
                                             **known)
    return {SERVING_SIGNATURE: ({BYTES_INPUT: image_bytes}, bytes_outputs),
            IMAGES_SIGNATURE: ({IMAGES_INPUT: images}, images_outputs),
            PIXELS_SIGNATURE: ({PIXELS_INPUT: pixels}, pixels_outputs)}


def _write_saved_model(directory, checkpoint_path, run_config, allow_raw_weights, max_image_pixels, calibration):
    """Writes the serving graph with the checkpoint's weights as a SavedModel; returns the weights used."""
    with tf.Graph().as_default() as graph:
        signatures = build_serving_graph(run_config, max_image_pixels, calibration)
        # The CPU is enough to copy weights, and keeps an export during training off the GPU.
        with tf.compat.v1.Session(graph=graph, config=onu_precision.session_config(hide_gpus=True)) as session:
            weights = onu_checkpoint.restore(session, checkpoint_path, run_config.moving_average_decay,
                                             allow_raw_weights)
            builder = tf.compat.v1.saved_model.Builder(directory)
            builder.add_meta_graph_and_variables(
                session, SAVED_MODEL_TAGS, strip_default_attrs=True,
                signature_def_map={
                    name: tf.compat.v1.saved_model.predict_signature_def(inputs, outputs)
                    for name, (inputs, outputs) in signatures.items()})
            builder.save()
    return weights


def _write_metadata(directory, run_config, export_info):
    """Writes the run configuration (with export_info) and labels.txt into directory/assets.extra."""
    metadata_dir = os.path.join(directory, METADATA_SUBDIR)
    run_config.replace(export=export_info).save(metadata_dir)
    onu_dataset.write_labels(os.path.join(metadata_dir, onu_dataset.LABELS_FILENAME),
                             run_config.class_names)


def _remove_stale_temp_dirs(export_dir):
    """Removes temporary folders left in export_dir by exports whose process died mid-way."""
    for name in os.listdir(export_dir):
        match = _TEMP_DIR.match(name)
        if match and not onu_run_folder.process_alive(int(match.group(2))):
            shutil.rmtree(os.path.join(export_dir, name), ignore_errors=True)


def _publish(temp_dir, version_dir):
    """Renames the finished temporary folder to its version folder (atomic on one file system)."""
    os.rename(temp_dir, version_dir)


def export_saved_model(checkpoint_path, run_config, export_dir, allow_raw_weights=False,
                       max_image_pixels=onu_photos.MAX_IMAGE_PIXELS, known_recall=onu_known.DEFAULT_KNOWN_RECALL,
                       data_dir=None):
    """Exports checkpoint_path as export_dir/<global step>/ (an existing one is left unchanged); returns that folder.
    serving_default refuses images of more than max_image_pixels (recorded in the export's run_config.json). The
    known threshold keeps known_recall of the val photos of data_dir (default: the run's); DataError without them."""
    started = time.time()
    step = onu_checkpoint.checkpoint_step(checkpoint_path)
    version_dir = os.path.join(export_dir, str(step))
    if os.path.exists(version_dir):
        print(f'{version_dir} already exists: its SavedModel is left unchanged; delete it to export step {step} '
              f'again, or choose another --export_dir', flush=True)
        return version_dir
    calibration = calibrate_known(checkpoint_path, run_config, data_dir, known_recall, allow_raw_weights)
    os.makedirs(export_dir, exist_ok=True)
    _remove_stale_temp_dirs(export_dir)
    temp_dir = os.path.join(export_dir, f'.tmp-{step}-{os.getpid()}')
    shutil.rmtree(temp_dir, ignore_errors=True)  # this process's own leftover, if any
    try:
        weights = _write_saved_model(temp_dir, checkpoint_path, run_config, allow_raw_weights, max_image_pixels,
                                     calibration)
        _write_metadata(temp_dir, run_config, {
            'global_step': step,
            'checkpoint_path': os.path.abspath(checkpoint_path),
            'weights': weights,
            'max_image_pixels': max_image_pixels,
            'known': calibration.summary(),
            'exported_at': datetime.datetime.now().isoformat(timespec='seconds'),
            'tensorflow_version': tf.__version__,
        })
        _publish(temp_dir, version_dir)
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    print(f'Exported {checkpoint_path} ({run_config.model} {run_config.image_size}x'
          f'{run_config.image_size}, {weights} weights, classes {", ".join(run_config.class_names)}) '
          f'to {version_dir} in {time.time() - started:.1f} s; {calibration_line(calibration)}', flush=True)
    return version_dir


def version_dirs(export_dir):
    """Returns [(step, folder)] of the complete versions in export_dir, oldest first."""
    if not os.path.isdir(export_dir):
        return []
    versions = [(int(name), os.path.join(export_dir, name)) for name in os.listdir(export_dir)
                if name.isdigit()]
    return sorted((step, path) for step, path in versions if is_saved_model(path))


def is_saved_model(directory):
    """Returns whether directory holds a SavedModel."""
    return os.path.isfile(os.path.join(directory, 'saved_model.pb'))


def load_export_config(version_dir):
    """Returns the RunConfig saved with an exported model (None if it has none)."""
    return onu_run_config.RunConfig.load(os.path.join(version_dir, METADATA_SUBDIR))


def retry_command(checkpoint_path, export_dir):
    """The command that exports checkpoint_path into export_dir by hand, after a periodic export failed."""
    return onu_errors.shell_command('onu_export.py', checkpoint_path=checkpoint_path, export_dir=export_dir)


def export_max_image_pixels(run_config):
    """The pixel limit an export's RunConfig records (the default for an export made before there was one)."""
    return ((run_config and run_config.export) or {}).get('max_image_pixels', onu_photos.MAX_IMAGE_PIXELS)


def export_known(run_config):
    """The calibration summary an export's RunConfig records (onu_known.Calibration.summary), None before there was
    one."""
    return ((run_config and run_config.export) or {}).get('known')


class PeriodicExportListener(tf.compat.v1.train.CheckpointSaverListener):
    """Exports the first checkpoint saved at or after each N-epoch boundary, logging each try in exports.jsonl.

    A failed export is reported in one line and training goes on, except on a full disk or a read-only folder.
    """

    def __init__(self, checkpoint_dir, run_config, export_dir, every_n_epochs, examples_per_step):
        self._checkpoint_dir = checkpoint_dir
        self._run_config = run_config
        self._export_dir = export_dir
        self._examples_per_period = every_n_epochs * run_config.num_examples_per_epoch
        self._examples_per_step = examples_per_step
        self._last_period = None

    def after_save(self, session, global_step_value):
        period = int(global_step_value) * self._examples_per_step // self._examples_per_period  # whole N epochs
        if self._last_period is None:  # the checkpoint saved when the session starts: a baseline
            self._last_period = period
        elif period > self._last_period:
            self._last_period = period
            self.export(int(global_step_value))

    def export(self, step):
        """Exports the latest checkpoint, logging the outcome instead of raising."""
        started = time.time()
        epoch = step * self._examples_per_step / self._run_config.num_examples_per_epoch
        entry = {'step': step, 'epoch': round(epoch, 3),
                 'checkpoint_path': tf.train.latest_checkpoint(self._checkpoint_dir)}
        try:
            entry['version_dir'] = export_saved_model(entry['checkpoint_path'], self._run_config,
                                                      self._export_dir)
        except Exception as e:  # pylint: disable=broad-except  (a failed export does not stop training...)
            reason = onu_run_folder.write_failure(e, self._export_dir)
            if reason is not None:  # ... unless the disk is full or read-only: then nothing else can be written
                raise onu_run_folder.write_failed(self._export_dir, reason, 'exporting a SavedModel',
                                                  self._checkpoint_dir) from None
            entry['error'] = f'{type(e).__name__}: {onu_checkpoint.one_line(e)}'
            print(f'warning: export of step {step} failed ({entry["error"]}); training continues; '
                  f'retry with {retry_command(entry["checkpoint_path"], self._export_dir)}',
                  file=sys.stderr, flush=True)
        entry['seconds'] = round(time.time() - started, 2)
        self._log(entry)

    def _log(self, entry):
        """Appends entry to export_dir/exports.jsonl; a write failure is only reported."""
        try:
            os.makedirs(self._export_dir, exist_ok=True)
            with open(os.path.join(self._export_dir, EXPORT_LOG_FILENAME), 'a', encoding='utf-8') as f:
                f.write(json.dumps(entry, ensure_ascii=False) + '\n')
        except OSError as e:
            print(f'warning: cannot record the export in {self._export_dir}: {e}', file=sys.stderr,
                  flush=True)
