"""Where training keeps its decoded epoch (--cache_decoded_epoch): in memory, on local disk, or nowhere.

    kind, why = choose(mode, num_examples, image_size, root)       # 'memory', 'disk' or 'off', and a line saying why
    cache = open_cache(kind, info, image_size, root, reduced_decode, seed)   # MemoryCache, DiskCache or NO_CACHE
    examples = cache.training_examples(decoded, seed)   # endless (uint8 image, int32 label)

decoded(seed, repeat) gives the decoded training examples: one shuffled epoch, or endless when repeat.

The disk cache's folder is named by a key of what it holds (the data's files with their sizes and modification times,
the classes, the image size and the decode options), so a changed data folder gets a new cache, never a stale one.
The first epoch is written while it trains into a folder of this process's own (NAME.partial-PID), renamed into
place with its manifest when the epoch ends: a cache killed mid-epoch is never read as whole. Shards are TFRecord
files of blocks of images (their pixels, then their 8-byte labels: cheaper per image than a record each), whose
framing and CRCs are checked before this process first reads them. A full disk, a folder that cannot be written or
a damaged shard each print one line; training goes on decoding every epoch, and the partial or damaged cache is
removed (it is derived data).
"""
import dataclasses
import hashlib
import json
import math
import os
import shutil
import threading

import numpy as np
import tensorflow as tf
from tqdm import tqdm

from onu_lib import onu_files
from onu_lib import onu_run_folder
from onu_lib import onu_tfrecord
import onu_input

MODES = ('auto', 'memory', 'disk', 'off')  # --cache_decoded_epoch
CACHE_VERSION = 1
LABEL_BYTES = 8                 # a label: a little-endian int64
BLOCK_BYTES = 256 * 2**10       # a record: the pixels of up to this many bytes of images, then their labels
SHARD_BYTES = 64 * 2**20        # a shard's pixels at most: 250 images at 299x299
MIN_SHARDS = 16                 # at least this many shards where there are as many images: a new order each epoch
INTERLEAVED_SHARDS = 4          # shards read at once, a record from each in turn
SHUFFLE_BUFFER_BYTES = 256 * 2**20
SHUFFLE_BUFFER_SHARE = 0.1      # of an epoch at most: peak memory stays far from the memory cache's
FREE_SPACE_MARGIN_BYTES = 2**30  # left free on the cache's disk besides the cache ...
FREE_SPACE_MARGIN_SHARE = 0.1    # ... or this share of a smaller disk
MANIFEST = 'manifest.json'
PARTIAL = '.partial-'           # NAME.partial-PID: a cache being written by process PID


def default_root():
    """Returns where decoded epochs are cached by default: beside the record-count cache, in the user's cache folder."""
    return os.path.join(onu_files.cache_dir(), 'decoded')


def _size(num_bytes):
    """Returns num_bytes as '1.2 TB', '1.2 GB', '340 MB' or '61 kB'."""
    if num_bytes >= 1e12:
        return f'{num_bytes / 1e12:.1f} TB'
    if num_bytes >= 1e9:
        return f'{num_bytes / 1e9:.1f} GB'
    return f'{num_bytes / 1e6:.0f} MB' if num_bytes >= 1e6 else f'{num_bytes / 1e3:.0f} kB'


def cache_bytes(num_examples, image_size):
    """Returns the bytes a disk cache of num_examples images at image_size takes: their pixels, labels and framing."""
    framing = LABEL_BYTES + onu_tfrecord.HEADER_BYTES + onu_tfrecord.FOOTER_BYTES
    return onu_input.decoded_epoch_bytes(num_examples, image_size) + num_examples * framing


def room(root):
    """Returns the bytes a cache may take on the file system root is (or would be) on: its free space less a margin
    (FREE_SPACE_MARGIN_BYTES, or FREE_SPACE_MARGIN_SHARE of a smaller disk) left for everything else."""
    path = os.path.abspath(root)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    usage = shutil.disk_usage(path)
    return usage.free - min(FREE_SPACE_MARGIN_BYTES, int(usage.total * FREE_SPACE_MARGIN_SHARE))


def choose(mode, num_examples, image_size, root):
    """Returns (kind, why): 'memory', 'disk' or 'off' for the decoded epoch of num_examples images at image_size as
    mode says; auto: memory if it fits onu_input.DECODED_CACHE_BYTES, else disk if root's disk has room, else off."""
    epoch = onu_input.decoded_epoch_bytes(num_examples, image_size)
    what = f'the decoded epoch ({num_examples} images at {image_size}x{image_size}: {_size(epoch)})'
    budget = _size(onu_input.DECODED_CACHE_BYTES)
    if mode in ('memory', 'disk', 'off'):
        return mode, f'{what}: --cache_decoded_epoch={mode}'
    if epoch <= onu_input.DECODED_CACHE_BYTES:
        return 'memory', f'{what} fits the {budget} memory budget: kept in memory'
    free, needed = room(root), cache_bytes(num_examples, image_size)
    if free >= needed:
        return 'disk', f'{what} is over the {budget} memory budget: cached on disk in {root} ({_size(free)} free)'
    return 'off', (f'{what} is over the {budget} memory budget and {root} has room for {_size(max(free, 0))} of the '
                   f'{_size(needed)} a disk cache takes: every epoch is decoded (--cache_dir elsewhere to cache it)')


def open_cache(kind, info, image_size, root, reduced_decode=False, seed=None, progress=False):
    """Returns the cache of kind for info's training images at image_size (progress: a MemoryCache's); NO_CACHE when
    a DiskCache under root can be neither read nor written (after its one line)."""
    if kind == 'memory':
        return MemoryCache(info.num_examples, progress)
    if kind == 'disk':
        return DiskCache.open(root, info, image_size, reduced_decode, seed) or NO_CACHE
    return NO_CACHE


class NoCache:
    """No cache (--cache_decoded_epoch=off): every epoch is read and decoded again."""

    def training_examples(self, decoded, seed):
        """Returns endless examples: decoded ones, every epoch."""
        return decoded(seed, repeat=True)


NO_CACHE = NoCache()


@dataclasses.dataclass(frozen=True)
class MemoryCache:
    """The decoded epoch of num_examples kept in memory (tf.data's cache) and reshuffled every epoch. It is also the
    shuffle buffer, so the first batch waits for all of it: progress shows that on a progress bar."""
    num_examples: int
    progress: bool = False

    def training_examples(self, decoded, seed):
        """Returns endless examples: the first decoded epoch, kept, in a new order every epoch."""
        examples = decoded(seed, repeat=False)
        if self.progress:  # before the cache: each example passes here once, while the first epoch is decoded
            tick = _fill_progress(self.num_examples)

            def counted(image, label):
                with tf.control_dependencies([tf.numpy_function(tick, [], tf.int64, stateful=True)]):
                    return tf.identity(image), label
            examples = examples.map(counted)
        return examples.cache().shuffle(self.num_examples, seed=seed, reshuffle_each_iteration=True).repeat()


def _fill_progress(num_examples):
    """Returns a function (for tf.numpy_function) counting the examples decoded into the cache on a progress bar."""
    bars = []

    def tick():
        if not bars:
            bars.append(tqdm(total=num_examples, unit='photo', desc='decoding the first epoch into memory',
                             leave=False))
        bars[0].update()
        if bars[0].n >= num_examples:
            bars[0].close()
        return np.int64(bars[0].n)
    return tick


def cache_folder(root, info, image_size, reduced_decode):
    """Returns the folder under root of info's decoded epoch at image_size, named by a key of what it holds."""
    files = [[os.path.abspath(path), os.stat(path).st_size, os.stat(path).st_mtime_ns] for path in info.files]
    held = {'version': CACHE_VERSION, 'data_format': info.data_format, 'split': info.split, 'files': files,
            'labels': list(info.labels), 'class_names': list(info.class_names), 'labels_offset': info.labels_offset,
            'keys': [info.image_key, info.label_key], 'compression': info.compression_type,
            'image_size': image_size, 'reduced_decode': bool(reduced_decode)}
    key = hashlib.sha256(json.dumps(held, sort_keys=True).encode()).hexdigest()[:16]
    name = os.path.basename(os.path.realpath(info.data_dir)) or 'root'
    return os.path.join(root, f'{name}-{info.split}-{image_size}-{key}')


def remove_abandoned(folder):
    """Removes what killed processes left of folder's cache (NAME.partial-PID of a PID no longer running)."""
    parent, name = os.path.split(folder)
    for entry in os.listdir(parent) if os.path.isdir(parent) else ():
        if entry.startswith(name + PARTIAL):
            pid = entry[len(name + PARTIAL):]
            if not pid.isdigit() or not onu_run_folder.process_alive(int(pid)):
                shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


def read_manifest(folder):
    """Returns the manifest of folder's complete cache, or None when there is none (or it does not parse)."""
    try:
        with open(os.path.join(folder, MANIFEST), encoding='utf-8') as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    return manifest if manifest.get('version') == CACHE_VERSION else None


class DiskCache:
    """One epoch of decoded training images on local disk: written during the first epoch, read by the later ones."""

    def __init__(self, folder, image_size, num_examples, seed):
        self.folder = folder
        self.image_size = image_size
        self._example_bytes = image_size * image_size * 3
        self._images_per_shard = max(1, min(SHARD_BYTES // self._example_bytes, math.ceil(num_examples / MIN_SHARDS)))
        self._images_per_block = max(1, min(BLOCK_BYTES // self._example_bytes, self._images_per_shard))
        self._shuffle_buffer = max(1, min(SHUFFLE_BUFFER_BYTES // self._example_bytes,
                                          int(num_examples * SHUFFLE_BUFFER_SHARE)))
        self._rng = np.random.default_rng(seed)
        self._seed = seed
        self._lock = threading.Lock()
        self._manifest = read_manifest(folder)
        self._partial = None     # the folder being written; None when not writing
        self._shard = None       # the open shard being written
        self._shards = []        # [name, images, records] of the shards written
        self._block = []         # (uint8 image, label) of the images not written yet
        self._verified = set()   # shards whose framing and CRCs were checked by this process
        self._damaged = False

    @classmethod
    def open(cls, root, info, image_size, reduced_decode, seed=None):
        """Returns the DiskCache of info's training images at image_size under root, complete or to be written by the
        first epoch; None, after one line saying why, when it can be neither read nor written."""
        try:
            folder = cache_folder(root, info, image_size, reduced_decode)
            cache = cls(folder, image_size, info.num_examples, seed)
            if cache._manifest is not None:
                print(f'Decoded-epoch cache: reading {folder}, written by an earlier run.', flush=True)
                return cache
            os.makedirs(root, exist_ok=True)
            remove_abandoned(folder)
            shutil.rmtree(folder, ignore_errors=True)  # a cache found damaged: its manifest was removed
            free, needed = room(root), cache_bytes(info.num_examples, image_size)
            if free < needed:
                print(f'Decoded-epoch cache: {root} has room for {_size(max(free, 0))} of the {_size(needed)} the '
                      f'cache takes: every epoch is decoded (--cache_dir elsewhere to cache it).', flush=True)
                return None
            cache._partial = f'{folder}{PARTIAL}{os.getpid()}'
            os.makedirs(cache._partial)
        except OSError as error:
            print(f'Decoded-epoch cache: cannot write {root} ({error.strerror or error}): every epoch is decoded '
                  f'(--cache_dir=A_WRITABLE_LOCAL_FOLDER to cache it).', flush=True)
            return None
        print(f'Decoded-epoch cache: writing the first epoch to {folder} while training on it; later epochs read it '
              f'back.', flush=True)
        return cache

    # Writing: the first epoch, through tf.numpy_function.

    def _abandon(self, why):
        """Stops writing after a failure: removes what was written, says so in one line (under the lock)."""
        if self._shard is not None:
            try:
                self._shard.close()
            except OSError:
                pass
        shutil.rmtree(self._partial, ignore_errors=True)
        self._partial, self._shard = None, None
        print(f'Decoded-epoch cache: writing {self.folder} failed ({why}): removed what was written; training goes '
              f'on decoding every epoch.', flush=True)

    def _write(self, image, label):
        """Adds one (uint8 image, label) to the shard being written; returns the label."""
        with self._lock:
            if self._partial is None:
                return label
            try:
                if self._shard is None or self._shards[-1][1] == self._images_per_shard:
                    if self._shard is not None:
                        self._shard.close()
                    name = f'shard-{len(self._shards):05d}.tfrecord'
                    self._shard = open(os.path.join(self._partial, name), 'wb')  # pylint: disable=consider-using-with
                    self._shards.append([name, 0, 0])
                # Kept past this call only in a block of several (small) images: a copy then, the array is TF's.
                self._block.append((image if self._images_per_block == 1 else image.copy(), label))
                self._shards[-1][1] += 1
                if len(self._block) == self._images_per_block or self._shards[-1][1] == self._images_per_shard:
                    self._write_block()
            except OSError as error:
                self._abandon(error.strerror or str(error))
        return label

    def _write_block(self):
        """Writes the images added since the last block as one record (under the lock)."""
        labels = np.array([label for _, label in self._block], '<i8')
        onu_tfrecord.write_record(self._shard, [np.ascontiguousarray(image) for image, _ in self._block] + [labels])
        self._shards[-1][2] += 1
        self._block = []

    def _finish(self):
        """Closes the last shard, writes the manifest and renames the written folder into place."""
        with self._lock:
            if self._partial is None:
                return np.int32(0)
            try:
                if self._block:
                    self._write_block()
                if self._shard is not None:
                    self._shard.close()
                    self._shard = None
                manifest = {'version': CACHE_VERSION, 'image_size': self.image_size, 'shards': self._shards,
                            'examples': sum(images for _, images, _ in self._shards)}
                with open(os.path.join(self._partial, MANIFEST), 'w', encoding='utf-8') as f:
                    json.dump(manifest, f)
            except OSError as error:
                self._abandon(error.strerror or str(error))
                return np.int32(0)
            try:
                os.rename(self._partial, self.folder)
            except OSError:  # another process (a worker of the same data on this machine) finished first
                shutil.rmtree(self._partial, ignore_errors=True)
                manifest = read_manifest(self.folder)
            self._partial, self._manifest = None, manifest
        if manifest is not None:
            print(f'Decoded-epoch cache: {manifest["examples"]} images written to {self.folder} '
                  f'({_size(manifest["examples"] * self._example_bytes)}); later epochs read them back.', flush=True)
        return np.int32(0)

    # pragma: no mutate start (the tf.data pipeline around the Python side: its tests run TensorFlow pipelines)
    def _written(self, image, label):
        """The example, once appended to the cache."""
        label = tf.numpy_function(self._write, [image, label], label.dtype, stateful=True)
        return image, tf.ensure_shape(label, [])

    def _end_of_writing(self, like):
        """An empty dataset of like's structure whose reading ends the writing (_finish)."""
        image, label = tf.zeros([self.image_size] * 2 + [3], tf.uint8), tf.zeros([], like.element_spec[1].dtype)

        def finished(image, label):
            with tf.control_dependencies([tf.numpy_function(self._finish, [], tf.int32, stateful=True)]):
                return tf.identity(image), label
        return tf.data.Dataset.from_tensors((image, label)).map(finished).filter(lambda image, label: False)

    # pragma: no mutate end
    # Reading: every later epoch.
    def _epoch_shards(self):
        """Returns this epoch's shard paths in a new order; none when the cache is not there or is damaged."""
        with self._lock:
            if self._manifest is None or self._damaged:
                return np.array([], dtype=object)
            order = self._rng.permutation(len(self._manifest['shards']))
            return np.array([os.path.join(self.folder, self._manifest['shards'][i][0]).encode() for i in order],
                            dtype=object)

    def _checked(self, path):
        """Returns path if its shard is whole (framing, CRCs and record count as the manifest says), else b''."""
        if path in self._verified:
            return path
        if self._damaged:
            return b''
        records = {name: records for name, _, records in self._manifest['shards']}.get(os.path.basename(path.decode()))
        try:
            framing = onu_tfrecord.read_framing(path.decode(), 'NONE', verify=True)
            problem = framing.problem or (None if framing.records == records else
                                          f'{framing.records} records, not {records}')
        except (OSError, onu_tfrecord.DamagedRecord) as error:
            problem = str(error)
        if problem is None:
            self._verified.add(path)
            return path
        with self._lock:
            if not self._damaged:
                self._damaged = True
                # The manifest only: shards passed already may still be opened by this epoch's readers.
                try:
                    os.remove(os.path.join(self.folder, MANIFEST))
                except OSError:
                    pass
                print(f'Decoded-epoch cache: {path.decode()} is damaged ({problem}): training goes on decoding every '
                      f'epoch; the next run writes the cache again.', flush=True)
        return b''

    # pragma: no mutate block (the tf.data pipeline that reads the cache back: its TensorFlow pipeline tests)
    def _parsed(self, record):
        """Returns (uint8 images, int32 labels) of one record's block, in a new order every epoch."""
        if self._images_per_block == 1:  # large images: no count to compute, no order to draw, one copy less
            pixels = tf.io.decode_raw(record, tf.uint8, fixed_length=self._example_bytes)
            labels = tf.io.decode_raw(tf.strings.substr(record, self._example_bytes, LABEL_BYTES), tf.int64)
            return tf.reshape(pixels, [1, self.image_size, self.image_size, 3]), tf.cast(labels, tf.int32)
        count = tf.strings.length(record) // (self._example_bytes + LABEL_BYTES)
        pixels = tf.io.decode_raw(tf.strings.substr(record, 0, count * self._example_bytes), tf.uint8)
        labels = tf.io.decode_raw(tf.strings.substr(record, count * self._example_bytes, count * LABEL_BYTES),
                                  tf.int64)
        order = tf.random.shuffle(tf.range(count), seed=self._seed)
        images = tf.reshape(pixels, [-1, self.image_size, self.image_size, 3])
        return tf.gather(images, order), tf.gather(tf.cast(labels, tf.int32), order)

    def _one_epoch(self, _):
        """The cache's examples once each: its shards in a new order, read a few at a time, in a bounded buffer."""
        paths = tf.numpy_function(self._epoch_shards, [], tf.string, stateful=True)
        shards = tf.data.Dataset.from_tensor_slices(tf.ensure_shape(paths, [None]))
        shards = shards.map(lambda path: tf.ensure_shape(
            tf.numpy_function(self._checked, [path], tf.string, stateful=True), [])).filter(
            lambda path: tf.strings.length(path) > 0)
        records = shards.interleave(tf.data.TFRecordDataset, cycle_length=INTERLEAVED_SHARDS, block_length=1)
        return records.map(self._parsed).unbatch().shuffle(self._shuffle_buffer, seed=self._seed)

    def training_examples(self, decoded, seed):
        """Returns endless examples: the first decoded epoch, written to the cache as it trains (unless complete), then
        the cache's epochs, each in a new order, then decoded ones (reached only if the cache failed)."""
        first_epoch = decoded(seed, repeat=False)
        later_seed = None if seed is None else seed + 1  # a failed cache's next epochs: not the first one's order
        decoded_later = decoded(later_seed, repeat=True)
        read_back = tf.data.Dataset.from_tensors(0).flat_map(self._one_epoch).repeat()
        examples = read_back.concatenate(decoded_later)
        if self._partial is not None:
            written = first_epoch.map(self._written).concatenate(self._end_of_writing(first_epoch))
            examples = written.concatenate(examples)
        return examples
