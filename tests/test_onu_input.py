"""Tests of onu_input.py: shapes, pixel parity across the three formats, preprocessing, errors."""

import dataclasses
import glob
import io
import math
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from PIL import ImageOps

from conftest import STUDY_AUGMENTATION_RANGES, assert_spans, colour_effect, mid_colour_image
from onu_lib import onu_errors
from onu_lib import onu_photos
from onu_lib import onu_dataset
from onu_lib import onu_decoded_cache
import onu_input
from onu_lib import onu_converter

IMAGE_SIZE = 32
FORMATS = onu_dataset.DATA_FORMATS
# README's stated bound: mean |fast training decode - exact eval decode| per photo, as a share of 255.
FAST_DECODE_BOUND = {299: 5.0 / 255.0, 64: 9.0 / 255.0}
ROTATION_ONLY = onu_input.AugmentOptions({'rotation'})


def _run_to_end(fetches):
    """Runs fetches in a new session until OutOfRangeError; returns the list of results."""
    results = []
    with tf.compat.v1.Session() as sess:
        while True:
            try:
                results.append(sess.run(fetches))
            except tf.errors.OutOfRangeError:
                return results


def _eval_batch(info, batch_size, image_size=IMAGE_SIZE, with_filenames=False):
    """Returns the tensors of info's eval batches."""
    return onu_input.next_batch(onu_input.eval_batches(info, batch_size, image_size, with_filenames))


def _in_memory(info):
    """The decoded-epoch cache auto picks for the tiny data: memory."""
    return onu_decoded_cache.MemoryCache(info.num_examples)


def _augmented_inputs(info, batch_size, augment=onu_input.AugmentOptions.default(), **pipeline):
    """Returns training (images, labels) of info, augmented in the pipeline, the decoded epoch in memory."""
    return onu_input.distorted_inputs(
        onu_input.training_batches(info, batch_size, IMAGE_SIZE, _in_memory(info), augment=augment, **pipeline))


def _eval_examples(split, data_dir, data_format, batch_size=3, image_size=IMAGE_SIZE):
    """Returns (images, labels, batch sizes) of one full eval pass."""
    with tf.Graph().as_default():
        info = onu_dataset.describe(data_dir).split(split, data_format)
        batches = _run_to_end(_eval_batch(info, batch_size, image_size))
    images = np.concatenate([images for images, _ in batches])
    labels = np.concatenate([labels for _, labels in batches])
    return images, labels, [len(labels) for _, labels in batches]


def _evaluate(tensors):
    """Returns the value of tensors (built in the current default graph)."""
    with tf.compat.v1.Session() as sess:
        return sess.run(tensors)


def _write_jpeg_with_bad_scan(path, pattern_image):
    """Writes a JPEG whose header (and end marker) are fine but whose scan data is noise."""
    buffer = io.BytesIO()
    pattern_image.save(buffer, 'JPEG', quality=90)
    data = buffer.getvalue()
    scan_start = data.index(b'\xff\xda') + 2
    scan_start += int.from_bytes(data[scan_start:scan_start + 2], 'big')
    noise = np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes()
    with open(path, 'wb') as f:
        f.write(data[:scan_start] + noise + b'\xff\xd9')


@pytest.fixture(scope='module')
def messy_records_dir(messy_data_dir, tmp_path_factory):
    """A copy of messy_data_dir whose val/F603 also holds every messy file, converted to both kinds."""
    data_dir = str(tmp_path_factory.mktemp('messy_records') / 'data')
    shutil.copytree(messy_data_dir, data_dir)
    train_dir = os.path.join(data_dir, 'train', 'F603')
    for name in os.listdir(train_dir):
        if os.path.isfile(os.path.join(train_dir, name)):
            shutil.copy(os.path.join(train_dir, name), os.path.join(data_dir, 'val', 'F603', name))
    onu_converter.convert(onu_dataset.describe(data_dir), processes=1)
    return data_dir


# ---------------------------------------------------------------------------------------------
# Shapes, dtypes, coverage.

@pytest.mark.parametrize('data_format', FORMATS)
def test_distorted_inputs_shapes_and_range(tiny_data_dir, data_format):
    with tf.Graph().as_default():
        images, labels = _augmented_inputs(onu_dataset.describe(tiny_data_dir).split('train', data_format), 5, seed=1)
        assert images.shape.as_list() == [5, IMAGE_SIZE, IMAGE_SIZE, 3]
        assert labels.shape.as_list() == [5]
        assert (images.dtype, labels.dtype) == (tf.float32, tf.int32)
        images_value, labels_value = _evaluate((images, labels))
    assert images_value.min() >= -1.0 and images_value.max() <= 1.0
    assert images_value.max() - images_value.min() > 0.5
    assert set(labels_value) <= {0, 1}


@pytest.mark.parametrize('data_format', FORMATS)
def test_inputs_shapes_and_each_example_once(tiny_data_dir, data_format):
    info = onu_dataset.describe(tiny_data_dir).split('train', data_format)
    assert (info.num_examples, info.class_names) == (8, ('F603', 'F663N'))
    with tf.Graph().as_default():
        images, labels = _eval_batch(onu_dataset.describe(tiny_data_dir).split('train', data_format), 3)
        assert images.shape.as_list() == [None, IMAGE_SIZE, IMAGE_SIZE, 3]
        assert (images.dtype, labels.dtype) == (tf.float32, tf.int32)
    images, labels, batch_sizes = _eval_examples('train', tiny_data_dir, data_format)
    assert batch_sizes == [3, 3, 2]  # the final partial batch is kept
    assert np.bincount(labels).tolist() == [4, 4]
    distinct = {tuple(np.round(image.mean(axis=(0, 1)), 4)) for image in images}
    assert len(distinct) == 8  # eight different photos, none twice
    assert images.min() >= -1.0 and images.max() <= 1.0


# ---------------------------------------------------------------------------------------------
# Pixel parity: the same photo gives the same eval pixels in every format.

def _differences_from_raw(data_dir):
    """Returns {format: mean absolute difference per val photo from raw mode, on the [0, 1] scale}."""
    results = {fmt: _eval_examples('val', data_dir, fmt) for fmt in FORMATS}
    reference_images, reference_labels, _ = results['raw']
    differences = {}
    for fmt in ('images', 'encoded'):
        images, labels, _ = results[fmt]
        np.testing.assert_array_equal(labels, reference_labels)  # same photos, same order
        differences[fmt] = np.abs(images - reference_images).mean(axis=(1, 2, 3)) / 2.0
    return differences


def test_pixel_parity_across_formats(tiny_data_dir):
    for fmt, differences in _differences_from_raw(tiny_data_dir).items():
        assert differences.max() < 1.0 / 255.0, (fmt, differences)


def test_pixel_parity_across_formats_on_messy_files(messy_records_dir):
    """EXIF-rotated, CMYK, PNG named .jpg, RGBA, BMP, grayscale: the same pixels in every format."""
    differences = _differences_from_raw(messy_records_dir)
    assert differences['images'].max() < 1.0 / 255.0, differences['images']
    # The converter re-encodes EXIF-rotated and CMYK JPEGs as JPEG, which loses a little per photo.
    assert differences['encoded'].mean() < 1.0 / 255.0, differences['encoded']


def test_messy_files_decode_upright_rgb(messy_records_dir, pattern_image):
    """EXIF-rotated, PNG named .jpg, RGBA, BMP, CMYK: all look like the upright pattern."""
    width, height = pattern_image.size
    expected = np.asarray(pattern_image, np.float32) / 255.0
    info = onu_dataset.describe(messy_records_dir).split('val', 'images')
    names = [os.path.basename(path) for path in info.files]
    assert 'exif_rotated.jpg' in names and 'png_named.jpg' in names and 'truncated.jpg' not in names
    with tf.Graph().as_default():
        path = tf.compat.v1.placeholder(tf.string, [])
        orientation = tf.compat.v1.placeholder(tf.int32, [])
        upright = onu_input.apply_exif_orientation(onu_input.decode_image_bytes(tf.io.read_file(path)),
                                                   orientation)
        with tf.compat.v1.Session() as sess:
            for name, file_path, file_orientation in zip(names, info.files, info.orientations):
                image = sess.run(upright, {path: file_path, orientation: file_orientation})
                assert image.shape == (height, width, 3), name
                if name != 'gray.jpg':
                    assert np.abs(image / 255.0 - expected).mean() < 0.03, name


@pytest.mark.parametrize('orientation', range(1, 9))
def test_exif_orientation_matches_pillow(tmp_path, pattern_image, orientation):
    exif = Image.Exif()
    exif[onu_photos.EXIF_ORIENTATION_TAG] = orientation
    path = str(tmp_path / 'photo.png')
    pattern_image.save(path, 'PNG', exif=exif.tobytes())
    with Image.open(path) as image:
        expected = np.asarray(ImageOps.exif_transpose(image).convert('RGB'))
    with tf.Graph().as_default():
        upright = onu_input.apply_exif_orientation(
            onu_input.decode_image_bytes(tf.io.read_file(path)), orientation)
        np.testing.assert_array_equal(_evaluate(upright), expected)


# ---------------------------------------------------------------------------------------------
# Preprocessing stages and augmentation.

def _draws(num_images, seed=0):
    """[num_images, NUM_DRAWS] uniform draws in [0, 1), as the pipeline makes them."""
    return np.random.default_rng(seed).uniform(0, 1, (num_images, onu_input.NUM_DRAWS)).astype(np.float32)


def test_value_range_after_each_stage():
    rng = np.random.default_rng(0)
    photo = rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)
    white = np.full((40, 60, 3), 255, np.uint8)
    # Extreme draws (0 and 1) push colours out of range before the final clip.
    extremes = np.tile([[0.0], [1.0 - 1e-6]], (4, onu_input.NUM_DRAWS)).astype(np.float32)
    with tf.Graph().as_default():
        unit = onu_input.to_unit_range(photo, IMAGE_SIZE)
        unit_white = onu_input.to_unit_range(white, IMAGE_SIZE)
        resized = onu_input.resize_for_training(photo, IMAGE_SIZE)
        high_contrast = tf.cast(tf.clip_by_value(unit * 3.0 - 1.0, 0.0, 1.0) * 255.0, tf.uint8)
        distorted = onu_input.augment_batch(tf.stack([high_contrast] * 8), extremes)
        all_but_rotation = onu_input.AugmentOptions(set(onu_input.augmentation_names()) - {'rotation'})
        unrotated = onu_input.augment_batch(tf.stack([high_contrast] * 8), extremes, all_but_rotation)
        model = onu_input.to_model_range(unit)
        evaluation = onu_input.preprocess_for_eval(white, IMAGE_SIZE)
        values = _evaluate({'unit': unit, 'white': unit_white, 'resized': resized, 'distorted': distorted,
                            'unrotated': unrotated, 'model': model, 'eval': evaluation})
    assert values['unit'].shape == (IMAGE_SIZE, IMAGE_SIZE, 3)
    assert 0.0 <= values['unit'].min() and values['unit'].max() <= 1.0
    np.testing.assert_allclose(values['white'], 1.0, rtol=0, atol=1e-6)  # not 255: scaled once, correctly
    assert values['resized'].dtype == np.uint8 and values['resized'].shape == (IMAGE_SIZE, IMAGE_SIZE, 3)
    np.testing.assert_allclose(values['resized'] / 255.0, values['unit'], atol=0.5 / 255 + 1e-6)  # rounded
    assert values['distorted'].shape == (8, IMAGE_SIZE, IMAGE_SIZE, 3)
    assert -1.0 <= values['distorted'].min() and values['distorted'].max() <= 1.0
    assert (values['unrotated'] == -1.0).any() and (values['unrotated'] == 1.0).any()  # clipped
    assert -1.0 <= values['unrotated'].min() and values['unrotated'].max() <= 1.0
    np.testing.assert_allclose(values['model'], values['unit'] * 2.0 - 1.0, atol=1e-6)
    np.testing.assert_allclose(values['eval'], 1.0, atol=1e-6)


def test_the_registry_holds_the_studys_augmentation_ranges():
    registered = {augmentation.name: (augmentation.low, augmentation.high) for augmentation in onu_input.AUGMENTATIONS}
    for name, (low, high) in STUDY_AUGMENTATION_RANGES.items():
        assert registered[name] == pytest.approx((low, high), rel=0, abs=1e-9), name
    assert len({augmentation.stream for augmentation in onu_input.AUGMENTATIONS}) == onu_input.NUM_DRAWS


@pytest.mark.parametrize('augmentation', onu_input.AUGMENTATIONS, ids=onu_input.augmentation_names())
def test_augmentation_draws_span_its_range_per_image(augmentation):
    """The study's augmentations within the study's ranges (written in conftest), any other within its own."""
    low, high = STUDY_AUGMENTATION_RANGES.get(augmentation.name, (augmentation.low, augmentation.high))
    with tf.Graph().as_default():
        draws = onu_input.random_draws(tf.constant([5, 0], tf.int64), 2000)
        values = _evaluate(onu_input.distortion_params(draws)[augmentation.name])
    assert_spans(values, low, high, augmentation.name)
    assert len(np.unique(values)) > 0.99 * len(values)  # drawn per image, not shared


@pytest.mark.parametrize('name', ['brightness', 'contrast', 'saturation', 'hue'])
def test_colour_augmentation_changes_images_within_the_studys_range(name):
    """What the op does, measured on the images, stays in the study's range: not only the parameters drawn."""
    photo = np.round(mid_colour_image() * 255.0).astype(np.uint8)
    with tf.Graph().as_default():
        augmented = _evaluate(onu_input.augment_batch(np.stack([photo] * 300), _draws(300),
                                                      onu_input.AugmentOptions({name})))
    before = np.stack([photo] * 300) / np.float32(255.0)
    assert_spans(colour_effect(name, before, (augmented + 1.0) / 2.0), *STUDY_AUGMENTATION_RANGES[name], name)


@pytest.mark.parametrize('augmentation', onu_input.AUGMENTATIONS, ids=onu_input.augmentation_names())
def test_augmentation_alone_changes_the_image(augmentation, pattern_image):
    photos = np.stack([np.asarray(pattern_image)] * 32)
    with tf.Graph().as_default():
        alone, untouched = _evaluate((
            onu_input.augment_batch(photos, _draws(32), onu_input.AugmentOptions({augmentation.name})),
            onu_input.augment_batch(photos, _draws(32), onu_input.AugmentOptions.none())))
    differences = np.abs(alone - untouched).mean(axis=(1, 2, 3))
    # Many images, each by its own draw (one that applies to a share of the images, as a flip would, changes fewer).
    assert np.mean(differences > 1e-3) > 0.25 and len(np.unique(differences.round(6))) > 1, differences


GEOMETRY = [augmentation for augmentation in onu_input.AUGMENTATIONS if augmentation.space == 'geometry']


@pytest.mark.parametrize('augmentation', GEOMETRY, ids=[augmentation.name for augmentation in GEOMETRY])
def test_what_a_geometry_augmentation_uncovers_is_grey_never_black(augmentation):
    """Alone and after or before the others: a white photo stays white where it covers, grey where it does not."""
    white = np.full((40, 56, 3), 255, np.uint8)  # not square: a map that swaps rows and columns uncovers some
    draws = _draws(64)
    for names in [{augmentation.name}] + [{augmentation.name, other.name} for other in GEOMETRY if other != augmentation]:
        with tf.Graph().as_default():
            images = _evaluate(onu_input.augment_batch(np.stack([white] * 64), draws, onu_input.AugmentOptions(names)))
        unit = (images + 1.0) / 2.0
        # Black would be a pixel that nothing covers taken for one the photo does (its coverage lost on the way).
        assert unit.min() >= onu_input.ROTATION_FILL_VALUE - 1e-4, (names, unit.min())
        assert unit.max() <= 1.0 + 1e-6


NOT_GEOMETRY = [augmentation for augmentation in onu_input.AUGMENTATIONS if augmentation.space != 'geometry']


@pytest.mark.parametrize('augmentation', NOT_GEOMETRY, ids=[augmentation.name for augmentation in NOT_GEOMETRY])
def test_an_augmentation_not_declared_geometry_moves_no_pixel(augmentation):
    """Declared in a colour space, an op does to each pixel what it would do anywhere else in the photo: shuffling the
    pixels before it or after it gives the same images. One that moves pixels (a flip) belongs in 'geometry': in a
    colour space the coverage would not move with them, and a rotation's uncovered corners would come out black."""
    assert augmentation.space in onu_input.AUGMENTATION_SPACES
    rng = np.random.default_rng(0)
    photos = rng.integers(0, 256, (8, 24, 40, 3), dtype=np.uint8)
    order = rng.permutation(24 * 40)

    def shuffled(images):
        return images.reshape(len(images), -1, 3)[:, order].reshape(images.shape)
    options = onu_input.AugmentOptions({augmentation.name})
    with tf.Graph().as_default():
        augmented, of_shuffled = _evaluate((onu_input.augment_batch(photos, _draws(8), options),
                                            onu_input.augment_batch(shuffled(photos), _draws(8), options)))
    np.testing.assert_allclose(shuffled(augmented), of_shuffled, rtol=0, atol=1e-5, err_msg=augmentation.name)


def test_adding_or_removing_augmentations_leaves_each_ones_draws(monkeypatch):
    def parameters():
        with tf.Graph().as_default():
            return _evaluate(onu_input.distortion_params(onu_input.random_draws(tf.constant([7, 3], tf.int64), 64)))
    before = parameters()
    first, *others = onu_input.AUGMENTATIONS
    added = dataclasses.replace(first, name='added_later')
    # One added in front, the first removed, the rest reordered: each keeps its draws, by name.
    monkeypatch.setattr(onu_input, 'AUGMENTATIONS', (added, *reversed(others)))
    after = parameters()
    assert set(after) == {'added_later', *(augmentation.name for augmentation in others)}
    for augmentation in others:
        np.testing.assert_array_equal(after[augmentation.name], before[augmentation.name], err_msg=augmentation.name)
    assert not np.allclose(after['added_later'], before[first.name])  # its own stream, though first's range


def test_the_input_work_between_two_readings_is_never_negative(make_tiny_dataset):
    """Each epoch's dataset ends with its epoch and takes its nodes' time with it: the work between two readings
    still counts each node by how much it grew, never less than nothing."""
    info = onu_dataset.describe(make_tiny_dataset('four', train_per_class=2, val_per_class=1)).split('train', 'images')
    with tf.Graph().as_default():  # 4 photos a split, 2 a batch: an epoch ends every other batch
        images, _ = onu_input.distorted_inputs(onu_input.training_batches(
            info, 2, IMAGE_SIZE, onu_decoded_cache.NO_CACHE, seed=1, augment=onu_input.AugmentOptions.none()))
        models = tf.compat.v1.get_collection(onu_input.PIPELINE_MODEL_OPS)
        with tf.compat.v1.Session() as session:
            readings = []
            for _ in range(30):
                session.run(images)
                readings.append(onu_input.pipeline_work(session.run(models)))
    between = [onu_input.work_between(before, after) for before, after in zip(readings, readings[1:])]
    assert min(seconds for seconds, _ in between) >= 0.0, between
    assert sum(seconds for seconds, _ in between) > 0.0 and sum(batches for _, batches in between) >= 25


def test_model_placement_hands_over_uint8_images_and_draws_per_image(tiny_data_dir):
    with tf.Graph().as_default():
        info = onu_dataset.describe(tiny_data_dir).split('train', 'encoded')
        batch = onu_input.next_batch(onu_input.training_batches(info, 8, IMAGE_SIZE, _in_memory(info), seed=5))
        images, labels, draws = batch
        with tf.compat.v1.Session() as sess:
            runs = [sess.run({'images': images, 'labels': labels, 'draws': draws}) for _ in range(2)]
    # The uint8 hand-off of --augment_on=model: resized, not augmented.
    assert runs[0]['images'].dtype == np.uint8 and runs[0]['images'].shape == (8, IMAGE_SIZE, IMAGE_SIZE, 3)
    assert runs[0]['labels'].dtype == np.int32 and runs[0]['labels'].shape == (8,)
    assert runs[0]['draws'].dtype == np.float32 and runs[0]['draws'].shape == (8, onu_input.NUM_DRAWS)
    assert 0.0 <= min(run['draws'].min() for run in runs) and max(run['draws'].max() for run in runs) < 1.0
    draws = runs[0]['draws']
    assert len({tuple(row) for row in draws}) == 8  # per image
    assert len({tuple(column) for column in draws.T}) == onu_input.NUM_DRAWS  # per augmentation
    assert not np.allclose(runs[0]['draws'], runs[1]['draws'])  # per batch


def _alone_and_together():
    """pytest params of AugmentOptions: each augmentation alone, then all of them."""
    return ([pytest.param(onu_input.AugmentOptions({name}), id=name) for name in onu_input.augmentation_names()]
            + [pytest.param(onu_input.AugmentOptions.all(), id='all')])


@pytest.mark.parametrize('options', _alone_and_together())
def test_both_placements_give_the_same_images_for_the_same_seed(tiny_data_dir, options):
    outputs = {}
    for placement in onu_input.AUGMENT_PLACEMENTS:
        with tf.Graph().as_default():
            info = onu_dataset.describe(tiny_data_dir).split('train', 'encoded')
            batches = onu_input.training_batches(info, 4, IMAGE_SIZE, _in_memory(info), seed=11,
                                                 augment=options if placement == 'input' else None)
            images, labels = onu_input.distorted_inputs(batches, options)
            with tf.compat.v1.Session() as sess:
                outputs[placement] = [sess.run((images, labels)) for _ in range(3)]
    for (input_images, input_labels), (model_images, model_labels) in zip(outputs['input'], outputs['model']):
        np.testing.assert_array_equal(input_labels, model_labels)
        np.testing.assert_allclose(input_images, model_images, rtol=0, atol=1e-5)
        assert np.abs(input_images[0] - input_images[1]).mean() > 0.01  # augmented, not blank


def _bar_angle_degrees(image):
    """The angle of the bright bar in a [-1, 1] image, from the principal axis of its pixels."""
    rows, columns = np.nonzero(image.mean(axis=-1) > 0.5)
    coordinates = np.stack([columns - columns.mean(), rows - rows.mean()])
    eigenvalues, eigenvectors = np.linalg.eigh(np.cov(coordinates))
    x, y = eigenvectors[:, np.argmax(eigenvalues)]
    angle = math.degrees(math.atan2(y, x))
    return (angle + 90.0) % 180.0 - 90.0


def test_rotation_is_per_image_and_within_10_degrees():
    bar = np.zeros((64, 64, 3), np.uint8)
    bar[29:35, 6:58] = 255
    with tf.Graph().as_default():
        images = _evaluate(onu_input.augment_batch(np.stack([bar] * 300), _draws(300), ROTATION_ONLY))
    angles = np.array([_bar_angle_degrees(image) for image in images])
    assert np.abs(angles).max() <= 10.5
    assert angles.min() < -8.0 and angles.max() > 8.0
    assert 4.5 < angles.std() < 7.0  # uniform on [-10, 10] degrees: std 5.8
    assert len(np.unique(np.round(angles, 1))) > 50  # drawn per image, not once per run


def test_rotation_matches_tensorflows_projective_transform():
    """The batched rotation resamples as ImageProjectiveTransformV3 (bilinear, grey fill) does."""
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (5, 30, 44, 3), dtype=np.uint8)
    draws = np.tile(rng.uniform(0, 1, (5, 1)), (1, onu_input.NUM_DRAWS)).astype(np.float32)
    with tf.Graph().as_default():
        ours = onu_input.augment_batch(images, draws, ROTATION_ONLY)
        angles = onu_input.distortion_params(tf.constant(draws))['rotation']
        reference = tf.raw_ops.ImageProjectiveTransformV3(
            images=tf.constant(images, tf.float32) / 255.0,
            transforms=onu_input.rotation_transforms(angles, 30.0, 44.0), output_shape=[30, 44],
            fill_value=onu_input.ROTATION_FILL_VALUE, interpolation='BILINEAR', fill_mode='CONSTANT')
        ours, reference = _evaluate((ours, onu_input.to_model_range(reference)))
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-4)


def test_rotation_turns_by_radians():
    image = np.zeros((1, 65, 65, 3), np.uint8)
    image[0, 32, 52] = 255  # 20 pixels right of the centre
    with tf.Graph().as_default():
        quarter = onu_input.rotation_transforms(tf.constant([math.radians(90.0)]), 65.0, 65.0)
        rotated = _evaluate(tf.raw_ops.ImageProjectiveTransformV3(
            images=tf.constant(image, tf.float32), transforms=quarter, output_shape=[65, 65],
            fill_value=0.0, interpolation='BILINEAR', fill_mode='CONSTANT'))
    row, column = np.unravel_index(np.argmax(rotated[0, ..., 0]), (65, 65))
    assert (row, column) in ((12, 32), (52, 32))  # a quarter turn, either sense


def test_fast_training_decode_stays_within_its_bound_of_the_exact_path(make_tiny_dataset):
    """Training decodes JPEGs at a reduced DCT scale; its pixels stay near eval's exact ones."""
    data_dir = make_tiny_dataset('photos', train_per_class=2, val_per_class=1, image_size=(800, 600))
    paths = sorted(glob.glob(os.path.join(data_dir, 'train', '*', '*.jpg')))
    with tf.Graph().as_default():
        path = tf.compat.v1.placeholder(tf.string, [])
        data = tf.io.read_file(path)
        differences, reduced_sizes = {}, {}
        for size in (299, 64):
            fast = onu_input.decode_image_bytes(data, at_least=size)
            reduced_sizes[size] = tf.shape(fast)
            train = tf.cast(onu_input.resize_for_training(fast, size), tf.float32) / 255.0
            exact = onu_input.to_unit_range(onu_input.decode_image_bytes(data), size)
            differences[size] = tf.reduce_mean(tf.abs(train - exact))
        with tf.compat.v1.Session() as sess:
            runs = [sess.run((differences, reduced_sizes), {path: p}) for p in paths]
    for size, expected_shape, bound in ((299, (300, 400, 3), FAST_DECODE_BOUND[299]),
                                        (64, (75, 100, 3), FAST_DECODE_BOUND[64])):
        assert all(tuple(shapes[size]) == expected_shape for _, shapes in runs), size  # 1/2 and 1/8 scale
        mean_difference = np.mean([difference[size] for difference, _ in runs])
        assert 0.0 < mean_difference <= bound, (size, mean_difference * 255)


def test_cached_training_epochs_cover_every_photo_once(tiny_data_dir):
    info = onu_dataset.describe(tiny_data_dir).split('train', 'encoded')
    per_epoch = info.num_examples // 2
    pictures = {}
    for cached, cache in ((True, _in_memory(info)), (False, onu_decoded_cache.NO_CACHE)):
        with tf.Graph().as_default():
            dataset = onu_input.training_batches(info, 2, IMAGE_SIZE, cache, seed=3,
                                                 augment=onu_input.AugmentOptions.none())
            images, labels = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
            with tf.compat.v1.Session() as sess:
                epochs = [np.concatenate([sess.run(images) for _ in range(per_epoch)]) for _ in range(3)]
        pictures[cached] = [epoch.reshape(len(epoch), -1) for epoch in epochs]
    for epoch in pictures[True]:  # a cached epoch is one reshuffled pass over the photos
        assert len(np.unique(epoch, axis=0)) == info.num_examples
    assert not all(np.array_equal(pictures[True][0], other) for other in pictures[True][1:])
    # The same pixels whether decoded once or every time.
    np.testing.assert_array_equal(np.unique(np.concatenate(pictures[True]), axis=0),
                                  np.unique(np.concatenate(pictures[False]), axis=0))


def test_images_mode_without_the_cache_reads_every_epoch_in_a_new_order(make_tiny_dataset):
    info = onu_dataset.describe(make_tiny_dataset('twelve', train_per_class=6, val_per_class=1)).split('train', 'images')
    assert info.num_examples == 12
    with tf.Graph().as_default():
        dataset = onu_input.training_batches(info, 4, IMAGE_SIZE, onu_decoded_cache.NO_CACHE, seed=3,
                                             augment=onu_input.AugmentOptions.none())
        images, _ = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        with tf.compat.v1.Session() as sess:
            epochs = [np.concatenate([sess.run(images) for _ in range(3)]) for _ in range(2)]
    orders = [[photo.tobytes() for photo in epoch] for epoch in epochs]
    assert [len(set(order)) for order in orders] == [12, 12] and set(orders[0]) == set(orders[1])  # each photo once
    assert orders[0] != orders[1]  # shuffled anew, not the first epoch's order again


def test_augmentation_varies_per_image(make_tiny_dataset):
    data_dir = make_tiny_dataset('one_each', train_per_class=1, val_per_class=1)
    for augment, differ in ((True, True), (False, False)):
        with tf.Graph().as_default():
            images, labels = _augmented_inputs(onu_dataset.describe(data_dir).split('train', 'images'), 8,
                                               augment=onu_input.AugmentOptions.of(augment))
            images, labels = _evaluate((images, labels))
        for label in (0, 1):
            same_photo = images[labels == label]
            assert len(same_photo) >= 2
            difference = np.abs(same_photo[0] - same_photo[1]).mean()
            assert (difference > 0.01) == differ, (augment, difference)


def test_seed_makes_training_batches_reproducible(tiny_data_dir):
    def first_batch(seed):
        with tf.Graph().as_default():
            return _evaluate(_augmented_inputs(onu_dataset.describe(tiny_data_dir).split('train', 'encoded'), 4,
                                               seed=seed))
    first, again, other = first_batch(3), first_batch(3), first_batch(4)
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    assert np.abs(first[0] - other[0]).mean() > 0.01


def test_distorted_inputs_adds_image_summary(tiny_data_dir):
    with tf.Graph().as_default():
        _augmented_inputs(onu_dataset.describe(tiny_data_dir).split('train', 'raw'), 4)
        summaries = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)
        assert [s.op.name for s in summaries] == ['augmented_inputs']
        summary = tf.compat.v1.Summary.FromString(_evaluate(summaries[0]))
    assert len(summary.value) == onu_input.NUM_SUMMARY_IMAGES
    assert summary.value[0].image.height == IMAGE_SIZE


def test_serving_preprocessing_in_map_fn(pattern_image):
    """Export decodes a batch of JPEG/PNG/BMP/GIF strings (README: serving_default) with tf.map_fn: same as one at a
    time."""
    encoded = []
    for image_format in ('JPEG', 'PNG', 'BMP', 'GIF'):
        buffer = io.BytesIO()
        pattern_image.save(buffer, image_format)
        encoded.append(buffer.getvalue())

    def preprocess(data):
        return onu_input.preprocess_for_eval(onu_input.decode_image_bytes(data), IMAGE_SIZE)
    with tf.Graph().as_default():
        batch = tf.map_fn(preprocess, tf.constant(encoded), fn_output_signature=tf.float32)
        batch, singles = _evaluate((batch, [preprocess(data) for data in encoded]))
    assert batch.shape == (4, IMAGE_SIZE, IMAGE_SIZE, 3)
    np.testing.assert_allclose(batch, np.stack(singles), atol=1e-6)
    for other in (2, 3):  # PNG, BMP and GIF (the pattern's four colours fit its palette): the same pixels
        np.testing.assert_allclose(batch[1], batch[other], atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Errors.

def test_missing_data_dir_says_how_to_make_data(tmp_path):
    missing = str(tmp_path / 'nowhere')
    for data_format in FORMATS:
        with pytest.raises(onu_errors.DataError) as error:
            onu_dataset.describe(missing).split('train', data_format)
        message = str(error.value)
        assert missing in message and 'make_sample_data.py' in message and '\n' not in message


def test_missing_records_say_how_to_convert(make_tiny_dataset):
    data_dir = make_tiny_dataset()
    assert not onu_dataset.describe(data_dir).has_records('raw')
    with pytest.raises(onu_errors.DataError) as error:
        _augmented_inputs(onu_dataset.describe(data_dir).split('train', 'raw'), 2)
    message = str(error.value)
    assert 'manifest.json' in message and f'--data_dir={data_dir} --format=raw' in message


def test_records_of_the_other_kind(make_tiny_dataset):
    data_dir = make_tiny_dataset()
    onu_converter.convert(onu_dataset.describe(data_dir), formats=('encoded',), processes=1)
    assert onu_dataset.describe(data_dir).has_records('encoded') and not onu_dataset.describe(data_dir).has_records('raw')
    with pytest.raises(onu_errors.DataError) as error:
        _eval_batch(onu_dataset.describe(data_dir).split('val', 'raw'), 2)
    message = str(error.value)
    assert 'only encoded records' in message and '--format=raw' in message
    assert '--data_format=encoded' in message and '\n' not in message


def _copy_records(tiny_data_dir, tmp_path):
    """Returns a writable copy of tiny_data_dir's photos and records."""
    data_dir = str(tmp_path / 'data')
    shutil.copytree(tiny_data_dir, data_dir)
    return data_dir


def test_corrupted_record_names_the_shard(tiny_data_dir, tmp_path):
    data_dir = _copy_records(tiny_data_dir, tmp_path)
    info = onu_dataset.describe(data_dir).split('train', 'encoded')
    damaged = info.files[1]
    with open(damaged, 'r+b') as f:
        f.seek(os.path.getsize(damaged) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with tf.Graph().as_default():
        images, _ = _eval_batch(onu_dataset.describe(data_dir).split('train', 'encoded'), 2)
        with pytest.raises(onu_errors.DataError) as error:
            with onu_dataset.read_errors_as_data_error(onu_dataset.describe(data_dir).split('train', 'encoded')):
                _run_to_end(images)
    message = str(error.value)
    assert message.startswith(damaged) and 'is damaged (its payload CRC does not match)' in message
    assert '--overwrite' in message and '\n' not in message


def test_truncated_record_file_names_the_shard(tiny_data_dir, tmp_path):
    data_dir = _copy_records(tiny_data_dir, tmp_path)
    shard = onu_dataset.describe(data_dir).split('val', 'raw').files[0]
    with open(shard, 'r+b') as f:
        f.truncate(os.path.getsize(shard) - 100)
    with pytest.raises(onu_errors.DataError) as error:
        _eval_batch(onu_dataset.describe(data_dir).split('val', 'raw'), 2)
    message = str(error.value)
    assert message.startswith(shard) and 'truncated' in message and '--format=raw' in message


def test_a_photo_that_does_not_decode_stops_eval_and_training_with_one_line_naming_it(make_tiny_dataset,
                                                                                      pattern_image):
    data_dir = make_tiny_dataset()
    bad = os.path.join(data_dir, 'val', 'F603', 'bad_scan.jpg')
    _write_jpeg_with_bad_scan(bad, pattern_image)
    info = onu_dataset.describe(data_dir).split('val', 'images')
    assert bad in info.files  # its header is fine: only decoding finds the problem
    for training, cache in ((False, None), (True, _in_memory(info)), (True, onu_decoded_cache.NO_CACHE)):
        with tf.Graph().as_default():
            if training:
                batch = onu_input.next_batch(onu_input.training_batches(info, 2, IMAGE_SIZE, cache, seed=0))
            else:
                batch = _eval_batch(info, 2)
            with pytest.raises(onu_errors.DataError) as error:
                with onu_dataset.read_errors_as_data_error(info):
                    with tf.compat.v1.Session() as sess:
                        for _ in range(info.num_examples):  # an epoch: never a batch without it, nor a silent gap
                            sess.run(batch)
        message = str(error.value)
        assert message.startswith(f'{bad}: cannot be decoded (') and '\n' not in message
        assert message.endswith('fix or remove it, then start again')


# ---------------------------------------------------------------------------------------------
# Bare class folders (no split) in every feeding mode, and what the images mode cannot decode.

def _eval_names(info):
    """The file names of one eval pass over info."""
    with tf.Graph().as_default():
        _, _, names = _eval_batch(info, 4, with_filenames=True)
        return sorted(name.decode() for batch in _run_to_end(names) for name in batch)


def test_bare_class_folders_give_the_same_split_in_every_feeding_mode(make_tiny_dataset):
    data_dir = make_tiny_dataset('split', train_per_class=10, val_per_class=1)
    photos_dir = data_dir + '_photos'
    for class_name in ('F603', 'F663N'):
        shutil.copytree(os.path.join(data_dir, 'train', class_name), os.path.join(photos_dir, class_name))
    expected = {split: sorted(f'{c}/{n}' for c in ('F603', 'F663N') for n in os.listdir(os.path.join(photos_dir, c))
                              if onu_dataset.split_of(f'{c}/{n}', 30.0) == split) for split in onu_dataset.SPLITS}
    assert expected['val'] and expected['train']
    onu_converter.convert(onu_dataset.describe(photos_dir, validation_percent=30.0), processes=1)
    for data_format in FORMATS:
        names = {split: _eval_names(onu_dataset.describe(photos_dir, validation_percent=30.0).split(split, data_format))
                 for split in onu_dataset.SPLITS}
        assert names == expected, data_format  # and so no val photo is ever trained on
    info = onu_dataset.describe(photos_dir, validation_percent=30.0).split('val', 'encoded')
    assert (info.layout, info.validation_percent) == ('records', 30.0)
    with pytest.raises(onu_errors.DataError) as error:  # records split otherwise are not read as this split
        onu_dataset.describe(photos_dir, validation_percent=20.0).split('val', 'encoded')
    assert '--validation_percent=30' in str(error.value) and '\n' not in str(error.value)


def test_images_mode_leaves_out_what_it_cannot_decode_with_one_line(make_tiny_dataset, pattern_image, capsys):
    data_dir = make_tiny_dataset()
    pattern_image.save(os.path.join(data_dir, 'val', 'F603', 'scan.tif'), 'TIFF')
    pattern_image.convert('1').save(os.path.join(data_dir, 'val', 'F603', 'fax.bmp'), 'BMP')  # TensorFlow reads none
    capsys.readouterr()
    info = onu_dataset.describe(data_dir).split('val', 'images')
    assert info.num_examples == 4 and not any(path.endswith(('.tif', '.bmp')) for path in info.files)
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith('skipped ')]
    assert line.startswith('skipped 2 of 6 files: 1 BMP file, 1 TIFF file; the list: ')
    with open(line.split('; the list: ')[1]) as f:
        listed = f.read().splitlines()
    assert [row.split(': ')[0] for row in listed] == [os.path.join(data_dir, 'val', 'F603', name)
                                                      for name in ('fax.bmp', 'scan.tif')]
    assert all('records include it' in row for row in listed)
    assert len(_eval_examples('val', data_dir, 'images')[1]) == 4  # counted as it is read
    onu_converter.convert(onu_dataset.describe(data_dir), formats=('encoded',), processes=1)  # records read it through Pillow
    assert onu_dataset.describe(data_dir).split('val', 'encoded').num_examples == 6
