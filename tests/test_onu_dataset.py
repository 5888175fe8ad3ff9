"""Tests of onu_dataset: what a data folder holds, described once (DataDir, DatasetInfo), class discovery, header-only
image listing, skip reasons, labels and manifest files, this repo's records and their errors."""

import ast
import collections
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from PIL import ImageOps

from conftest import REPO_ROOT, layout_photos, run_script, write_layout
from onu_lib import onu_errors
from onu_lib import onu_photos
from onu_lib import onu_dataset
from onu_lib import onu_files
from onu_lib import onu_layouts


def _one_line(error):
    """The message of a DataError, checked to be one line."""
    message = str(error.value)
    assert '\n' not in message
    return message


def test_find_class_names_sorted_train_folders(make_tiny_dataset):
    data_dir = make_tiny_dataset()
    os.makedirs(os.path.join(data_dir, 'train', '.hidden_class'))
    assert onu_dataset.find_class_names(data_dir) == ['F603', 'F663N']


def test_find_class_names_without_photos_says_where_they_go(tmp_path):
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.find_class_names(str(tmp_path))
    message = _one_line(error)
    assert f'{tmp_path}/<class>/' in message and f'{tmp_path}/train/<class>/' in message
    assert 'make_sample_data.py' in message


def test_find_class_names_class_missing_in_val(make_tiny_dataset):
    data_dir = make_tiny_dataset()
    shutil.rmtree(os.path.join(data_dir, 'val', 'F663N'))
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.find_class_names(data_dir)
    assert "missing in val: ['F663N']" in _one_line(error)


def test_find_class_names_extra_class_in_val(make_tiny_dataset):
    data_dir = make_tiny_dataset()
    shutil.copytree(os.path.join(data_dir, 'val', 'F663N'), os.path.join(data_dir, 'val', 'ZXHN'))
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.find_class_names(data_dir)
    assert "only in val: ['ZXHN']" in _one_line(error)


@pytest.mark.parametrize('content', [None, b'not a photo'])
def test_find_class_names_class_without_readable_images(make_tiny_dataset, content):
    data_dir = make_tiny_dataset()
    class_dir = os.path.join(data_dir, 'val', 'F603')
    shutil.rmtree(class_dir)
    os.makedirs(class_dir)
    if content is not None:
        with open(os.path.join(class_dir, 'broken.jpg'), 'wb') as f:
            f.write(content)
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.find_class_names(data_dir)
    message = _one_line(error)
    assert class_dir in message and 'no readable images' in message


def test_list_split_images_sorted_with_labels(make_tiny_dataset):
    data_dir = make_tiny_dataset(train_per_class=3, image_size=(80, 60))
    images, skipped = onu_dataset.list_split_images(data_dir, 'train', ['F603', 'F663N'])
    assert skipped == []
    assert [(i.label, i.class_name, os.path.basename(i.path)) for i in images] == [
        (0, 'F603', '00000.jpg'), (0, 'F603', '00001.jpg'), (0, 'F603', '00002.jpg'),
        (1, 'F663N', '00000.jpg'), (1, 'F663N', '00001.jpg'), (1, 'F663N', '00002.jpg')]
    for info in images:
        assert (info.width, info.height, info.image_format, info.mode, info.orientation) == (80, 60, 'JPEG', 'RGB', 1)
        assert info.num_bytes == os.path.getsize(info.path)
        assert info.is_kept_as_is


def test_list_split_images_sniffs_content_and_reports_each_skip(messy_data_dir, messy_files):
    images, skipped = onu_dataset.list_split_images(messy_data_dir, 'train', ['F603', 'F663N'])
    class_dir = os.path.join(messy_data_dir, 'train', 'F603')
    used = {os.path.basename(i.path): i for i in images if i.label == 0}
    assert set(used) == {name for name, reason in messy_files.items() if reason is None}
    reasons = {os.path.relpath(path, class_dir): reason for path, reason in skipped}
    assert set(reasons) == {name for name, reason in messy_files.items() if reason is not None}
    for name, word in messy_files.items():
        if word is not None:
            assert word in reasons[name], (name, reasons[name])
    assert reasons['.DS_Store'] == reasons['Thumbs.db'] == onu_photos.REASON_HIDDEN
    assert 'truncated' in reasons['truncated.jpg']
    expected = {  # name: (format, mode, orientation, kept byte for byte in encoded records)
        'plain.jpg': ('JPEG', 'RGB', 1, True), 'gray.jpg': ('JPEG', 'L', 1, True),
        'cmyk.jpg': ('JPEG', 'CMYK', 1, False), 'exif_rotated.jpg': ('JPEG', 'RGB', 6, False),
        'png_named.jpg': ('PNG', 'RGB', 1, True), 'rgba.png': ('PNG', 'RGBA', 1, True),
        'bitmap.bmp': ('BMP', 'RGB', 1, False), 'ünïcødé 照片.jpg': ('JPEG', 'RGB', 1, True),
        'trailing_data.jpg': ('JPEG', 'RGB', 1, True)}
    for name, (image_format, mode, orientation, kept) in expected.items():
        info = used[name]
        assert (info.image_format, info.mode, info.orientation, info.is_kept_as_is) == (
            image_format, mode, orientation, kept), name
        assert (info.width, info.height) == (48, 32), name  # upright size, also for the rotated file
    assert [i.path for i in images] == sorted(i.path for i in images)
    info = onu_dataset.describe(messy_data_dir).split('train', 'images')  # the description keeps what was skipped
    assert set(info.skipped) == set(skipped) and set(info.files) == {i.path for i in images}


def test_upright_rgb_matches_pillow_exif_transpose(tmp_path, pattern_image):
    for orientation in range(1, 9):
        exif = Image.Exif()
        exif[onu_photos.EXIF_ORIENTATION_TAG] = orientation
        path = str(tmp_path / f'o{orientation}.png')
        pattern_image.save(path, exif=exif.tobytes())
        info = onu_photos.read_image_info(path)
        assert info.orientation == orientation
        with Image.open(path) as image:
            expected = np.asarray(ImageOps.exif_transpose(image).convert('RGB'))
        actual = np.asarray(onu_photos.upright_rgb(path, info.orientation))
        np.testing.assert_array_equal(actual, expected)
        assert actual.shape == (info.height, info.width, 3)


def test_read_image_info_ignores_invalid_orientation(tmp_path, pattern_image):
    exif = Image.Exif()
    exif[onu_photos.EXIF_ORIENTATION_TAG] = 9
    path = str(tmp_path / 'odd.jpg')
    pattern_image.save(path, exif=exif.tobytes())
    info = onu_photos.read_image_info(path)
    assert (info.orientation, info.width, info.height) == (1, 48, 32)


def test_labels_round_trip_and_format(tmp_path):
    path = str(tmp_path / onu_dataset.LABELS_FILENAME)
    onu_dataset.write_labels(path, ['F603', 'F663N'])
    with open(path, encoding='utf-8') as f:
        assert f.read() == '0:F603\n1:F663N\n'
    assert onu_dataset.read_labels(path) == ['F603', 'F663N']
    assert os.listdir(tmp_path) == [onu_dataset.LABELS_FILENAME]  # no temporary file left


@pytest.mark.parametrize('text, expected', [(None, 'not found'), ('0:F603\n2:F663N\n', 'line 2')])
def test_read_labels_errors(tmp_path, text, expected):
    path = str(tmp_path / 'labels.txt')
    if text is not None:
        with open(path, 'w', encoding='utf-8') as f:
            f.write(text)
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.read_labels(path)
    message = _one_line(error)
    assert path in message and expected in message


def test_read_manifest_missing_and_invalid(tmp_path):
    records_dir = str(tmp_path)
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.read_manifest(records_dir)
    assert 'convert_to_tfrecord.py' in _one_line(error)
    with open(os.path.join(records_dir, onu_dataset.MANIFEST_FILENAME), 'w', encoding='utf-8') as f:
        f.write('{"version": 1, ')
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.read_manifest(records_dir)
    assert '--overwrite' in _one_line(error)


def test_manifest_round_trip_and_shard_paths(tmp_path):
    records_dir = str(tmp_path)
    manifest = {'version': onu_dataset.MANIFEST_VERSION, 'compression': 'GZIP', 'splits': {'train': {'encoded': {
        'shards': [{'file': onu_dataset.shard_filename('train', 'encoded', i, 2)} for i in range(2)]}}}}
    onu_dataset.write_manifest(records_dir, manifest)
    loaded = onu_dataset.read_manifest(records_dir)
    assert loaded == json.loads(json.dumps(manifest))
    assert onu_dataset.shard_paths(records_dir, loaded, 'train', 'encoded') == [
        os.path.join(records_dir, 'train-encoded-00000-of-00002.tfrecord'),
        os.path.join(records_dir, 'train-encoded-00001-of-00002.tfrecord')]
    assert onu_dataset.tf_compression_type(loaded['compression']) == 'GZIP'
    assert onu_dataset.tf_compression_type('NONE') == ''
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.shard_paths(records_dir, loaded, 'train', 'raw')
    assert '--format=raw' in _one_line(error)


def test_records_dir_is_the_folder_with_the_manifest(tmp_path):
    data_dir = str(tmp_path)
    os.makedirs(os.path.join(data_dir, 'F603'))  # a class folder: photos, no records yet
    assert onu_dataset.describe(data_dir).records_dir() == os.path.join(data_dir, onu_dataset.RECORDS_SUBDIR)
    onu_dataset.write_manifest(data_dir, {'version': onu_dataset.MANIFEST_VERSION})
    assert onu_dataset.describe(data_dir).records_dir() == data_dir


def test_importing_onu_dataset_does_not_import_tensorflow():
    code = 'import sys; from onu_lib import onu_dataset; print("tensorflow" in sys.modules)'
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True,
                            cwd=REPO_ROOT)
    assert result.stdout.strip() == 'False'


def _project_imports():
    """{module: the project's modules it imports, at the top or inside a function}, read from every .py outside tests/."""
    paths = {}
    for folder, subfolders, files in os.walk(REPO_ROOT):
        subfolders[:] = [name for name in subfolders if not name.startswith('.') and name not in ('tests', '__pycache__')]
        for name in files:
            if name.endswith('.py'):
                module = os.path.relpath(os.path.join(folder, name), REPO_ROOT)[:-3].replace(os.sep, '.')
                paths[module.removesuffix('.__init__')] = os.path.join(folder, name)
    imports = {}
    for module, path in paths.items():
        names = set()
        for node in ast.walk(ast.parse(open(path, encoding='utf-8').read())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.update([node.module] + [f'{node.module}.{alias.name}' for alias in node.names])
        imports[module] = names & set(paths) - {module}
    return imports


def test_the_project_has_no_import_loop():
    imports = _project_imports()
    assert 'onu_lib.onu_layouts' in imports['onu_lib.onu_dataset']  # `from onu_lib import onu_layouts` is seen
    done, path = set(), []

    def visit(module):
        """Walks module's imports depth first; fails naming the loop when one leads back to a module on the path."""
        assert module not in path, f'import loop: {" -> ".join(path[path.index(module):] + [module])}'
        if module not in done:
            path.append(module)
            for imported in sorted(imports[module]):
                visit(imported)
            path.pop()
            done.add(module)
    for module in sorted(imports):
        visit(module)


def _listings(monkeypatch):
    """Counts, by real path, the folders os.scandir and os.listdir list from now on."""
    counts = collections.Counter()
    for name in ('scandir', 'listdir'):
        def counted(path='.', listing=getattr(os, name)):
            counts[os.path.realpath(path)] += 1
            return listing(path)
        monkeypatch.setattr(os, name, counted)
    return counts


@pytest.mark.parametrize('layout', onu_layouts.LAYOUT_NAMES + (onu_dataset.CLASS_FOLDERS, onu_dataset.RECORDS))
def test_describe_lists_each_folder_once(layout, tmp_path, monkeypatch):
    data_dir = str(tmp_path / 'data')
    if layout == onu_dataset.CLASS_FOLDERS:
        for name in ('F603', 'F663N'):
            os.makedirs(os.path.join(data_dir, name))
    elif layout == onu_dataset.RECORDS:
        os.makedirs(data_dir)
        onu_dataset.write_manifest(data_dir, {'version': onu_dataset.MANIFEST_VERSION})
    else:
        data_dir = write_layout(layout, data_dir, layout_photos(train=1, val=1))
    listings = _listings(monkeypatch)
    assert onu_dataset.describe(data_dir).layout == layout
    assert listings and max(listings.values()) == 1, listings


# ---------------------------------------------------------------------------------------------
# Bare class folders (PHOTOS/<class>/*, no split): the held-out split made by hashing each path.

def _bare_class_folders(make_tiny_dataset, name='bare', per_class=12):
    """A PHOTOS/<class>/* folder (no split) made from a tiny dataset's photos; returns its path."""
    data_dir = make_tiny_dataset(name, train_per_class=per_class, val_per_class=1)
    photos_dir = data_dir + '_photos'
    for class_name in ('F603', 'F663N'):
        shutil.copytree(os.path.join(data_dir, 'train', class_name), os.path.join(photos_dir, class_name))
    return photos_dir


def test_split_of_is_a_stable_fraction_of_paths_whatever_the_process():
    names = [f'class_{i % 7}/IMG_{i:05d}.jpg' for i in range(20000)]
    held_out = [name for name in names if onu_dataset.split_of(name, 10.0) == 'val']
    assert abs(len(held_out) / len(names) - 0.10) < 0.01
    assert {onu_dataset.split_of(name, 25.0) for name in held_out} == {'val'}  # a larger share keeps them
    # The same in another process with another hash seed: a hash of the bytes, not Python's hash().
    code = ('import sys; from onu_lib import onu_dataset; print(",".join(n for n in sys.argv[1:] if onu_dataset.split_of(n, 10.0) == "val"))')
    other = subprocess.run([sys.executable, '-c', code] + names[:500], capture_output=True, text=True, check=True,
                           cwd=REPO_ROOT,
                           env=dict(os.environ, PYTHONHASHSEED='12345'))
    assert other.stdout.strip().split(',') == [name for name in held_out if name in set(names[:500])]
    # macOS spells accented names decomposed: the same photo, the same split.
    assert onu_dataset.split_of('F603/caf\u00e9.jpg', 50.0) == onu_dataset.split_of('F603/cafe\u0301.jpg', 50.0)


def test_bare_class_folders_split_into_disjoint_sets_and_added_photos_move_no_old_one(make_tiny_dataset):
    photos_dir = _bare_class_folders(make_tiny_dataset)
    os.makedirs(os.path.join(photos_dir, onu_dataset.RECORDS_SUBDIR))  # where records would go: not a class
    assert not onu_dataset.has_split_folders(photos_dir)
    assert onu_dataset.find_class_names(photos_dir) == ['F603', 'F663N']

    def listed(percent):
        return {split: {image.path for image in onu_dataset.list_split_images(
            photos_dir, split, ['F603', 'F663N'], percent)[0]} for split in onu_dataset.SPLITS}
    before = listed(30.0)
    assert before['train'] and before['val'] and not before['train'] & before['val']
    for split, paths in before.items():  # each photo where split_of puts it, by its name under the folder
        assert {onu_dataset.split_of(os.path.relpath(path, photos_dir), 30.0) for path in paths} == {split}
    assert len(before['train'] | before['val']) == 24
    for index in range(20):  # new photos, old ones stay where they were
        shutil.copy(os.path.join(photos_dir, 'F603', '00000.jpg'), os.path.join(photos_dir, 'F603', f'new_{index}.jpg'))
    after = listed(30.0)
    assert before['train'] <= after['train'] and before['val'] <= after['val']
    assert len(after['train'] | after['val']) == 44
    # The description gives the same split, and says which percentage made it.
    data = onu_dataset.describe(photos_dir, validation_percent=30.0)
    assert (data.layout, data.photo_splits()) == (onu_dataset.CLASS_FOLDERS, ['train', 'val'])
    for split in onu_dataset.SPLITS:
        info = data.split(split, 'images')
        assert set(info.files) == after[split] and info.validation_percent == 30.0
        assert info.layout == onu_dataset.CLASS_FOLDERS


def test_records_dir_is_found_in_the_folder_or_in_the_cache(tmp_path):
    data_dir = str(tmp_path / 'data')
    os.makedirs(os.path.join(data_dir, 'F603'))
    assert onu_dataset.describe(data_dir).records_dir() == os.path.join(data_dir, onu_dataset.RECORDS_SUBDIR)
    cached = onu_dataset.cached_records_dir(data_dir)
    assert cached.startswith(onu_files.cache_dir()) and os.path.basename(cached).startswith('data-')
    os.makedirs(cached)
    onu_dataset.write_manifest(cached, {'version': onu_dataset.MANIFEST_VERSION})
    assert onu_dataset.describe(data_dir).records_dir() == cached
    assert onu_dataset.cached_records_dir(str(tmp_path / 'other' / 'data')) != cached  # same name, other folder


def test_records_of_a_folder_turned_read_only_are_found_by_format(tmp_path):
    data_dir = str(tmp_path / 'data')
    in_folder = os.path.join(data_dir, onu_dataset.RECORDS_SUBDIR)
    os.makedirs(in_folder)
    onu_dataset.write_manifest(in_folder, {'version': onu_dataset.MANIFEST_VERSION, 'splits': {'train': {'raw': {}}}})
    cached = onu_dataset.cached_records_dir(data_dir)
    os.makedirs(cached)
    onu_dataset.write_manifest(cached, {'version': onu_dataset.MANIFEST_VERSION, 'splits': {'train': {'encoded': {}}}})
    assert onu_dataset.records_dirs(data_dir) == [in_folder, cached]
    data = onu_dataset.describe(data_dir)
    assert data.records_dir('raw') == in_folder == data.records_dir()
    assert data.records_dir('encoded') == cached


# ---------------------------------------------------------------------------------------------
# The one description of a data folder: describe(), DataDir, DatasetInfo.

def _copy(tiny_data_dir, tmp_path):
    """A writable copy of the tiny photos and their records."""
    data_dir = str(tmp_path / 'data')
    shutil.copytree(tiny_data_dir, data_dir)
    return data_dir


def test_photos_with_their_records_are_described_from_the_manifest(tiny_data_dir, tiny_records_dir):
    data = onu_dataset.describe(tiny_data_dir)
    assert (data.layout, data.has_photos, data.record_formats, data.default_format()) == (
        onu_dataset.PHOTOS, True, ('encoded', 'raw'), 'encoded')
    assert data.records_dir() == data.records_dir('raw') == tiny_records_dir
    assert data.has_records('raw') and data.has_records('encoded') and not data.reads_other_tools_records('raw')
    manifest = onu_dataset.read_manifest(tiny_records_dir)
    for data_format, image_key in (('raw', onu_dataset.KEY_RAW), ('encoded', onu_dataset.KEY_ENCODED)):
        for split, count in (('train', 8), ('val', 4)):
            entry = manifest['splits'][split][data_format]
            info = data.split(split, data_format)
            assert (info.data_dir, info.data_format, info.split, info.layout) == (
                tiny_data_dir, data_format, split, onu_dataset.RECORDS)
            assert info.class_names == ('F603', 'F663N') and info.num_examples == count
            assert info.files == tuple(os.path.join(tiny_records_dir, shard['file']) for shard in entry['shards'])
            assert info.records_per_file == tuple(shard['records'] for shard in entry['shards'])
            assert (info.image_key, info.label_key, info.filename_key) == (
                image_key, onu_dataset.KEY_LABEL, onu_dataset.KEY_FILENAME)
            assert (info.height_key, info.width_key) == (onu_dataset.KEY_HEIGHT, onu_dataset.KEY_WIDTH)
            assert info.compression_type == '' and info.labels_offset == 0 and info.data_labels_offset is None
            assert info.bytes_per_example == entry['record_bytes'] // count and info.validation_percent is None
            assert info.record_name_prefixes == tuple(os.path.basename(path) + '#' for path in info.files)


def test_photos_are_described_file_by_file(tiny_data_dir):
    info = onu_dataset.describe(tiny_data_dir).split('val', 'images')
    assert (info.layout, info.data_format, info.num_examples, info.class_names) == (
        onu_dataset.PHOTOS, 'images', 4, ('F603', 'F663N'))
    assert info.files == tuple(sorted(info.files, key=lambda path: (os.path.basename(os.path.dirname(path)), path)))
    assert info.names == tuple(os.path.relpath(path, tiny_data_dir) for path in info.files)
    assert info.labels == (0, 0, 1, 1) and info.orientations == (1, 1, 1, 1) and info.skipped == ()
    assert all(path.startswith(os.path.join(tiny_data_dir, 'val') + os.sep) for path in info.files)


@pytest.mark.parametrize('val_name', ['val', 'validation', 'test'])
def test_the_val_split_is_the_first_of_its_names_there_is(make_tiny_dataset, val_name):
    data_dir = make_tiny_dataset()
    if val_name != 'val':
        os.rename(os.path.join(data_dir, 'val'), os.path.join(data_dir, val_name))
    if val_name == 'validation':  # preferred to test/ when both are there
        shutil.copytree(os.path.join(data_dir, val_name), os.path.join(data_dir, 'test'))
        for name in os.listdir(os.path.join(data_dir, 'test', 'F603')):
            os.remove(os.path.join(data_dir, 'test', 'F603', name))
    assert onu_dataset.split_dir(data_dir, 'val') == os.path.join(data_dir, val_name)
    assert onu_dataset.split_dir(data_dir, 'train') == os.path.join(data_dir, 'train')
    info = onu_dataset.describe(data_dir).split('val', 'images')
    assert info.num_examples == 4 and all(os.sep + val_name + os.sep in path for path in info.files)
    assert info.validation_percent is None  # the folders made the split
    assert onu_dataset.split_dir(str(data_dir) + '_none', 'val') == os.path.join(str(data_dir) + '_none', 'val')


def test_what_the_records_lack_is_one_line_naming_the_file_and_the_command(tiny_data_dir, tmp_path):
    data_dir = _copy(tiny_data_dir, tmp_path)
    records_dir = os.path.join(data_dir, onu_dataset.RECORDS_SUBDIR)
    convert = f'python convert_to_tfrecord.py --data_dir={data_dir} --format=raw'
    raw = onu_dataset.describe(data_dir).split('val', 'raw').files
    with open(raw[0], 'r+b') as f:  # cut short
        f.truncate(os.path.getsize(raw[0]) - 1)
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.describe(data_dir).split('val', 'raw')
    assert _one_line(error) == (f'{raw[0]}: {os.path.getsize(raw[0])} bytes on disk but {os.path.getsize(raw[0]) + 1} '
                                f'in the manifest (truncated or changed); re-create the records with {convert} --overwrite')
    os.remove(raw[0])
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.describe(data_dir).split('val', 'raw')
    assert _one_line(error) == (f'{raw[0]}: record file listed in the manifest is missing; re-create the records with '
                                f'{convert} --overwrite')
    assert onu_dataset.describe(data_dir).split('train', 'raw').num_examples == 8  # the other split still reads
    manifest = onu_dataset.read_manifest(records_dir)
    del manifest['splits']['val']['raw']
    onu_dataset.write_manifest(records_dir, manifest)
    data = onu_dataset.describe(data_dir)
    assert data.record_formats == ('encoded',) and not data.has_records('raw')  # raw: not for every split
    with pytest.raises(onu_errors.DataError) as error:
        data.split('val', 'raw')
    assert _one_line(error) == (f'{records_dir}: raw records of val were asked but the manifest lists only encoded '
                                f'records; write them with {convert}, or use --data_format=encoded')
    os.remove(os.path.join(records_dir, onu_dataset.LABELS_FILENAME))
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.describe(data_dir).split('train', 'encoded')
    assert _one_line(error).startswith(f'{os.path.join(records_dir, onu_dataset.LABELS_FILENAME)} not found: '
                                       f're-create the records with python convert_to_tfrecord.py')


def test_records_made_with_another_split_or_labels_offset_are_not_read_as_these(tiny_data_dir, tmp_path):
    data_dir = _copy(tiny_data_dir, tmp_path)
    records_dir = os.path.join(data_dir, onu_dataset.RECORDS_SUBDIR)
    manifest = onu_dataset.read_manifest(records_dir)
    onu_dataset.write_manifest(records_dir, dict(manifest, validation_percent=30.0,
                                                 source={'labels_offset': 1}))
    assert onu_dataset.describe(data_dir, validation_percent=30.0).has_records('encoded')
    asked = onu_dataset.describe(data_dir, validation_percent=20.0)
    assert not asked.has_records('encoded')
    assert asked.made_otherwise('encoded') == (
        f'{records_dir}: records split with --validation_percent=30, but 20 is asked; use --validation_percent=30, '
        f'or re-create them with python convert_to_tfrecord.py --data_dir={data_dir} --format=encoded '
        f'--validation_percent=20')
    offset = onu_dataset.describe(data_dir, validation_percent=30.0, labels_offset=0)
    assert not offset.has_records('raw') and offset.made_otherwise('raw') == (
        f'{records_dir}: records made with --labels_offset=1, but 0 is asked; use --labels_offset=1, or re-create '
        f'them with python convert_to_tfrecord.py --data_dir={data_dir} --format=raw --labels_offset=0')
    with pytest.raises(onu_errors.DataError) as error:
        offset.split('train', 'raw')
    assert '--labels_offset=1' in _one_line(error)
    made = onu_dataset.describe(data_dir, validation_percent=30.0, labels_offset=1)
    assert made.has_records('raw')
    info = made.split('train', 'raw')
    assert (info.validation_percent, info.data_labels_offset, info.labels_offset) == (30.0, 1, 0)  # stored 0-based
    onu_dataset.write_manifest(records_dir, dict(manifest, compression='GZIP'))
    assert onu_dataset.describe(data_dir).split('val', 'encoded').compression_type == 'GZIP'


def test_records_alone_are_read_in_their_own_format(tiny_records_dir, tmp_path):
    records_dir = str(tmp_path / 'records')
    shutil.copytree(tiny_records_dir, records_dir)
    data = onu_dataset.describe(records_dir)
    assert (data.layout, data.has_photos, data.default_format(), data.records_dir()) == (
        onu_dataset.RECORDS, False, 'encoded', records_dir)
    assert data.split('val', 'raw').num_examples == 4
    with pytest.raises(onu_errors.DataError) as error:
        data.split('train', 'images')
    assert _one_line(error) == f'{records_dir}: holds records, not photo folders: read them with --data_format=encoded'


def test_commands_in_messages_are_quoted_for_the_shell(tmp_path):
    data_dir = str(tmp_path / "my photos (2024)")
    command = onu_dataset.convert_command(data_dir, 'raw', 'overwrite')
    assert shlex.split(command) == ['python', 'convert_to_tfrecord.py', f'--data_dir={data_dir}', '--format=raw',
                                    '--overwrite']
    message = str(onu_dataset.missing_data_dir_error(data_dir))
    made = message.split('make sample data with ')[1].split(', or point')[0]
    assert shlex.split(made) == ['python', 'make_sample_data.py', f'--data_dir={data_dir}']


def test_an_empty_folder_is_one_line_saying_what_was_looked_for(tmp_path):
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.describe(str(tmp_path))
    message = _one_line(error)
    assert message.startswith(f'{tmp_path}: no data found; looked for photos in train/<class>/ and val/<class>/')
    assert 'manifest.json' in message and message.endswith('see README "Bring your own data"')
    with pytest.raises(onu_errors.DataError) as error:
        onu_dataset.describe(str(tmp_path / 'nowhere'))
    assert _one_line(error).startswith(f'{tmp_path / "nowhere"}: data dir not found; make sample data with ')


def test_skipped_files_are_one_line_counted_by_kind_of_reason():
    reasons = ['damaged JPEG file: image file is truncated (9 bytes not processed)', onu_photos.REASON_HIDDEN,
               'subfolder (images in subfolders are not read; move them up into the class folder)',
               onu_photos.REASON_HIDDEN, 'empty file']
    assert onu_dataset.skipped_line(reasons, 12, 'DATA/tfrecords/manifest.json') == (
        'skipped 5 of 12 files: 1 damaged JPEG file, 1 empty file, 2 hidden or system files, 1 subfolder; '
        'the list: DATA/tfrecords/manifest.json')


SKIPPED_LINE = re.compile(r'skipped (\d+) of (\d+) files: (.*); the list: (.*)$')


def _skipped_lines(result):
    """The skipped_line lines a script printed, as (skipped, total, counts, where)."""
    return [match.groups() for match in map(SKIPPED_LINE.search, (result.stdout + result.stderr).splitlines())
            if match]


def test_every_way_in_prints_the_same_one_line_of_skipped_files(make_tiny_dataset, tmp_path):
    data_dir = make_tiny_dataset()
    noisy = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (60, 80, 3), np.uint8)).save(noisy, 'JPEG')
    bad = {'.DS_Store': bytes(40), 'empty.jpg': b'', 'truncated.jpg': noisy.getvalue()[:noisy.tell() * 2 // 3]}
    for name, data in bad.items():
        with open(os.path.join(data_dir, 'train', 'F603', name), 'wb') as f:
            f.write(data)
    copies = {way: shutil.copytree(data_dir, str(tmp_path / way)) for way in ('images', 'converted', 'automatic')}
    train = ('--max_steps=1', '--model=small', '--image_size=32', '--batch_size=2', '--precision=float32')
    results = {
        'images': run_script('onu_train.py', *train, '--data_format=images', f'--data_dir={copies["images"]}',
                             f'--train_dir={tmp_path / "train_images"}'),
        'converted': run_script('convert_to_tfrecord.py', f'--data_dir={copies["converted"]}', '--format=encoded',
                                '--processes=1'),
        'automatic': run_script('onu_train.py', *train, '--data_format=encoded', f'--data_dir={copies["automatic"]}',
                                f'--train_dir={tmp_path / "train_automatic"}')}
    counts = '1 damaged JPEG file, 1 empty file, 1 hidden or system file'
    for way, result in results.items():
        assert result.returncode == 0, result.stderr[-3000:]
        assert 'skipping' not in result.stderr  # no warning for each file
        (line,) = _skipped_lines(result)
        total = 4 * 2 + 3 if way == 'images' else (4 + 2) * 2 + 3  # images: training lists the train split only
        assert line[:3] == ('3', str(total), counts), way
        if way == 'images':
            with open(line[3]) as f:
                listed = [row.split(': ')[0] for row in f.read().splitlines()]
            assert sorted(listed) == sorted(os.path.join(copies[way], 'train', 'F603', name) for name in bad)
        else:
            assert line[3] == os.path.join(copies[way], 'tfrecords', onu_dataset.MANIFEST_FILENAME)
            listed = [s['path'] for s in onu_dataset.read_manifest(os.path.dirname(line[3]))['skipped']]
            assert sorted(listed) == sorted(f'train/F603/{name}' for name in bad)
