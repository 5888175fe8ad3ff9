"""Tests of onu_layouts: other tools' records found, counted, labelled and read.

Every test that takes `layout` runs once per onu_layouts.RECORD_LAYOUTS entry, on records written as the entry says
its tool writes them (conftest.write_layout): a new layout is tested as soon as it is an entry. The file names the
tools really write are checked against the entries by hand (REAL_FILE_NAMES), independently of the entries.
"""
import dataclasses
import importlib.util
import io
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from onu_lib import onu_dataset
import onu_eval
import onu_input
from onu_lib import onu_checkpoint
from onu_lib import onu_errors
from onu_lib import onu_layouts
from onu_lib import onu_run_config
from onu_lib import onu_converter
from onu_lib import onu_tfrecord
from conftest import (EXIF_ORIENTATION_TAG, LAYOUT_CLASSES, file_states, layout_class_names, layout_photos,
                      read_only_bind_mount, run_script, write_layout, write_tfrecord, _example)

IMAGE_SIZE = 32


def _one_line(error):
    """The message of a DataError, checked to be one line."""
    message = str(error.value)
    assert '\n' not in message
    return message


def _eval_labels(info):
    """The labels of one eval pass over info, in order."""
    with tf.Graph().as_default():
        _, labels, names = onu_input.next_batch(onu_input.eval_batches(info, 4, IMAGE_SIZE, with_filenames=True))
        found, found_names = [], []
        with tf.compat.v1.Session() as sess:
            while True:
                try:
                    batch_labels, batch_names = sess.run([labels, names])
                except tf.errors.OutOfRangeError:
                    return found, found_names
                found += batch_labels.tolist()
                found_names += [name.decode() for name in batch_names]


# The file names each tool writes, read in its code (TF-slim's datasets/, Inception's build_image_data.py, TFDS's
# file_adapters, the study's converter): written here by hand, so that an entry's pattern is checked against them.
REAL_FILE_NAMES = {
    'tfds': ('tf_flowers-train.tfrecord-00000-of-00002', 'cifar10-test.tfrecord-00000-of-00001',
             'imagenet2012-validation.tfrecord-00063-of-00064'),
    'slim': ('flowers_train_00000-of-00005.tfrecord', 'flowers_validation_00004-of-00005.tfrecord',
             'mnist_train_00000-of-00001.tfrecord'),
    'inception': ('train-00000-of-01024', 'validation-00127-of-00128'),
    'single_file': ('603_663_train_raw.tfrecord', '603_663_val_g.tfrecord', 'cifar10_train.tfrecord',
                    'cifar10_test.tfrecord', 'train.tfrecords', 'photos-val.record'),
}


@pytest.fixture(params=onu_layouts.LAYOUT_NAMES)
def layout(request):
    """Each record layout's name, in turn."""
    return request.param


def test_every_layout_is_looked_for_and_written_as_it_says(layout, tmp_path):
    entry = onu_layouts.layout_named(layout)
    assert entry.looks_like in onu_layouts.looked_for()
    for data_format in set(entry.image_keys.values()):
        data_dir = write_layout(layout, str(tmp_path / data_format), layout_photos(train=1, val=1), data_format=data_format)
        folder = os.path.join(data_dir, entry.version_folder) if entry.version_folder else data_dir
        written = {name for name in os.listdir(folder) if entry.file_name.fullmatch(name)}
        assert written == set(entry.sample_names(data_format))  # two shards a split where the tool shards


@pytest.mark.parametrize('name', sorted(set(onu_layouts.LAYOUT_NAMES) & set(REAL_FILE_NAMES)))
def test_the_file_names_tools_really_write_match_their_layout_and_no_other(name):
    for file_name in REAL_FILE_NAMES[name]:
        matching = [entry.name for entry in onu_layouts.RECORD_LAYOUTS if entry.file_name.fullmatch(file_name)]
        assert matching == [name], file_name


def test_a_layout_whose_files_another_one_matches_is_refused_at_import(tmp_path):
    # A user appends, after single_file, a layout of one file per split named <split>_images.tfrecord: single_file's
    # pattern would take its files, and it would never be found. Importing the registry with it refuses it.
    source = open(onu_layouts.__file__, encoding='utf-8').read()
    end_of_registry = source.index('\n)\nLAYOUT_NAMES')
    appended = ("\n    RecordLayout(name='images_per_split', looks_like='<split>_images.tfrecord', "
                "file_name=re.compile(r'(?P<split>train|val)_images\\.tfrecord'), "
                "sample_file_name='{split}_images.tfrecord', split_tokens={'train': 'train', 'val': 'val'}, "
                "image_keys={'image/encoded': 'encoded'}, label_key='image/class/label'),")
    (tmp_path / 'layouts_with_one_more.py').write_text(source[:end_of_registry] + appended + source[end_of_registry:],
                                                      encoding='utf-8')
    spec = importlib.util.spec_from_file_location('layouts_with_one_more', tmp_path / 'layouts_with_one_more.py')
    with pytest.raises(ValueError) as error:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert 'images_per_split' in str(error.value) and 'also match the pattern of single_file' in str(error.value)
    # Whatever the order: the check compares every entry with every other.
    shadowed = dataclasses.replace(onu_layouts.layout_named('single_file'), name='images_per_split',
                                   sample_file_name='{split}_images.tfrecord')
    with pytest.raises(ValueError) as error:
        onu_layouts._check_layouts_exclusive((shadowed, *onu_layouts.RECORD_LAYOUTS))
    assert str(error.value).startswith('record layout images_per_split: its files (train_images.tfrecord) also match '
                                       'the pattern of single_file;')
    onu_layouts._check_layouts_exclusive(onu_layouts.RECORD_LAYOUTS)  # the registry as it is passes
    with pytest.raises(ValueError, match='record layouts share a name'):
        onu_layouts._check_layouts_exclusive((*onu_layouts.RECORD_LAYOUTS, onu_layouts.RECORD_LAYOUTS[0]))
    misnamed = dataclasses.replace(onu_layouts.layout_named('slim'), sample_file_name='slim_{split}.tfrecord')
    with pytest.raises(ValueError, match='its sample file .* does not match its own file_name pattern'):
        onu_layouts._check_layouts_exclusive((misnamed,))


def test_other_tools_records_are_had_in_the_formats_they_hold(tmp_path):
    write_layout('slim', str(tmp_path), layout_photos(train=1, val=1))
    data = onu_dataset.describe(str(tmp_path))
    assert data.has_records('encoded') and data.reads_other_tools_records('encoded')
    assert not data.has_records('raw') and data.record_formats == ('encoded',)


def test_a_folder_with_the_records_of_two_tools_is_a_one_line_error(tmp_path):
    photos = layout_photos(train=1, val=1)
    write_layout('slim', str(tmp_path), photos)
    write_layout('inception', str(tmp_path), photos)
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.describe(str(tmp_path))
    message = _one_line(error)
    assert 'more than one tool' in message and 'slim: ' in message and 'inception: ' in message


def test_the_newest_tfds_version_folder_is_read(tmp_path):
    old, new = layout_photos(train=1, val=1), layout_photos(train=3, val=1)
    for version, photos in (('3.0.1', old), ('3.10.0', new), ('3.2.0', old)):  # 3.10 is newer than 3.2
        data_dir = write_layout('tfds', str(tmp_path), photos, name='tf_flowers')
        os.rename(os.path.join(data_dir, onu_layouts.layout_named('tfds').version_folder),
                  os.path.join(data_dir, f'.{version}'))
    for version in ('3.0.1', '3.10.0', '3.2.0'):
        os.rename(os.path.join(data_dir, f'.{version}'), os.path.join(data_dir, version))
    info = onu_dataset.describe(data_dir).split('train', 'encoded')
    assert info.num_examples == 9 and all(os.sep + '3.10.0' + os.sep in path for path in info.files)


def test_each_layout_is_found_counted_and_labelled(layout, tmp_path):
    photos = layout_photos()
    data_dir = write_layout(layout, str(tmp_path), photos)
    assert onu_dataset.describe(data_dir).layout == layout
    for split in onu_dataset.SPLITS:
        expected = [photo.label for photo in photos if photo.split == split]
        info = onu_dataset.describe(data_dir).split(split, 'encoded')
        assert (info.layout, info.num_examples, info.class_names) == (layout, len(expected), layout_class_names(layout))
        assert sum(info.records_per_file) == len(expected)
        labels, names = _eval_labels(info)
        assert sorted(labels) == sorted(expected)  # every example once, each with its class
        assert len(set(names)) == len(names) and all(names)  # each named: its file name, or <shard>#<index>


@pytest.mark.parametrize('val_classes', [{1, 2}, {2}])
def test_the_offset_comes_from_evidence_not_from_the_smallest_label(layout, tmp_path, val_classes):
    photos = layout_photos(val_classes=val_classes)
    data_dir = write_layout(layout, str(tmp_path), photos)
    info = onu_dataset.describe(data_dir).split('val', 'encoded')
    assert info.labels_offset == onu_layouts.layout_named(layout).labels_base
    assert info.class_names == layout_class_names(layout)
    assert sorted(_eval_labels(info)[0]) == sorted(photo.label for photo in photos if photo.split == 'val')


def test_inception_names_without_its_keys_need_labels_offset(tmp_path):
    photos = layout_photos()
    for split, token in (('train', 'train'), ('val', 'validation')):
        write_tfrecord(str(tmp_path / f'{token}-00000-of-00001'),
                       [_example({'image/encoded': p.data, 'image/class/label': p.label + 1})
                        for p in photos if p.split == split])
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.describe(str(tmp_path)).split('train', 'encoded')
    assert '--labels_offset=0' in _one_line(error) and '--labels_offset=1' in _one_line(error)
    info = onu_dataset.describe(str(tmp_path), labels_offset=1).split('val', 'encoded')
    assert info.class_names == ('class_1', 'class_2', 'class_3')
    assert sorted(_eval_labels(info)[0]) == sorted(p.label for p in photos if p.split == 'val')


def test_labels_files_give_offset_and_names(tmp_path):
    photos = layout_photos()
    # TF-slim's ImageNet labels.txt: 0:background, which no photo has; the records' labels start at 1.
    shifted = write_layout('slim', str(tmp_path / 'shifted'), [
        type(p)(split=p.split, label=p.label + 1, image=p.image, name=p.name, data=p.data) for p in photos],
        ['background'] + list(LAYOUT_CLASSES))
    info = onu_dataset.describe(shifted).split('train', 'encoded')
    assert (info.labels_offset, info.class_names) == (1, LAYOUT_CLASSES)
    assert sorted(_eval_labels(info)[0]) == sorted(p.label for p in photos if p.split == 'train')
    # Inception's own labels file (its converter's input): one name per line, line 1 is label 1.
    without_texts = tuple(key for key in onu_layouts.layout_named('inception').written_keys if key != onu_dataset.KEY_TEXT)
    inception = write_layout('inception', str(tmp_path / 'inception'), photos, keys=without_texts)
    with open(os.path.join(inception, 'labels.txt'), 'w') as f:
        f.write('\n'.join(LAYOUT_CLASSES) + '\n')
    info = onu_dataset.describe(inception).split('train', 'encoded')
    assert (info.labels_offset, info.class_names) == (1, LAYOUT_CLASSES)


def test_a_label_outside_the_classes_is_a_one_line_error(tmp_path):
    photos = layout_photos()
    slim = write_layout('slim', str(tmp_path), photos, ['background'] + list(LAYOUT_CLASSES))
    info = onu_dataset.describe(slim).split('train', 'encoded')  # labels.txt says 1-based, the records hold 0
    with pytest.raises(onu_errors.DataError) as error:
        with onu_dataset.read_errors_as_data_error(info):
            _eval_labels(info)
    message = _one_line(error)
    assert 'label 0' in message and '--labels_offset' in message


@pytest.mark.parametrize('mode', ['RGBA', 'L', 'RGB'])
def test_raw_records_of_one_three_and_four_bytes_per_pixel_read_as_rgb(tmp_path, mode):
    photos = layout_photos(mode=mode, train=1, val=1)
    write_layout('single_file', str(tmp_path), photos, data_format='raw')
    info = onu_dataset.describe(str(tmp_path)).split('val', 'raw')
    size = photos[0].image.size
    with tf.Graph().as_default():
        dataset = onu_input._decoded_records(info, training=False, seed=None)
        image, label, _ = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        with tf.compat.v1.Session() as sess:
            got = [sess.run([image, label]) for _ in range(info.num_examples)]
    for (pixels, label), photo in zip(got, [p for p in photos if p.split == 'val']):
        assert label == photo.label and pixels.shape == (size[1], size[0], 3)
        np.testing.assert_array_equal(pixels, np.asarray(Image.open(__import__('io').BytesIO(photo.data)).convert('RGB')))


def _val_pixels(info):
    """The decoded pixels of every val example of info, in eval's order (before resizing)."""
    with tf.Graph().as_default():
        dataset = onu_input._decoded_records(info, training=False, seed=None)
        image, _, _ = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        with tf.compat.v1.Session() as sess:
            return [sess.run(image) for _ in range(info.num_examples)]


def test_other_tools_jpegs_are_read_as_stored_without_their_exif_orientation(tmp_path):
    """README: an EXIF orientation inside another tool's JPEG bytes is not applied, read in place or converted."""
    exif = Image.Exif()
    exif[EXIF_ORIENTATION_TAG] = 6  # "turn 90 degrees to be upright": 40x30 stored, 30x40 upright
    photos = layout_photos(train=1, val=1)
    for photo in photos:
        buffer = io.BytesIO()
        photo.image.save(buffer, 'JPEG', quality=95, exif=exif.tobytes())
        photo.data = buffer.getvalue()
    folder = write_layout('slim', str(tmp_path / 'slim'), photos)
    in_place = _val_pixels(onu_dataset.describe(folder).split('val', 'encoded'))
    onu_converter.convert(onu_dataset.describe(folder), formats=('raw',), processes=1)
    converted = _val_pixels(onu_dataset.describe(folder).split('val', 'raw'))
    val = [photo for photo in photos if photo.split == 'val']
    assert len(in_place) == len(converted) == len(val) == len(LAYOUT_CLASSES)
    for photo, read, raw in zip(val, in_place, converted):
        stored = tf.io.decode_jpeg(photo.data, channels=3).numpy()
        assert stored.shape == read.shape == raw.shape == (30, 40, 3)  # as stored, not turned
        for pixels in (read, raw):  # the same bytes' pixels (decoders differ by a grey level or two)
            assert np.abs(pixels.astype(int) - stored).mean() < 1.5


def test_raw_bytes_that_fit_no_pixel_size_name_the_file_and_record(tmp_path):
    photos = layout_photos(train=1, val=1)
    records = [_example({'image/raw': p.image.tobytes(), 'image/width': p.image.width, 'image/height': p.image.height,
                         'image/class/label': p.label}) for p in photos if p.split == 'train']
    records[1] = _example({'image/raw': bytes(40 * 30 * 2), 'image/width': 40, 'image/height': 30,
                           'image/class/label': 1})
    write_tfrecord(str(tmp_path / 'x_train_raw.tfrecord'), records)
    write_tfrecord(str(tmp_path / 'x_val_raw.tfrecord'), records[:1])
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.describe(str(tmp_path)).split('train', 'raw')
    message = _one_line(error)
    assert str(tmp_path / 'x_train_raw.tfrecord') in message and 'record 2' in message and '2400 bytes' in message


def test_gzip_records_are_recognised_from_their_bytes(tmp_path):
    photos = layout_photos()
    write_layout('single_file', str(tmp_path), photos, compression='GZIP')
    info = onu_dataset.describe(str(tmp_path)).split('train', 'encoded')
    assert info.compression_type == 'GZIP' and info.num_examples == 12
    assert sorted(_eval_labels(info)[0]) == sorted(p.label for p in photos if p.split == 'train')


def test_empty_trailing_shards_count_as_empty(tmp_path):
    photos = layout_photos(train=1, val=1)  # 3 photos a split in 5 shards: two are empty files
    write_layout('slim', str(tmp_path), photos, num_shards=5)
    info = onu_dataset.describe(str(tmp_path)).split('train', 'encoded')
    assert info.records_per_file == (1, 1, 1, 0, 0)
    assert sorted(_eval_labels(info)[0]) == [0, 1, 2]


def test_a_truncated_shard_is_a_one_line_error_naming_it(tmp_path):
    write_layout('slim', str(tmp_path), layout_photos(), num_shards=5)
    shard = str(tmp_path / 'flowers_train_00001-of-00005.tfrecord')
    data = open(shard, 'rb').read()
    open(shard, 'wb').write(data[:len(data) - 30])
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.describe(str(tmp_path)).split('train', 'encoded')
    assert _one_line(error).startswith(f'{shard}: damaged or truncated record file (record 3 is cut short')


def test_a_folder_of_no_known_layout_says_what_was_looked_for(tmp_path):
    (tmp_path / 'data.bin').write_bytes(bytes(100))
    (tmp_path / 'notes.txt').write_text('nothing here')
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.describe(str(tmp_path)).layout
    message = _one_line(error)
    assert 'train/<class>/' in message and 'manifest.json' in message
    assert all(record_layout.looks_like in message for record_layout in onu_layouts.RECORD_LAYOUTS)


def test_counts_are_cached_outside_the_folder_and_a_changed_shard_is_recounted(tmp_path, monkeypatch):
    photos = layout_photos()
    data_dir = write_layout('inception', str(tmp_path / 'data'), photos)
    before = file_states(data_dir)
    assert onu_dataset.describe(data_dir).split('train', 'encoded').num_examples == 12
    index = onu_layouts._index_path(data_dir)
    assert os.path.isfile(index) and index.startswith(os.environ['ONU_CACHE_DIR'])
    assert file_states(data_dir) == before  # nothing written into the data folder
    counted = []
    real_framing = onu_tfrecord.read_framing
    monkeypatch.setattr(onu_tfrecord, 'read_framing', lambda *args: counted.append(args) or real_framing(*args))
    assert onu_dataset.describe(data_dir).split('train', 'encoded').num_examples == 12
    assert counted == []  # from the cache
    shard = os.path.join(data_dir, 'train-00001-of-00002')
    extra = _example({'image/encoded': photos[0].data, 'image/class/label': 1, 'image/class/text': 'daisy',
                      'image/colorspace': 'RGB', 'image/channels': 3})
    write_tfrecord(shard, list(onu_tfrecord.read_records(shard, 'NONE')) + [extra])
    assert onu_dataset.describe(data_dir).split('train', 'encoded').num_examples == 13
    assert [os.path.basename(args[0]) for args in counted] == ['train-00001-of-00002']


@pytest.mark.script
def test_each_layout_trains_and_evaluates_every_val_example_once(layout, tmp_path):
    photos = layout_photos()
    data_dir = write_layout(layout, str(tmp_path / 'data'), photos)
    train_dir = str(tmp_path / 'train')
    trained = run_script('onu_train.py', f'--data_dir={data_dir}', f'--train_dir={train_dir}', '--max_steps=2',
                         f'--image_size={IMAGE_SIZE}', '--batch_size=4', '--model=small')
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert f'{layout} records' in trained.stdout
    config = json.load(open(os.path.join(train_dir, 'run_config.json')))
    assert (config['layout'], tuple(config['class_names'])) == (layout, layout_class_names(layout))
    assert config['labels_offset'] == onu_layouts.layout_named(layout).labels_base  # what eval reads them with
    # Evaluated as onu_eval.py does, from the run's configuration alone (the script's own run: test_onu_eval.py).
    run_config = onu_run_config.RunConfig.load(train_dir)
    result = onu_eval.evaluate(onu_checkpoint.list_checkpoints(train_dir)[-1], run_config,
                               run_config.split_info('val'), batch_size=4)
    assert result.num_examples == 6 and tuple(result.class_names) == layout_class_names(layout)
    assert result.confusion.sum(axis=1).tolist() == [2, 2, 2]  # every val example, its class


@pytest.mark.script
def test_a_read_only_data_folder_trains_with_records_made_in_the_cache(tmp_path):
    photos = layout_photos()
    source = write_layout('inception', str(tmp_path / 'source'), photos)
    mounted = str(tmp_path / 'mounted')
    with read_only_bind_mount(source, mounted):
        before = file_states(source)
        trained = run_script('onu_train.py', f'--data_dir={mounted}', '--data_format=raw', '--max_steps=2',
                             f'--train_dir={tmp_path / "train"}', f'--image_size={IMAGE_SIZE}', '--batch_size=4',
                             '--model=small')
        assert trained.returncode == 0, trained.stderr[-3000:]
        cached = onu_dataset.cached_records_dir(mounted)
        assert f'{mounted} is read-only: writing its records to {cached}' in trained.stdout
        assert onu_dataset.read_manifest(cached)['splits']['val']['raw']['records'] == 6
        evaluated = run_script('onu_eval.py', f'--checkpoint_dir={tmp_path / "train"}', '--run_once',
                               f'--eval_dir={tmp_path / "eval"}')
        assert evaluated.returncode == 0, evaluated.stderr[-3000:]
        assert '6 val examples' in evaluated.stdout
        assert file_states(source) == before


def test_labels_files_are_placed_by_id_and_read_with_a_byte_order_mark(tmp_path):
    photos = [p for p in layout_photos() if p.label != 1]  # no photo of the class without a name
    write_layout('slim', str(tmp_path), photos, num_shards=5)
    (tmp_path / 'labels.txt').write_text('\ufeff0:daisy\n2:tulip\n', encoding='utf-8')
    info = onu_dataset.describe(str(tmp_path)).split('train', 'encoded')
    assert (info.labels_offset, info.class_names) == (0, ('daisy', 'class_1', 'tulip'))
    (tmp_path / 'labels.txt').write_bytes('0:pâquerette\n'.encode('latin-1'))
    onu_layouts._found.clear()
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.describe(str(tmp_path)).split('train', 'encoded')
    assert _one_line(error).startswith(f'{tmp_path / "labels.txt"}: unreadable labels file')


def test_files_without_a_single_record_are_a_one_line_error(tmp_path):
    write_tfrecord(str(tmp_path / 'x_train.tfrecord'), [])
    write_tfrecord(str(tmp_path / 'x_val.tfrecord'), [])
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.describe(str(tmp_path)).layout
    assert 'hold no complete record' in _one_line(error)


def test_a_record_unlike_the_first_is_a_one_line_error_or_skipped_when_converting(tmp_path):
    photos = layout_photos(train=2, val=1)
    write_layout('slim', str(tmp_path), photos, num_shards=1)  # labels.txt: no scan of the records
    shard = str(tmp_path / 'flowers_train_00000-of-00001.tfrecord')
    records = list(onu_tfrecord.read_records(shard, 'NONE'))
    write_tfrecord(shard, records[:2] + [_example({'image/encoded': photos[0].data})] + records[2:])  # no label
    info = onu_dataset.describe(str(tmp_path)).split('train', 'encoded')
    with pytest.raises(onu_errors.DataError) as error:
        with onu_dataset.read_errors_as_data_error(info):
            _eval_labels(info)
    assert _one_line(error).startswith(f'{tmp_path}: a train record lacks what the first one holds')
    manifest = onu_converter.convert(onu_dataset.describe(str(tmp_path)), formats=('encoded',), processes=1)
    assert manifest['splits']['train']['encoded']['records'] == 6
    assert manifest['skipped'] == [{'path': 'flowers_train_00000-of-00001.tfrecord#2', 'format': 'encoded',
                                    'reason': "no 'image/class/label'", 'split': 'train'}]
    # Without a labels file the records are scanned for their labels, and the one without says so at once.
    os.remove(tmp_path / 'labels.txt')
    shutil.rmtree(tmp_path / 'tfrecords')
    onu_layouts._found.clear()
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.describe(str(tmp_path)).split('train', 'encoded')
    assert _one_line(error).startswith(f'{shard}: record 3 has no image/class/label')


def test_converted_records_must_match_the_labels_offset_asked(tmp_path):
    photos = layout_photos()
    data_dir = write_layout('inception', str(tmp_path), photos)
    onu_converter.convert(onu_dataset.describe(data_dir), formats=('raw',), processes=1)
    assert onu_dataset.describe(data_dir, labels_offset=1).has_records('raw') and onu_dataset.describe(data_dir).has_records('raw')
    assert not onu_dataset.describe(data_dir, labels_offset=0).has_records('raw')  # training converts again
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.describe(data_dir, labels_offset=0).split('train', 'raw')
    assert '--labels_offset=1' in _one_line(error)
