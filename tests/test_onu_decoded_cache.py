"""The decoded epoch on local disk: each example once per epoch in a new order, reused, keyed by its data, and every
fault (killed mid-epoch, a full disk, a read-only folder, a damaged shard) one line with training going on."""
import collections
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from conftest import mount, read_only_bind_mount, run_script, start_script
from onu_lib import onu_dataset
from onu_lib import onu_decoded_cache
from onu_lib import onu_sample_data
from onu_lib import onu_tfrecord
import onu_input

IMAGE_SIZE = 32
SEED = 3
SCRIPT_FLAGS = ('--model=small', f'--image_size={IMAGE_SIZE}', '--batch_size=1', '--log_frequency=10',
                '--cache_decoded_epoch=disk')


def stream(info, cache, count, seed=SEED):
    """The first count training examples of info with cache (onu_input's): [(md5 of the pixels, label)]."""
    with tf.Graph().as_default():
        example = tf.compat.v1.data.make_one_shot_iterator(
            onu_input.training_examples(info, IMAGE_SIZE, cache, seed)).get_next()
        with tf.compat.v1.Session() as session:
            examples = []
            for _ in range(count):
                image, label = session.run(example)
                assert image.shape == (IMAGE_SIZE, IMAGE_SIZE, 3)
                examples.append((hashlib.md5(image.tobytes()).hexdigest(), int(label)))
            return examples


def epochs(examples, size):
    """examples cut into epochs of size."""
    return [examples[start:start + size] for start in range(0, len(examples), size)]


def decoded_epoch(info):
    """The multiset of one epoch of info decoded without a cache."""
    with tf.Graph().as_default():
        dataset = onu_input._decoded_examples(info, IMAGE_SIZE, False, SEED, repeat=False)
        example = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        with tf.compat.v1.Session() as session:
            return collections.Counter((hashlib.md5(image.tobytes()).hexdigest(), int(label))
                                       for image, label in (session.run(example) for _ in range(info.num_examples)))


def complete_folders(root):
    """The cache folders under root that hold a manifest."""
    return sorted(name for name in os.listdir(root) if os.path.isfile(os.path.join(root, name, 'manifest.json')))


# The tiny data: a shard and a record per image; 40 photos: 16 shards of up to 3 images, a record each.
@pytest.mark.parametrize('data_format, train_per_class', [('images', None), ('encoded', None), ('images', 20)])
def test_each_example_once_per_epoch_in_a_new_order_each_epoch_and_a_second_run_reads_it(
        tiny_data_dir, make_tiny_dataset, tmp_path, capsys, data_format, train_per_class):
    data_dir = make_tiny_dataset(train_per_class=train_per_class, val_per_class=1) if train_per_class else tiny_data_dir
    info = onu_dataset.describe(data_dir).split('train', data_format)
    size = info.num_examples
    expected = decoded_epoch(info)
    root = str(tmp_path / 'cache')
    cache = onu_decoded_cache.DiskCache.open(root, info, IMAGE_SIZE, False, SEED)
    written = epochs(stream(info, cache, 4 * size), size)
    out = capsys.readouterr().out
    assert f'Decoded-epoch cache: writing the first epoch to {cache.folder}' in out
    assert f'Decoded-epoch cache: {size} images written to {cache.folder}' in out
    # The written epoch, then three read back: each the decoded epoch's pixels and labels, once each.
    assert all(collections.Counter(epoch) == expected for epoch in written), written
    orders = [tuple(epoch) for epoch in written[1:]]
    assert len(set(orders)) == 3, orders  # a new order every epoch
    assert complete_folders(root) == [os.path.basename(cache.folder)] and os.listdir(root) == complete_folders(root)
    with open(os.path.join(cache.folder, 'manifest.json')) as f:
        manifest = json.load(f)
    per_shard = math.ceil(size / onu_decoded_cache.MIN_SHARDS)  # images, in as many shards as that allows
    assert manifest['examples'] == size and len(manifest['shards']) == math.ceil(size / per_shard)
    assert [records for _, _, records in manifest['shards']] == [1] * len(manifest['shards'])

    again = onu_decoded_cache.DiskCache.open(root, info, IMAGE_SIZE, False, SEED + 1)
    assert capsys.readouterr().out.strip() == f'Decoded-epoch cache: reading {cache.folder}, written by an earlier run.'
    read = epochs(stream(info, again, 2 * size, SEED + 1), size)
    assert all(collections.Counter(epoch) == expected for epoch in read)


# The cache's Python side as tf.numpy_function calls it, without a pipeline: what is on disk, block by block.
SMALL = 4  # image side: 48 bytes of pixels, several images in a block


def _images(count, side=SMALL):
    """count distinct (uint8 side x side x 3 image, int64 label) examples."""
    return [(np.full((side, side, 3), index % 256, np.uint8), np.int64(index % 3)) for index in range(count)]


def _read_back(folder, manifest, side=SMALL):
    """[(pixel bytes, label)] of every image in the cache's shards, read as its record format says: each record the
    pixels of its images, then their little-endian int64 labels; and the images of each record."""
    example_bytes, found, blocks = side * side * 3, [], []
    for name, images, records in manifest['shards']:
        payloads = list(onu_tfrecord.read_records(os.path.join(folder, name), 'NONE'))
        assert len(payloads) == records
        in_shard = []
        for payload in payloads:
            count = len(payload) // (example_bytes + onu_decoded_cache.LABEL_BYTES)
            labels = np.frombuffer(payload[count * example_bytes:], '<i8')
            assert len(payload) == count * (example_bytes + 8) and len(labels) == count
            in_shard += [(payload[i * example_bytes:(i + 1) * example_bytes], int(labels[i])) for i in range(count)]
            blocks.append(count)
        assert len(in_shard) == images
        found += in_shard
    return found, blocks


def _open_cache(tiny_data_dir, tmp_path, count=40, side=SMALL, reduced_decode=False, seed=SEED):
    """DiskCache.open of count images of tiny_data_dir's train split at side under tmp_path/cache."""
    info = dataclasses.replace(onu_dataset.describe(tiny_data_dir).split('train', 'images'), num_examples=count)
    return onu_decoded_cache.DiskCache.open(str(tmp_path / 'cache'), info, side, reduced_decode, seed)


def _write_cache(tiny_data_dir, tmp_path, examples, side=SMALL):
    """Writes examples as the first epoch of a disk cache of as many images under tmp_path/cache; returns it."""
    cache = _open_cache(tiny_data_dir, tmp_path, len(examples), side)
    for image, label in examples:
        assert cache._write(image, label) == label
    assert not os.path.exists(cache.folder)  # killed now, it is never read as whole
    cache._finish()
    return cache


# At least MIN_SHARDS shards where there are as many images (a new order each epoch); records of a block of images.
@pytest.mark.parametrize('count, side, shards, blocks', [
    (40, SMALL, [3] * 13 + [1], [3] * 13 + [1]),
    (10, SMALL, [1] * 10, [1] * 10),
    (480, 64, [30] * 16, [21, 9] * 16),  # 12 kB images: 21 to a block of BLOCK_BYTES
])
def test_the_first_epoch_is_written_whole_in_shards_read_back_in_a_new_order_each_epoch(
        tiny_data_dir, tmp_path, count, side, shards, blocks):
    examples = _images(count, side)
    cache = _write_cache(tiny_data_dir, tmp_path, examples, side)
    manifest = onu_decoded_cache.read_manifest(cache.folder)
    assert [images for _, images, _ in manifest['shards']] == shards
    assert (manifest['examples'], manifest['image_size']) == (count, side)
    read, read_blocks = _read_back(cache.folder, manifest, side)
    assert sorted(read) == sorted((image.tobytes(), int(label)) for image, label in examples)
    assert read_blocks == blocks
    assert os.listdir(tmp_path / 'cache') == [os.path.basename(cache.folder)]

    again = _open_cache(tiny_data_dir, tmp_path, count, side)  # a later run reads it
    assert again._manifest == manifest and again._partial is None
    orders = [list(again._epoch_shards()) for _ in range(3)]
    paths = sorted(os.path.join(cache.folder, name).encode() for name, _, _ in manifest['shards'])
    assert all(sorted(order) == paths for order in orders) and len({tuple(order) for order in orders}) == 3
    assert [again._checked(path) for path in paths] == paths
    rerun = _open_cache(tiny_data_dir, tmp_path, count, side)  # the same seed: the same orders
    assert [list(rerun._epoch_shards()) for _ in range(3)] == orders


def test_a_cache_of_another_image_size_decode_or_version_is_not_read(tiny_data_dir, tmp_path):
    cache = _write_cache(tiny_data_dir, tmp_path, _images(40))
    assert _open_cache(tiny_data_dir, tmp_path)._manifest is not None
    assert _open_cache(tiny_data_dir, tmp_path, side=SMALL + 1)._partial is not None  # written anew
    assert _open_cache(tiny_data_dir, tmp_path, reduced_decode=True)._partial is not None
    manifest = onu_decoded_cache.read_manifest(cache.folder)
    with open(os.path.join(cache.folder, onu_decoded_cache.MANIFEST), 'w', encoding='utf-8') as f:
        json.dump(dict(manifest, version=onu_decoded_cache.CACHE_VERSION + 1), f)
    assert onu_decoded_cache.read_manifest(cache.folder) is None  # another version's: not read


def _flip_a_bit(path):
    """Flips a bit of the pixels of path's first record."""
    with open(path, 'r+b') as f:
        f.seek(20)
        byte = f.read(1)
        f.seek(20)
        f.write(bytes([byte[0] ^ 1]))


def _cut_short(path):
    """Cuts path's last byte."""
    with open(path, 'r+b') as f:
        f.truncate(os.path.getsize(path) - 1)


def _empty(path):
    """Cuts path at its first record boundary: no record left."""
    open(path, 'wb').close()


@pytest.mark.parametrize('damage', [_flip_a_bit, _cut_short, _empty, os.remove])
def test_a_damaged_shard_is_never_read_nor_any_unchecked_one_after_it(tiny_data_dir, tmp_path, capsys, damage):
    cache = _write_cache(tiny_data_dir, tmp_path, _images(40))
    paths = sorted(os.path.join(cache.folder, name).encode() for name in os.listdir(cache.folder)
                   if name.startswith('shard-'))
    assert [cache._checked(path) for path in paths[:5]] == paths[:5]
    damage(paths[5])  # a shard not read yet
    capsys.readouterr()
    assert cache._checked(paths[5]) == b'' and cache._checked(paths[6]) == b''
    assert cache._checked(paths[4]) == paths[4]  # checked already: its readers may still be reading it
    assert len(cache._epoch_shards()) == 0 and onu_decoded_cache.read_manifest(cache.folder) is None
    assert len([line for line in capsys.readouterr().out.splitlines() if 'is damaged' in line]) == 1  # one line
    assert _write_cache(tiny_data_dir, tmp_path, _images(40)).folder == cache.folder  # the next run writes it again
    assert onu_decoded_cache.read_manifest(cache.folder)['examples'] == 40


def test_what_killed_processes_left_of_a_cache_is_removed_and_a_running_ones_is_left(tmp_path):
    folder = str(tmp_path / 'cache' / 'data-train-32-0123456789abcdef')
    onu_decoded_cache.remove_abandoned(folder)  # no cache folder yet: nothing to do
    ended = subprocess.Popen(['true'])
    ended.wait()
    left = {name: os.path.join(tmp_path, 'cache', f'data-train-32-0123456789abcdef{onu_decoded_cache.PARTIAL}{name}')
            for name in (str(ended.pid), str(os.getpid()), 'x')}
    other = str(tmp_path / 'cache' / f'data-train-64-fedcba9876543210{onu_decoded_cache.PARTIAL}{ended.pid}')
    for path in list(left.values()) + [other]:
        os.makedirs(os.path.join(path, 'shard'))
    onu_decoded_cache.remove_abandoned(folder)
    assert sorted(os.listdir(tmp_path / 'cache')) == sorted(os.path.basename(path) for path in (
        left[str(os.getpid())], other))  # this process's, writing still, and another cache's


def test_a_changed_data_folder_or_image_size_gets_a_cache_of_its_own_and_the_old_one_is_left(make_tiny_dataset,
                                                                                             tmp_path, capsys):
    data_dir = make_tiny_dataset(train_per_class=3, val_per_class=1)
    info = onu_dataset.describe(data_dir).split('train', 'images')
    root = str(tmp_path / 'cache')
    first = onu_decoded_cache.DiskCache.open(root, info, IMAGE_SIZE, False, SEED)
    stream(info, first, info.num_examples + 1)
    first_files = {name: os.path.getmtime(os.path.join(first.folder, name)) for name in os.listdir(first.folder)}
    # A photo rewritten (a new modification time), one more photo, another size, reduced decoding: a new key each.
    touched = info.files[0]
    os.utime(touched, ns=(os.stat(touched).st_atime_ns, os.stat(touched).st_mtime_ns + 10**9))
    changed = onu_dataset.describe(data_dir).split('train', 'images')
    onu_sample_data.generate_dataset(str(tmp_path / 'more'), 1, 1, (96, 72), seed=5, processes=1)
    extra = os.path.join(data_dir, 'train', info.class_names[0], 'extra.jpg')
    shutil.copy(onu_dataset.describe(str(tmp_path / 'more')).split('train', 'images').files[0], extra)
    grown = onu_dataset.describe(data_dir).split('train', 'images')
    assert grown.num_examples == info.num_examples + 1
    names = {first.folder}
    for other in (onu_decoded_cache.cache_folder(root, changed, IMAGE_SIZE, False),
                  onu_decoded_cache.cache_folder(root, grown, IMAGE_SIZE, False),
                  onu_decoded_cache.cache_folder(root, info, IMAGE_SIZE + 1, False),
                  onu_decoded_cache.cache_folder(root, info, IMAGE_SIZE, True)):
        assert other not in names, other
        names.add(other)
    capsys.readouterr()
    second = onu_decoded_cache.DiskCache.open(root, grown, IMAGE_SIZE, False, SEED)
    assert second.folder != first.folder and 'writing the first epoch' in capsys.readouterr().out
    stream(grown, second, grown.num_examples + 1)
    assert complete_folders(root) == sorted(os.path.basename(cache.folder) for cache in (first, second))
    assert {name: os.path.getmtime(os.path.join(first.folder, name)) for name in os.listdir(first.folder)} == first_files


def test_auto_keeps_the_epoch_in_memory_when_it_fits_else_on_a_disk_with_room_else_decodes(tmp_path, monkeypatch):
    root = str(tmp_path)
    assert onu_decoded_cache.choose('auto', 1000, 64, root)[0] == 'memory'
    for mode in ('memory', 'disk', 'off'):
        assert onu_decoded_cache.choose(mode, 10**9, 299, root) == (
            mode, f'the decoded epoch (1000000000 images at 299x299: 268.2 TB): --cache_decoded_epoch={mode}')
    for count, size, shown in ((10, 64, '123 kB'), (100, 1000, '300 MB'), (10**5, 100, '3.0 GB')):
        assert f'({count} images at {size}x{size}: {shown})' in onu_decoded_cache.choose('memory', count, size, root)[1]
    monkeypatch.setattr(onu_input, 'DECODED_CACHE_BYTES', 1000 * 64 * 64 * 3)  # just fits
    assert onu_decoded_cache.choose('auto', 1000, 64, root)[0] == 'memory'
    monkeypatch.setattr(onu_input, 'DECODED_CACHE_BYTES', 1000 * 64 * 64 * 3 - 1)  # one byte short
    kind, why = onu_decoded_cache.choose('auto', 1000, 64, root)
    assert kind == 'disk' and why.startswith('the decoded epoch (1000 images at 64x64: 12 MB) is over the 12 MB memory '
                                             f'budget: cached on disk in {root} (')
    kind, why = onu_decoded_cache.choose('auto', 10**8, 64, root)  # 1.2 TB: more than this disk has room for
    assert kind == 'off' and why.endswith('a disk cache takes: every epoch is decoded (--cache_dir elsewhere to '
                                          'cache it)') and '1.2 TB' in why


def test_a_full_disk_while_writing_removes_the_partial_cache_and_training_goes_on_decoding(tiny_data_dir, tmp_path,
                                                                                          capsys):
    info = onu_dataset.describe(tiny_data_dir).split('train', 'encoded')
    size = info.num_examples
    expected = decoded_epoch(info)
    root = str(tmp_path / 'small')
    mount(root, '-t', 'tmpfs', '-o', 'size=4m', 'tmpfs')
    try:
        cache = onu_decoded_cache.DiskCache.open(root, info, IMAGE_SIZE, False, SEED)
        # Something else fills the disk while the first epoch is written: room for about two images is left.
        with open(os.path.join(root, 'filler'), 'wb') as f:
            f.write(b'\0' * (shutil.disk_usage(root).free - 2 * IMAGE_SIZE * IMAGE_SIZE * 3))
        examples = epochs(stream(info, cache, 3 * size), size)
        assert sorted(os.listdir(root)) == ['filler']  # the partial cache removed, nothing else touched
    finally:
        subprocess.run(['umount', root], check=True)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith('Decoded-epoch cache')]
    assert lines[1:] == [f'Decoded-epoch cache: writing {cache.folder} failed (No space left on device): removed what '
                         f'was written; training goes on decoding every epoch.'], lines
    # The first epoch whole; then decoded epochs (records through a shuffle buffer that spans epochs: true images).
    assert collections.Counter(examples[0]) == expected and set(examples[1] + examples[2]) <= set(expected)


def flip_a_bit(shard):
    """Flips one bit of a pixel in the middle of shard."""
    with open(shard, 'r+b') as f:
        f.seek(os.path.getsize(shard) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))


def cut_after_the_first_record(shard):
    """Cuts shard right after its first record: what is left is whole records, every CRC right."""
    with open(shard, 'rb') as f:
        length = int.from_bytes(f.read(8), 'little')  # TFRecord: 8-byte length, its 4-byte CRC, payload, 4-byte CRC
    assert 8 + 4 + length + 4 < os.path.getsize(shard)  # a record or more is cut off
    os.truncate(shard, 8 + 4 + length + 4)


def empty(shard):
    """Empties shard to 0 bytes (as a crash before the file system wrote its data can)."""
    os.truncate(shard, 0)


@contextlib.contextmanager
def two_records_a_shard():
    """Caches of tiny_data_dir's 8 training images in 4 shards of 2 records (one image each) while it lasts."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(onu_decoded_cache, 'BLOCK_BYTES', IMAGE_SIZE * IMAGE_SIZE * 3)
        patch.setattr(onu_decoded_cache, 'MIN_SHARDS', 4)
        yield


@pytest.fixture(scope='module')
def written_cache(tiny_data_dir, tmp_path_factory):
    """A complete disk cache of tiny_data_dir's training images in 4 shards of 2 records, read-only (copy it).

    Returns (its root, the split's info, the multiset of one decoded epoch)."""
    info = onu_dataset.describe(tiny_data_dir).split('train', 'images')
    root = str(tmp_path_factory.mktemp('written') / 'cache')
    with two_records_a_shard():
        stream(info, onu_decoded_cache.DiskCache.open(root, info, IMAGE_SIZE, False, SEED), info.num_examples + 1)
    return root, info, decoded_epoch(info)


# Damage the CRCs catch (a flipped bit), and damage only the manifest's record count catches (whole records left).
@pytest.mark.parametrize('damage', [flip_a_bit, cut_after_the_first_record, empty])
def test_a_damaged_shard_is_never_trained_on_and_the_cache_is_rebuilt_next_time(written_cache, tmp_path, capsys,
                                                                                damage):
    written_root, info, expected = written_cache
    size, root = info.num_examples, str(tmp_path / 'cache')
    shutil.copytree(written_root, root)
    (name,) = os.listdir(root)
    folder = os.path.join(root, name)
    with open(os.path.join(folder, 'manifest.json')) as f:
        shards = json.load(f)['shards']
    assert [(images, records) for _, images, records in shards] == [(2, 2)] * 4
    shard = os.path.join(folder, shards[2][0])
    damage(shard)
    with two_records_a_shard():
        damaged = onu_decoded_cache.DiskCache.open(root, info, IMAGE_SIZE, False, SEED)
        examples = stream(info, damaged, 2 * size)
        # The shards checked before the damaged one, then decoded epochs (a whole one at least): every image one of
        # the true ones, none damaged, and none lost.
        assert set(examples) == set(expected) and len(examples) == 2 * size
        out = capsys.readouterr().out
        assert out.count(f'Decoded-epoch cache: {shard} is damaged (') == 1
        assert 'training goes on decoding every epoch; the next run writes the cache again.' in out
        assert not os.path.exists(os.path.join(folder, 'manifest.json'))
        rebuilt = onu_decoded_cache.DiskCache.open(root, info, IMAGE_SIZE, False, SEED)
        assert 'writing the first epoch' in capsys.readouterr().out and not os.path.exists(folder)
        if damage is flip_a_bit:  # the cache written again is whole (written as any first epoch is)
            stream(info, rebuilt, size + 1)
            assert complete_folders(root) == [name]


def test_a_read_only_cache_folder_is_one_line_and_training_goes_on(tiny_data_dir, tmp_path):
    source = tmp_path / 'empty'
    source.mkdir()
    with read_only_bind_mount(str(source), str(tmp_path / 'read_only')) as read_only:
        result = run_script('onu_train.py', *SCRIPT_FLAGS, f'--data_dir={tiny_data_dir}', '--max_steps=12',
                            f'--train_dir={tmp_path / "train"}', f'--cache_dir={read_only}/decoded')
    assert result.returncode == 0, result.stderr[-3000:]
    assert [line for line in result.stdout.splitlines() if line.startswith('Decoded-epoch cache')] == [
        f'Decoded-epoch cache: cannot write {read_only}/decoded (Read-only file system): every epoch is decoded '
        f'(--cache_dir=A_WRITABLE_LOCAL_FOLDER to cache it).']
    assert 'step 10, loss' in result.stdout and os.listdir(source) == []


def test_a_run_killed_mid_epoch_leaves_no_cache_and_the_resumed_run_writes_it_for_the_next(tmp_path):
    data_dir = str(tmp_path / 'data')
    onu_sample_data.generate_dataset(data_dir, 40, 1, (48, 36), seed=0, processes=1)  # an epoch longer than a kill
    root, train_dir = str(tmp_path / 'cache'), str(tmp_path / 'train')
    flags = (*SCRIPT_FLAGS, f'--data_dir={data_dir}', f'--train_dir={train_dir}', f'--cache_dir={root}',
             '--data_format=images')
    with start_script('onu_train.py', *flags, '--max_steps=1000', stdout=subprocess.PIPE,
                      stderr=subprocess.DEVNULL) as killed:
        for line in killed.stdout:
            if 'step 10, loss' in line:  # 10 of the epoch's 80 images trained on, a few more decoded
                killed.send_signal(signal.SIGKILL)
                break
        assert killed.wait(timeout=60) == -signal.SIGKILL
    (partial,) = os.listdir(root)
    assert partial.endswith(f'.partial-{killed.pid}') and 'manifest.json' not in os.listdir(os.path.join(root, partial))
    assert os.listdir(os.path.join(root, partial))  # shards were being written

    resumed = run_script('onu_train.py', *flags, '--max_steps=100')
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    folder = os.path.join(root, partial.split('.partial-')[0])
    assert f'Decoded-epoch cache: 80 images written to {folder}' in resumed.stdout
    assert os.listdir(root) == [os.path.basename(folder)]  # what the killed run left is gone

    again = run_script('onu_multi_gpu_train.py', *flags, '--max_steps=110')  # the other training script: the same
    assert again.returncode == 0, again.stderr[-3000:]
    assert f'Decoded-epoch cache: reading {folder}, written by an earlier run.' in again.stdout
    assert 'step 110, loss' in again.stdout and 'writing' not in again.stdout
