"""Tests of onu_converter: record contents, manifest, bad input, safe shard writing, determinism, re-runs."""

import hashlib
import io
import os
import shutil
import sys
import types

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from conftest import (EXIF_ORIENTATION_TAG, LAYOUT_CLASSES, REPO_ROOT, file_states, layout_photos, run_script,
                      write_layout)

from onu_lib import onu_errors
from onu_lib import onu_photos
from onu_lib import onu_converter
from onu_lib import onu_tfrecord
from onu_lib import onu_dataset

SCRIPT = 'convert_to_tfrecord.py'
METADATA_KEYS = {onu_dataset.KEY_FORMAT, onu_dataset.KEY_LABEL, onu_dataset.KEY_TEXT, onu_dataset.KEY_HEIGHT,
                 onu_dataset.KEY_WIDTH, onu_dataset.KEY_CHANNELS, onu_dataset.KEY_FILENAME}
PAYLOAD_KEYS = {'raw': onu_dataset.KEY_RAW, 'encoded': onu_dataset.KEY_ENCODED}


def _features(serialized):
    """{key: value} of one serialized tf.train.Example (single values unwrapped)."""
    example = tf.train.Example.FromString(serialized)
    features = {}
    for key, feature in example.features.feature.items():
        values = list(getattr(feature, feature.WhichOneof('kind')).value)
        features[key] = values[0] if len(values) == 1 else values
    return features


def _read_records(records_dir, split, record_format, manifest=None):
    """Feature dicts of every record of one split and format, in shard order."""
    manifest = manifest or onu_dataset.read_manifest(records_dir)
    options = tf.io.TFRecordOptions(compression_type=onu_dataset.tf_compression_type(manifest['compression']))
    return [_features(record) for path in onu_dataset.shard_paths(records_dir, manifest, split, record_format)
            for record in tf.compat.v1.io.tf_record_iterator(path, options)]


def _decode(payload, payload_format):
    """uint8 HxWx3 pixels of an encoded payload, decoded by TensorFlow as a reader would."""
    with tf.Graph().as_default():
        if payload_format == b'png':
            image = tf.io.decode_png(payload, channels=3)
        else:  # INTEGER_ACCURATE gives the same pixels as Pillow and OpenCV
            image = tf.io.decode_jpeg(payload, channels=3, dct_method='INTEGER_ACCURATE')
        with tf.compat.v1.Session() as session:
            return session.run(image)


def _raw_pixels(features):
    """The HxWx3 array of a raw record."""
    return np.frombuffer(features[onu_dataset.KEY_RAW], np.uint8).reshape(
        features[onu_dataset.KEY_HEIGHT], features[onu_dataset.KEY_WIDTH], 3)


def _pil_rgb(path):
    """Pillow's RGB pixels of a file, no orientation applied."""
    with Image.open(path) as image:
        return np.asarray(image.convert('RGB'))


def _tree_digest(folder):
    """A digest of every file name and content under folder."""
    digest = hashlib.sha256()
    for root, dirs, names in sorted(os.walk(folder)):
        dirs.sort()
        for name in sorted(names):
            digest.update(os.path.relpath(os.path.join(root, name), folder).encode())
            with open(os.path.join(root, name), 'rb') as f:
                digest.update(f.read())
    return digest.hexdigest()


def _shard_identities(records_dir):
    """{shard file: (inode, mtime_ns)}, to tell rewritten shards from untouched ones."""
    stats = {name: os.stat(os.path.join(records_dir, name))
             for name in os.listdir(records_dir) if name.endswith('.tfrecord')}
    return {name: (stat.st_ino, stat.st_mtime_ns) for name, stat in stats.items()}


def test_record_keys_and_values(tiny_data_dir, tiny_records_dir):
    for split in onu_dataset.SPLITS:
        raw = _read_records(tiny_records_dir, split, 'raw')
        encoded = _read_records(tiny_records_dir, split, 'encoded')
        assert len(raw) == len(encoded) == {'train': 8, 'val': 4}[split]
        for record_format, records in (('raw', raw), ('encoded', encoded)):
            for features in records:
                assert set(features) == METADATA_KEYS | {PAYLOAD_KEYS[record_format]}
        for raw_features, encoded_features in zip(raw, encoded):
            path = os.path.join(tiny_data_dir, raw_features[onu_dataset.KEY_FILENAME].decode())
            class_name = raw_features[onu_dataset.KEY_TEXT].decode()
            assert path.startswith(os.path.join(tiny_data_dir, split, class_name) + os.sep)
            assert raw_features[onu_dataset.KEY_LABEL] == ['F603', 'F663N'].index(class_name)
            assert (raw_features[onu_dataset.KEY_HEIGHT], raw_features[onu_dataset.KEY_WIDTH]) == (48, 64)
            assert raw_features[onu_dataset.KEY_CHANNELS] == 3
            assert raw_features[onu_dataset.KEY_FORMAT] == b'raw'
            assert encoded_features[onu_dataset.KEY_FORMAT] == b'jpeg'
            for key in METADATA_KEYS - {onu_dataset.KEY_FORMAT}:
                assert raw_features[key] == encoded_features[key]
            with open(path, 'rb') as f:
                assert encoded_features[onu_dataset.KEY_ENCODED] == f.read()  # the file itself, unchanged
            assert len(raw_features[onu_dataset.KEY_RAW]) == 48 * 64 * 3
            np.testing.assert_array_equal(_raw_pixels(raw_features), _pil_rgb(path))
            np.testing.assert_array_equal(_decode(encoded_features[onu_dataset.KEY_ENCODED], b'jpeg'),
                                          _raw_pixels(raw_features))


def test_labels_and_manifest_counts(tiny_data_dir, tiny_records_dir):
    assert onu_dataset.read_labels(os.path.join(tiny_records_dir, onu_dataset.LABELS_FILENAME)) == ['F603', 'F663N']
    manifest = onu_dataset.read_manifest(tiny_records_dir)
    assert (manifest['version'], manifest['compression'], manifest['class_names']) == (1, 'NONE', ['F603', 'F663N'])
    assert manifest['skipped'] == []
    for split, per_class in (('train', 4), ('val', 2)):
        images, _ = onu_dataset.list_split_images(tiny_data_dir, split, ['F603', 'F663N'])
        assert manifest['image_size_stats'][split] == {'width': {'min': 64, 'max': 64, 'mean': 64.0},
                                                       'height': {'min': 48, 'max': 48, 'mean': 48.0}}
        for record_format in onu_dataset.RECORD_FORMATS:
            entry = manifest['splits'][split][record_format]
            assert [s['file'] for s in entry['shards']] == [
                f'{split}-{record_format}-0000{i}-of-00002.tfrecord' for i in range(2)]
            options = tf.io.TFRecordOptions(compression_type='')
            for shard in entry['shards']:
                path = os.path.join(tiny_records_dir, shard['file'])
                assert shard['records'] == sum(1 for _ in tf.compat.v1.io.tf_record_iterator(path, options))
                assert shard['bytes'] == os.path.getsize(path)
            assert entry['records'] == 2 * per_class == sum(s['records'] for s in entry['shards'])
            assert entry['records_per_class'] == {'F603': per_class, 'F663N': per_class}
            assert entry['record_bytes'] == sum(s['bytes'] for s in entry['shards'])
            assert entry['source_bytes'] == sum(i.num_bytes for i in images)
            assert entry['pixel_bytes'] == 2 * per_class * 48 * 64 * 3
            assert entry['seconds'] >= 0
        raw, encoded = manifest['splits'][split]['raw'], manifest['splits'][split]['encoded']
        assert raw['pixel_bytes'] < raw['record_bytes'] < 1.05 * raw['pixel_bytes']
        assert encoded['source_bytes'] < encoded['record_bytes'] < encoded['source_bytes'] + 400 * encoded['records']


def test_train_shuffled_across_shards_val_in_sorted_order(tiny_data_dir, tiny_records_dir):
    train = [f[onu_dataset.KEY_FILENAME] for f in _read_records(tiny_records_dir, 'train', 'encoded')]
    val = [f[onu_dataset.KEY_FILENAME] for f in _read_records(tiny_records_dir, 'val', 'encoded')]
    assert sorted(train) == [f'train/{c}/{i:05d}.jpg'.encode() for c in ('F603', 'F663N') for i in range(4)]
    assert train != sorted(train)
    assert val == [f'val/{c}/{i:05d}.jpg'.encode() for c in ('F603', 'F663N') for i in range(2)]
    raw_train = [f[onu_dataset.KEY_FILENAME] for f in _read_records(tiny_records_dir, 'train', 'raw')]
    assert raw_train == train  # both kinds hold the same order


def test_same_seed_same_shards_for_any_process_count(make_tiny_dataset, tmp_path, monkeypatch):
    data_dir = make_tiny_dataset()
    monkeypatch.setattr(onu_converter, 'RAW_TASK_MAX_IMAGES', 1)  # 8 tasks cycling through 5 shared blocks
    outputs = {}
    for name, seed, processes in (('serial', 0, 1), ('parallel', 0, 2), ('other_seed', 1, 1)):
        records_dir = str(tmp_path / name)
        onu_converter.convert(onu_dataset.describe(data_dir), records_dir, num_shards=2, processes=processes, seed=seed)
        outputs[name] = {n: open(os.path.join(records_dir, n), 'rb').read()
                         for n in os.listdir(records_dir) if n.endswith('.tfrecord')}
    assert len(outputs['serial']) == 8
    assert outputs['serial'] == outputs['parallel']
    for name, data in outputs['other_seed'].items():
        assert (data == outputs['serial'][name]) == name.startswith('val-'), name


def test_bad_inputs_are_skipped_with_reasons_and_the_rest_decode_upright(messy_data_dir, messy_files, tmp_path,
                                                                         pattern_image):
    before = _tree_digest(messy_data_dir)
    records_dir = str(tmp_path / 'records')
    manifest = onu_converter.convert(onu_dataset.describe(messy_data_dir), records_dir, processes=2)  # decoded by workers
    assert _tree_digest(messy_data_dir) == before  # sources untouched, nothing written next to them
    skipped = {s['path']: s['reason'] for s in manifest['skipped']}
    expected_skips = {f'train/F603/{name}': word for name, word in messy_files.items() if word is not None}
    assert set(skipped) == set(expected_skips)
    for path, word in expected_skips.items():
        assert word in skipped[path], (path, skipped[path])
    usable = sorted(name for name, word in messy_files.items() if word is None)
    pattern = np.asarray(pattern_image)
    for record_format in onu_dataset.RECORD_FORMATS:
        assert manifest['splits']['train'][record_format]['records_per_class'] == {'F603': len(usable), 'F663N': 1}
    raw = {f[onu_dataset.KEY_FILENAME].decode(): f for f in _read_records(records_dir, 'train', 'raw')}
    encoded = {f[onu_dataset.KEY_FILENAME].decode(): f for f in _read_records(records_dir, 'train', 'encoded')}
    for name in usable:
        key = f'train/F603/{name}'
        path = os.path.join(messy_data_dir, key)
        raw_pixels = _raw_pixels(raw[key])
        payload, payload_format = encoded[key][onu_dataset.KEY_ENCODED], encoded[key][onu_dataset.KEY_FORMAT]
        decoded = _decode(payload, payload_format)
        assert raw_pixels.shape == decoded.shape == pattern.shape, name
        if name in ('png_named.jpg', 'rgba.png', 'bitmap.bmp'):  # lossless sources: exact pixels, PNG records
            assert payload_format == b'png'
            np.testing.assert_array_equal(raw_pixels, pattern)
            np.testing.assert_array_equal(decoded, pattern)
            with open(path, 'rb') as f:  # PNGs kept byte for byte (their alpha dropped by every reader alike)
                assert (payload == f.read()) == (name != 'bitmap.bmp'), name
            continue
        assert payload_format == b'jpeg'
        expected = np.asarray(pattern_image.convert('L').convert('RGB')) if name == 'gray.jpg' else pattern
        assert np.abs(raw_pixels.astype(int) - expected).mean() < 4, name  # upright, right colours
        with open(path, 'rb') as f:
            unchanged = payload == f.read()
        if name in ('cmyk.jpg', 'exif_rotated.jpg'):  # re-encoded upright RGB, close to the decoded original
            assert not unchanged
            assert np.abs(decoded.astype(int) - raw_pixels).mean() < 4, name  # a misoriented image differs by ~100
        else:
            assert unchanged, name
            np.testing.assert_array_equal(decoded, raw_pixels)
    with Image.open(os.path.join(messy_data_dir, 'train/F603/cmyk.jpg')) as cmyk:
        np.testing.assert_array_equal(_raw_pixels(raw['train/F603/cmyk.jpg']), np.asarray(cmyk.convert('RGB')))
    assert os.path.isfile(os.path.join(records_dir, onu_dataset.LABELS_FILENAME))


def test_strict_fails_on_unreadable_files_but_not_on_hidden_ones(messy_data_dir, make_tiny_dataset, tmp_path):
    records_dir = str(tmp_path / 'records')
    with pytest.raises(onu_errors.DataError) as error:
        onu_converter.convert(onu_dataset.describe(messy_data_dir), records_dir, strict=True, processes=1)
    message = str(error.value)
    assert '\n' not in message and '--strict' in message and os.path.join(messy_data_dir, 'train', 'F603') in message
    assert not os.path.exists(records_dir)
    data_dir = make_tiny_dataset()
    for name in ('.DS_Store', 'Thumbs.db'):
        with open(os.path.join(data_dir, 'train', 'F603', name), 'wb') as f:
            f.write(b'\x00' * 10)
    manifest = onu_converter.convert(onu_dataset.describe(data_dir), records_dir, formats=('encoded',), strict=True, processes=1)
    assert [s['reason'] for s in manifest['skipped']] == [onu_photos.REASON_HIDDEN] * 2


def test_a_file_failing_to_decode_is_skipped_in_raw_or_fails_strict(make_tiny_dataset, monkeypatch, capsys):
    data_dir = make_tiny_dataset()
    broken = os.path.join(data_dir, 'train', 'F663N', '00002.jpg')
    real_upright_rgb = onu_photos.upright_rgb

    def failing_upright_rgb(path, orientation):
        if path == broken:
            raise OSError('broken data\nstream')
        return real_upright_rgb(path, orientation)

    monkeypatch.setattr(onu_photos, 'upright_rgb', failing_upright_rgb)
    records_dir = os.path.join(data_dir, 'tfrecords')
    with pytest.raises(onu_errors.DataError) as error:
        onu_converter.convert(onu_dataset.describe(data_dir), formats=('raw',), strict=True, processes=1)
    assert str(error.value) == f'{broken}: decode failed: broken data stream (--strict): fix or remove the file'
    assert not any(name.endswith('.tfrecord') or '.tmp-' in name for name in os.listdir(records_dir))
    capsys.readouterr()
    manifest = onu_converter.convert(onu_dataset.describe(data_dir), processes=1)
    assert manifest['skipped'] == [
        {'path': 'train/F663N/00002.jpg', 'reason': 'decode failed: broken data stream', 'format': 'raw',
         'split': 'train'}]
    assert manifest['splits']['train']['raw']['records_per_class'] == {'F603': 4, 'F663N': 3}
    assert manifest['splits']['train']['encoded']['records_per_class'] == {'F603': 4, 'F663N': 4}
    assert len(_read_records(records_dir, 'train', 'raw')) == 7
    # 12 photos, each written in both formats or skipped in that format: one file skipped (in raw) of 12.
    assert capsys.readouterr().out.splitlines()[-1] == (
        f'skipped 1 of 12 files: 1 decode failed; the list: {os.path.join(records_dir, "manifest.json")}')


def test_class_set_mismatch_and_output_inside_photos_are_errors(make_tiny_dataset):
    data_dir = make_tiny_dataset()
    with pytest.raises(onu_errors.DataError) as error:
        onu_converter.convert(onu_dataset.describe(data_dir), os.path.join(data_dir, 'train', 'records'), processes=1)
    assert 'inside the photo folder' in str(error.value)
    shutil.rmtree(os.path.join(data_dir, 'val', 'F603'))
    with pytest.raises(onu_errors.DataError) as error:
        onu_converter.convert(onu_dataset.describe(data_dir), processes=1)
    assert "missing in val: ['F603']" in str(error.value)
    assert not os.path.exists(os.path.join(data_dir, 'tfrecords'))


@pytest.mark.parametrize('record_format', onu_dataset.RECORD_FORMATS)
def test_num_shards_0_makes_shards_of_about_100_mb_and_never_an_empty_one(record_format):
    """--num_shards=0: as many shards as make each about 100 MB (at most), and never more shards than images."""
    photo = types.SimpleNamespace(num_bytes=3_000_000, height=2000, width=3000)  # 18 MB of raw pixels
    for count in (1, 20, 200):
        images = [photo] * count
        total = count * (photo.num_bytes if record_format == 'encoded' else photo.height * photo.width * 3)
        shards = onu_converter._num_shards(0, images, record_format)
        assert total / shards <= 100 << 20 and (shards == 1 or total / shards > 50 << 20), (count, shards)
        assert onu_converter._num_shards(count + 5, images, record_format) == count  # none left empty


def test_shards_are_renamed_into_place_only_after_a_full_read_back(make_tiny_dataset, monkeypatch):
    data_dir = make_tiny_dataset()
    renames = []
    real_replace = os.replace

    def recording_replace(source, destination):
        if destination.endswith('.tfrecord'):
            renames.append((source, destination, onu_tfrecord.count_records(source, 'NONE')))
        real_replace(source, destination)

    monkeypatch.setattr(onu_converter.os, 'replace', recording_replace)
    manifest = onu_converter.convert(onu_dataset.describe(data_dir), num_shards=2, processes=1)
    records_dir = os.path.join(data_dir, 'tfrecords')
    expected = {os.path.join(records_dir, s['file']): s['records']
                for split in manifest['splits'].values() for entry in split.values() for s in entry['shards']}
    assert {destination: count for _, destination, count in renames} == expected
    for source, destination, _ in renames:
        assert source == f'{destination}.tmp-{os.getpid()}'


def test_interrupted_run_leaves_no_complete_looking_shard(make_tiny_dataset, monkeypatch):
    data_dir = make_tiny_dataset()
    records_dir = os.path.join(data_dir, 'tfrecords')
    os.makedirs(records_dir)
    stale_temp = os.path.join(records_dir, 'train-raw-00000-of-00002.tfrecord.tmp-99999')
    with open(stale_temp, 'wb') as f:
        f.write(b'left by a killed run')
    real_count = onu_tfrecord.count_records
    calls = []

    def interrupted_count(path, compression):
        calls.append(path)
        if len(calls) == 2:
            assert os.path.getsize(path) > 0  # the shard is fully written, under its temporary name
            raise KeyboardInterrupt
        return real_count(path, compression)

    monkeypatch.setattr(onu_tfrecord, 'count_records', interrupted_count)
    with pytest.raises(KeyboardInterrupt):
        onu_converter.convert(onu_dataset.describe(data_dir), formats=('raw',), num_shards=2, processes=1)
    assert sorted(os.listdir(records_dir)) == [onu_dataset.LABELS_FILENAME, onu_dataset.MANIFEST_FILENAME,
                                               'train-raw-00000-of-00002.tfrecord']
    assert onu_dataset.read_manifest(records_dir)['splits']['train'] == {}  # readers see no raw records yet
    monkeypatch.setattr(onu_tfrecord, 'count_records', real_count)
    manifest = onu_converter.convert(onu_dataset.describe(data_dir), formats=('raw',), num_shards=2, processes=1)
    assert [len(_read_records(records_dir, s, 'raw')) for s in onu_dataset.SPLITS] == [8, 4]
    assert manifest['splits']['train']['raw']['records'] == 8


def test_rerun_is_a_noop_until_inputs_change_or_overwrite(make_tiny_dataset, capsys):
    data_dir = make_tiny_dataset()
    records_dir = os.path.join(data_dir, 'tfrecords')
    first = onu_converter.convert(onu_dataset.describe(data_dir), processes=1)
    shards = _shard_identities(records_dir)
    capsys.readouterr()
    again = onu_converter.convert(onu_dataset.describe(data_dir), processes=1)
    assert 'up to date' in capsys.readouterr().out
    assert again == first and _shard_identities(records_dir) == shards
    onu_converter.convert(onu_dataset.describe(data_dir), processes=1, overwrite=True)
    assert set(_shard_identities(records_dir)) == set(shards)
    assert all(_shard_identities(records_dir)[n][0] != shards[n][0] for n in shards)  # every shard rewritten
    shutil.copy(os.path.join(data_dir, 'val', 'F603', '00000.jpg'), os.path.join(data_dir, 'val', 'F603', 'new.jpg'))
    changed = onu_converter.convert(onu_dataset.describe(data_dir), processes=1)
    assert 'up to date' not in capsys.readouterr().out
    assert changed['splits']['val']['encoded']['records_per_class'] == {'F603': 3, 'F663N': 2}


def test_formats_built_separately_share_one_manifest_until_settings_change(make_tiny_dataset):
    data_dir = make_tiny_dataset()
    records_dir = os.path.join(data_dir, 'tfrecords')
    onu_converter.convert(onu_dataset.describe(data_dir), formats=('encoded',), processes=1)
    encoded_shards = _shard_identities(records_dir)
    manifest = onu_converter.convert(onu_dataset.describe(data_dir), formats=('raw',), processes=1)
    assert set(manifest['splits']['train']) == {'raw', 'encoded'}
    assert {n: v for n, v in _shard_identities(records_dir).items() if 'encoded' in n} == encoded_shards
    manifest = onu_converter.convert(onu_dataset.describe(data_dir), formats=('raw',), overwrite=True, processes=1)
    assert set(manifest['splits']['val']) == {'raw', 'encoded'}  # --overwrite rebuilds only what was asked for
    assert {n: v for n, v in _shard_identities(records_dir).items() if 'encoded' in n} == encoded_shards
    gzip = onu_converter.convert(onu_dataset.describe(data_dir), formats=('raw',), compression='GZIP', processes=1)
    assert gzip['compression'] == 'GZIP' and set(gzip['splits']['train']) == {'raw'}
    assert not any('encoded' in name for name in os.listdir(records_dir))  # stale records removed
    records = _read_records(records_dir, 'train', 'raw')
    assert len(records) == 8 and all(len(f[onu_dataset.KEY_RAW]) == 48 * 64 * 3 for f in records)
    assert gzip['splits']['train']['raw']['record_bytes'] < gzip['splits']['train']['raw']['pixel_bytes']


def test_summary_table(tiny_records_dir):
    table = onu_converter.summary_table(onu_dataset.read_manifest(tiny_records_dir)).splitlines()
    assert table[0].split() == ['split', 'format', 'images', 'F603', 'F663N', 'skipped', 'source', 'MB', 'record',
                                'MB', 'ratio', 'seconds']
    assert [row.split()[:6] for row in table[1:]] == [
        ['train', 'raw', '8', '4', '4', '0'], ['train', 'encoded', '8', '4', '4', '0'],
        ['val', 'raw', '4', '2', '2', '0'], ['val', 'encoded', '4', '2', '2', '0']]


def test_script_exit_codes_and_output(make_tiny_dataset, tmp_path):
    missing = run_script(SCRIPT, f'--data_dir={tmp_path / "nowhere"}', timeout=120)
    assert missing.returncode == 2
    assert missing.stderr.startswith('error: ') and missing.stderr.count('\n') == 1
    assert f'{tmp_path / "nowhere"}: data dir not found' in missing.stderr and 'make_sample_data.py' in missing.stderr
    data_dir = make_tiny_dataset()
    exif = Image.Exif()
    exif[EXIF_ORIENTATION_TAG] = 6  # a phone photo stored on its side: the records hold it upright, the file stays
    Image.new('RGB', (64, 48), (200, 30, 30)).save(os.path.join(data_dir, 'train', 'F603', 'phone.jpg'),
                                                   exif=exif.tobytes())
    before, listed = file_states(*(os.path.join(data_dir, split) for split in onu_dataset.SPLITS)), os.listdir(data_dir)
    done = run_script(SCRIPT, f'--data_dir={data_dir}', '--format=encoded', '--processes=1')
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].split()[:3] == ['split', 'format', 'images']
    assert onu_dataset.read_manifest(os.path.join(data_dir, 'tfrecords'))['splits']['val']['encoded']['records'] == 4
    # README: the tools never modify, move or delete your photos, and write nothing there but tfrecords/.
    assert file_states(*(os.path.join(data_dir, split) for split in onu_dataset.SPLITS)) == before
    assert sorted(os.listdir(data_dir)) == sorted(listed + ['tfrecords'])


def run_with_import_log(script, *args):
    """Runs a repo script under `python -X importtime` (each process logs its imports to stderr)."""
    return run_script(sys.executable, '-X', 'importtime', os.path.join(REPO_ROOT, script), *args)


def imports_by_process(stderr, module):
    """Returns how many processes imported module, from `python -X importtime` output (its top-level line)."""
    return sum(1 for line in stderr.splitlines() if line.startswith('import time:') and line.split('|')[-1].strip() == module)


def test_workers_of_the_data_scripts_and_of_training_never_import_tensorflow(make_tiny_dataset, tmp_path):
    """Generation, conversion and training's on-demand conversion start worker processes without TensorFlow."""
    # -X importtime is passed on to the spawned workers, which log their imports to the same stderr.
    data_dir = str(tmp_path / 'data')
    generated = run_with_import_log('make_sample_data.py', f'--data_dir={data_dir}', '--train_per_class=2',
                                    '--val_per_class=1', '--photo_size=64x48', '--processes=2')
    assert generated.returncode == 0, generated.stderr[-3000:]
    # This process and at least one worker: the pool is terminated once the work is done, so a worker still
    # starting up on a slow machine may be stopped before its imports (6 photos are done by the first).
    assert imports_by_process(generated.stderr, 'onu_lib.onu_sample_data') >= 2
    assert imports_by_process(generated.stderr, 'tensorflow') == 0
    converted = run_with_import_log('convert_to_tfrecord.py', f'--data_dir={data_dir}', '--format=raw',
                                    '--processes=2')
    assert converted.returncode == 0, converted.stderr[-3000:]
    assert imports_by_process(converted.stderr, 'onu_lib.onu_converter') >= 2
    assert imports_by_process(converted.stderr, 'tensorflow') == 0  # shards written and checked by onu_tfrecord
    fresh_dir = make_tiny_dataset('fresh')  # no records yet: training converts them
    photos = file_states(*(os.path.join(fresh_dir, split) for split in onu_dataset.SPLITS))
    listed = os.listdir(fresh_dir)
    trained = run_with_import_log('onu_train.py', f'--data_dir={fresh_dir}', f'--train_dir={tmp_path / "train"}',
                                  '--data_format=raw', '--max_steps=1', '--image_size=32', '--batch_size=2',
                                  '--model=small')
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert 'no raw records: converting them now' in trained.stdout
    assert imports_by_process(trained.stderr, 'onu_lib.onu_converter') >= 2  # training converted with worker processes
    assert imports_by_process(trained.stderr, 'tensorflow') == 1
    # Training's conversion too leaves the photos as they were and writes nothing there but tfrecords/.
    assert file_states(*(os.path.join(fresh_dir, split) for split in onu_dataset.SPLITS)) == photos
    assert sorted(os.listdir(fresh_dir)) == sorted(listed + ['tfrecords'])


# ---------------------------------------------------------------------------------------------
# Other sources: PNG folders, bare class folders, other tools' records.

def test_png_photos_are_kept_byte_for_byte_so_records_stay_the_size_of_the_photos(tmp_path):
    data_dir = str(tmp_path / 'digits')
    rng = np.random.default_rng(0)
    for split, count in (('train', 20), ('val', 5)):
        for class_name in ('3', '8'):
            os.makedirs(os.path.join(data_dir, split, class_name))
            for index in range(count):
                digit = (rng.random((28, 28)) > 0.7).astype(np.uint8) * 255  # MNIST-like 28x28 grey
                Image.fromarray(digit, 'L').save(os.path.join(data_dir, split, class_name, f'{index}.png'))
    manifest = onu_converter.convert(onu_dataset.describe(data_dir), formats=('encoded',), processes=1)
    entry = manifest['splits']['train']['encoded']
    # Only the keys (label, class, size, file name) are added: the images are not re-encoded (they grew 3x as RGB).
    assert entry['record_bytes'] < entry['source_bytes'] + 250 * entry['records']
    for features in _read_records(os.path.join(data_dir, 'tfrecords'), 'train', 'encoded'):
        with open(os.path.join(data_dir, features[onu_dataset.KEY_FILENAME].decode()), 'rb') as f:
            assert features[onu_dataset.KEY_ENCODED] == f.read()
        assert features[onu_dataset.KEY_FORMAT] == b'png'


def test_bare_class_folders_convert_with_their_split_recorded(make_tiny_dataset):
    data_dir = make_tiny_dataset(train_per_class=10)
    photos_dir = data_dir + '_photos'
    for class_name in ('F603', 'F663N'):
        shutil.copytree(os.path.join(data_dir, 'train', class_name), os.path.join(photos_dir, class_name))
    done = run_script(SCRIPT, f'--data_dir={photos_dir}', '--format=encoded', '--processes=1',
                      '--validation_percent=30')
    assert done.returncode == 0, done.stderr
    records_dir = os.path.join(photos_dir, 'tfrecords')
    manifest = onu_dataset.read_manifest(records_dir)
    assert manifest['validation_percent'] == 30.0 and manifest['class_names'] == ['F603', 'F663N']
    for split in onu_dataset.SPLITS:
        names = {f[onu_dataset.KEY_FILENAME].decode() for f in _read_records(records_dir, split, 'encoded')}
        assert names and {onu_dataset.split_of(name, 30.0) for name in names} == {split}
    again = run_script(SCRIPT, f'--data_dir={photos_dir}', '--format=encoded', '--processes=1',
                       '--validation_percent=30')
    assert 'up to date' in again.stdout


def test_the_studys_raw_records_convert_to_encoded_records_of_the_same_pixels(tmp_path):
    photos = layout_photos()
    study = write_layout('single_file', str(tmp_path / 'study'), photos, data_format='raw')
    done = run_script(SCRIPT, f'--data_dir={study}', '--format=encoded', '--processes=2')
    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[0].split()
    assert header[:3] == ['split', 'format', 'images'] and 'ratio' in header
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines()[1:3]}
    assert rows['train'][2] == '12' and float(rows['train'][header.index('ratio') - 2]) < 1.0  # PNG < raw pixels
    records_dir = os.path.join(study, 'tfrecords')
    assert onu_dataset.read_manifest(records_dir)['class_names'] == ['class_0', 'class_1', 'class_2']
    records = _read_records(records_dir, 'train', 'encoded')
    by_name = {f'603_663_train_raw.tfrecord#{index}': photo
               for index, photo in enumerate(p for p in photos if p.split == 'train')}
    for features in records:
        photo = by_name[features[onu_dataset.KEY_FILENAME].decode()]
        assert features[onu_dataset.KEY_LABEL] == photo.label and features[onu_dataset.KEY_FORMAT] == b'png'
        np.testing.assert_array_equal(_decode(features[onu_dataset.KEY_ENCODED], b'png'),
                                      np.asarray(Image.open(io.BytesIO(photo.data)).convert('RGB')))


def test_a_damaged_record_of_another_tool_stops_the_conversion_in_one_line_and_is_never_rewritten(tmp_path):
    inception = write_layout('inception', str(tmp_path / 'inception'), layout_photos())
    shard = os.path.join(inception, 'train-00001-of-00002')
    payloads = list(tf.compat.v1.io.tf_record_iterator(shard))
    data = bytearray(open(shard, 'rb').read())
    data[sum(16 + len(p) for p in payloads[:3]) + 12 + len(payloads[3]) // 2] ^= 0x01  # inside record 4's JPEG
    open(shard, 'wb').write(bytes(data))
    assert onu_tfrecord.read_framing(shard, 'NONE') == onu_tfrecord.Framing(6, None)  # only its CRC tells
    before = _tree_digest(inception)
    records_dir = str(tmp_path / 'records')
    done = run_script(SCRIPT, f'--data_dir={inception}', f'--output_dir={records_dir}', '--format=encoded',
                      '--num_shards=2', '--processes=1')
    assert done.returncode == 2
    assert done.stderr == (f'error: {shard}: record 4 is damaged (its payload CRC does not match); re-create the '
                           f'file with the tool that wrote it, or move it away\n')
    assert _tree_digest(inception) == before
    # The shard the damaged record would go to never appears; one finished before it was read holds only sound
    # records; the manifest lists none of them.
    shards = sorted(name for name in os.listdir(records_dir) if name.startswith(('train-', 'val-')))
    assert shards in ([], ['train-encoded-00000-of-00002.tfrecord'])
    for name in shards:
        assert onu_tfrecord.read_framing(os.path.join(records_dir, name), 'NONE', verify=True) == (
            onu_tfrecord.Framing(6, None))
    assert onu_dataset.read_manifest(records_dir)['splits'] == {'train': {}, 'val': {}}


def test_inception_records_convert_with_their_offset_and_names(tmp_path):
    photos = layout_photos()
    inception = write_layout('inception', str(tmp_path / 'inception'), photos)
    manifest = onu_converter.convert(onu_dataset.describe(inception), formats=('raw', 'encoded'), processes=1)
    assert manifest['class_names'] == list(LAYOUT_CLASSES) and manifest['source']['labels_offset'] == 1
    records_dir = os.path.join(inception, 'tfrecords')
    for record_format in onu_dataset.RECORD_FORMATS:
        records = _read_records(records_dir, 'val', record_format)
        expected = {photo.name: photo for photo in photos if photo.split == 'val'}
        assert sorted(f[onu_dataset.KEY_FILENAME].decode() for f in records) == sorted(expected)
        for features in records:
            photo = expected[features[onu_dataset.KEY_FILENAME].decode()]
            assert features[onu_dataset.KEY_LABEL] == photo.label
            assert features[onu_dataset.KEY_TEXT].decode() == LAYOUT_CLASSES[photo.label]
            if record_format == 'encoded':
                assert features[onu_dataset.KEY_ENCODED] == photo.data  # the JPEG kept as it was
            else:
                np.testing.assert_array_equal(_raw_pixels(features), _decode(photo.data, b'jpeg'))
