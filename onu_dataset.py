"""The on-disk layout of an ONU photo dataset and of its TFRecords: the one place for it.

Photos:  DATA/train/<class>/*, DATA/val/<class>/*  (class ids = sorted train class-folder names, 0-based)
Records: DATA/tfrecords/ holding the shards, labels.txt and manifest.json (see convert_to_tfrecord.py).

Also the image reading every tool shares (format sniffing, EXIF orientation) and the worker-process helpers
of the data tools. Pure Python + Pillow, no TensorFlow: every script and worker process imports it cheaply.
"""

import collections
import contextlib
import dataclasses
import itertools
import json
import multiprocessing
import os
import sys

from PIL import Image

DEFAULT_DATA_DIR = '/tmp/onu_data'  # every script's default --data_dir: the built-in sample data
SPLITS = ('train', 'val')
RECORD_FORMATS = ('raw', 'encoded')
DATA_FORMATS = ('images',) + RECORD_FORMATS
COMPRESSIONS = ('NONE', 'GZIP', 'ZLIB')

RECORDS_SUBDIR = 'tfrecords'
LABELS_FILENAME = 'labels.txt'
MANIFEST_FILENAME = 'manifest.json'
MANIFEST_VERSION = 1

KEY_ENCODED = 'image/encoded'
KEY_RAW = 'image/raw'
KEY_FORMAT = 'image/format'
KEY_LABEL = 'image/class/label'
KEY_TEXT = 'image/class/text'
KEY_HEIGHT = 'image/height'
KEY_WIDTH = 'image/width'
KEY_CHANNELS = 'image/channels'
KEY_FILENAME = 'image/filename'

# Values of KEY_FORMAT: what the payload bytes are.
PAYLOAD_JPEG = 'jpeg'
PAYLOAD_PNG = 'png'
PAYLOAD_RAW = 'raw'
CHANNELS = 3

JPEG_FORMATS = ('JPEG', 'MPO')  # Pillow calls multi-picture camera JPEGs 'MPO'; they decode as JPEG.
PLAIN_JPEG_MODES = ('RGB', 'L')  # stored in encoded records byte-for-byte, unchanged
TF_DECODABLE_FORMATS = JPEG_FORMATS + ('PNG', 'GIF', 'BMP')  # what tf.io.decode_image reads
SYSTEM_FILENAMES = ('thumbs.db', 'ehthumbs.db', 'desktop.ini', 'icon\r')
REASON_HIDDEN = 'hidden or system file'
EXIF_ORIENTATION_TAG = 0x0112
# EXIF orientation -> the Pillow transpose that makes the image upright (as ImageOps.exif_transpose does).
ORIENTATION_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_JPEG_END_MARKER = b'\xff\xd9'
_TAIL_BYTES = 64


class DataError(Exception):
    """A problem with the user's data; str(error) is one line naming the path and the fix."""


class UnreadableImage(Exception):
    """A file that cannot be used as a training image; str(error) is the reason."""


@dataclasses.dataclass
class ImageInfo:
    """One usable photo: where it is, its class, and what its header says."""
    path: str
    label: int
    class_name: str
    height: int  # upright, after the EXIF orientation is applied
    width: int  # upright
    orientation: int  # EXIF 1..8, 1 = none
    image_format: str  # sniffed from the content: 'JPEG', 'PNG', 'BMP', 'GIF', ...
    mode: str  # Pillow mode: 'RGB', 'L', 'CMYK', 'RGBA', ...
    num_bytes: int

    @property
    def is_plain_jpeg(self):
        """True if the file's own bytes already decode to the upright RGB image."""
        return (self.image_format in JPEG_FORMATS and self.mode in PLAIN_JPEG_MODES
                and self.orientation == 1)


def is_hidden(name):
    """True for dot-files and the system files file managers leave in photo folders."""
    return name.startswith('.') or name.lower() in SYSTEM_FILENAMES


def _has_jpeg_end_marker(fp):
    """True if the file ends with the JPEG end-of-image marker (ignoring zero padding)."""
    fp.seek(0, os.SEEK_END)
    fp.seek(max(0, fp.tell() - _TAIL_BYTES))
    return fp.read().rstrip(b'\x00').endswith(_JPEG_END_MARKER)


def _orientation(image):
    """The EXIF orientation Pillow would apply (1..8), 1 if absent or malformed."""
    try:
        value = image.getexif().get(EXIF_ORIENTATION_TAG, 1)
    except Exception:  # malformed EXIF blocks raise many kinds of errors; the photo itself is fine
        return 1
    return value if value in ORIENTATION_TRANSPOSE else 1


def relative_name(path, data_dir):
    """path relative to data_dir with '/' separators, as stored in image/filename and the manifest."""
    return os.path.relpath(path, data_dir).replace(os.sep, '/')


def read_image_info(path, label=0, class_name=''):
    """The ImageInfo of one file, or UnreadableImage(reason) if it cannot be used.

    JPEGs (nearly all photos) are checked cheaply: header plus the end-of-image marker; only a JPEG
    without that marker is fully decoded to tell a truncated file from one with trailing data.
    Other formats have no such cheap check and are fully decoded.
    """
    num_bytes = os.path.getsize(path)
    if num_bytes == 0:
        raise UnreadableImage('empty file')
    image_format = None
    try:
        with Image.open(path) as image:
            image_format, mode, (width, height) = image.format, image.mode, image.size
            if image_format not in JPEG_FORMATS or not _has_jpeg_end_marker(image.fp):
                image.load()
            orientation = _orientation(image)
    except Image.UnidentifiedImageError:
        raise UnreadableImage('not an image Pillow can read (content is not JPEG, PNG, BMP, GIF, ...)') from None
    except Exception as error:  # Pillow reports damaged files with OSError, SyntaxError, ValueError, ...
        what = f'damaged {image_format} file' if image_format else 'damaged or unsupported file'
        message = ' '.join(str(error).split()) or type(error).__name__
        raise UnreadableImage(f'{what}: {message}') from None
    if orientation in (5, 6, 7, 8):
        width, height = height, width
    return ImageInfo(path=path, label=label, class_name=class_name, height=height, width=width,
                     orientation=orientation, image_format=image_format, mode=mode, num_bytes=num_bytes)


def upright_rgb(path, orientation):
    """The fully decoded image at path, EXIF orientation applied, as an RGB PIL image."""
    with Image.open(path) as image:
        image.load()
        if orientation in ORIENTATION_TRANSPOSE:
            image = image.transpose(ORIENTATION_TRANSPOSE[orientation])
        return image if image.mode == 'RGB' else image.convert('RGB')


def visible_subdirs(folder):
    """Sorted names of the non-hidden subfolders of folder (the class folders of a split)."""
    return sorted(entry.name for entry in os.scandir(folder)
                  if entry.is_dir() and not is_hidden(entry.name))


def _candidate_files(class_dir):
    """(path, skip reason or None) for every entry of a class folder, sorted by path."""
    for entry in sorted(os.scandir(class_dir), key=lambda e: e.name):
        if is_hidden(entry.name):
            yield entry.path, REASON_HIDDEN
        elif entry.is_dir():
            yield entry.path, 'subfolder (images in subfolders are not read; move them up into the class folder)'
        elif not entry.is_file():
            yield entry.path, 'not a regular file'
        else:
            yield entry.path, None


def _has_readable_image(class_dir):
    """True if at least one file in class_dir is a usable image."""
    for path, reason in _candidate_files(class_dir):
        if reason is None:
            try:
                read_image_info(path)
                return True
            except UnreadableImage:
                pass
    return False


def find_class_names(data_dir):
    """Sorted class-folder names of data_dir/train (class id = index); DataError if the layout is wrong."""
    train_dir = os.path.join(data_dir, 'train')
    if not os.path.isdir(train_dir):
        raise DataError(f'{train_dir} not found: put photos in {data_dir}/train/<class>/ and {data_dir}/val/<class>/, '
                        f'or run python make_sample_data.py --data_dir={data_dir}')
    class_names = visible_subdirs(train_dir)
    if not class_names:
        raise DataError(f'{train_dir} has no class folders: put each class\'s photos in {train_dir}/<class>/')
    split_dirs = [train_dir]
    val_dir = os.path.join(data_dir, 'val')
    if os.path.isdir(val_dir):
        val_names = visible_subdirs(val_dir)
        if val_names != class_names:
            missing = sorted(set(class_names) - set(val_names))
            extra = sorted(set(val_names) - set(class_names))
            raise DataError(f'class folders of {val_dir} differ from {train_dir} (missing in val: {missing}, '
                            f'only in val: {extra}): give train/ and val/ the same class folders')
        split_dirs.append(val_dir)
    for split_dir in split_dirs:
        for name in class_names:
            class_dir = os.path.join(split_dir, name)
            if not _has_readable_image(class_dir):
                raise DataError(f'{class_dir} has no readable images: add photos to it, '
                                f'or remove class {name!r} from train/ and val/')
    return class_names


def list_split_images(data_dir, split, class_names):
    """(images, skipped) of data_dir/split: ImageInfos sorted by (label, path) and (path, reason) pairs."""
    images, skipped = [], []
    for label, class_name in enumerate(class_names):
        class_dir = os.path.join(data_dir, split, class_name)
        if not os.path.isdir(class_dir):
            raise DataError(f'{class_dir} not found: every split needs a folder for each class in {class_names}')
        for path, reason in _candidate_files(class_dir):
            if reason is None:
                try:
                    images.append(read_image_info(path, label, class_name))
                    continue
                except UnreadableImage as error:
                    reason = str(error)
            skipped.append((path, reason))
    return images, skipped


def records_dir_for(data_dir):
    """Where the TFRecords of data_dir live: data_dir/tfrecords, or data_dir itself if it holds a manifest."""
    if os.path.isfile(os.path.join(data_dir, MANIFEST_FILENAME)):
        return data_dir
    return os.path.join(data_dir, RECORDS_SUBDIR)


def shard_filename(split, record_format, index, num_shards):
    """The file name of one shard inside the records directory."""
    return f'{split}-{record_format}-{index:05d}-of-{num_shards:05d}.tfrecord'


def write_text_atomic(path, text):
    """Writes text to path through a temporary file and a rename, so readers never see half a file."""
    temp_path = f'{path}.tmp-{os.getpid()}'
    with open(temp_path, 'w', encoding='utf-8') as f:
        f.write(text)
    os.replace(temp_path, path)


def write_labels(path, class_names):
    """Writes TF-slim's labels file: one 'id:name' line per class."""
    write_text_atomic(path, ''.join(f'{label}:{name}\n' for label, name in enumerate(class_names)))


def read_labels(path):
    """The class names of a TF-slim labels file, ordered by id."""
    try:
        with open(path, encoding='utf-8') as f:
            lines = [line.rstrip('\n') for line in f if line.strip()]
    except FileNotFoundError:
        raise DataError(f'{path} not found: run python convert_to_tfrecord.py to write it') from None
    names = []
    for expected_id, line in enumerate(lines):
        label, sep, name = line.partition(':')
        if not sep or not label.strip().isdigit() or int(label) != expected_id or not name:
            raise DataError(f'{path}: line {expected_id + 1} is {line!r}, expected "{expected_id}:<class name>": '
                            f'fix the file or re-run python convert_to_tfrecord.py --overwrite')
        names.append(name)
    return names


def write_manifest(records_dir, manifest):
    """Writes records_dir/manifest.json atomically."""
    write_text_atomic(os.path.join(records_dir, MANIFEST_FILENAME),
                      json.dumps(manifest, indent=1, ensure_ascii=False) + '\n')


def read_manifest(records_dir):
    """The manifest dict written by convert_to_tfrecord.py in records_dir."""
    path = os.path.join(records_dir, MANIFEST_FILENAME)
    fix = f'run python convert_to_tfrecord.py --output_dir={records_dir} --data_dir=<your photo folder>'
    try:
        with open(path, encoding='utf-8') as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise DataError(f'{path} not found: {fix}') from None
    except (ValueError, UnicodeDecodeError) as error:
        raise DataError(f'{path} is not valid JSON ({error}): {fix} --overwrite') from None
    if not isinstance(manifest, dict) or manifest.get('version') != MANIFEST_VERSION:
        raise DataError(f'{path} is not a version-{MANIFEST_VERSION} manifest: {fix} --overwrite')
    return manifest


def records_entry(manifest, split, record_format, records_dir):
    """The manifest entry of one split and record format; DataError saying how to make it if absent."""
    entry = manifest.get('splits', {}).get(split, {}).get(record_format)
    if entry is None:
        raise DataError(f'{records_dir} has no {record_format} records of {split}: run python convert_to_tfrecord.py '
                        f'--output_dir={records_dir} --format={record_format} --data_dir=<your photo folder>')
    return entry


def shard_paths(records_dir, manifest, split, record_format):
    """Full paths of the shards of one split and record format, in order."""
    entry = records_entry(manifest, split, record_format, records_dir)
    return [os.path.join(records_dir, shard['file']) for shard in entry['shards']]


def tf_compression_type(compression):
    """A manifest's compression ('NONE', 'GZIP', 'ZLIB') as tf.data.TFRecordDataset spells it ('' for none)."""
    return '' if compression == 'NONE' else compression



def worker_count(processes=None):
    """The number of worker processes to use: processes, or every usable CPU core if None or 0."""
    if processes:
        return processes
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1


@contextlib.contextmanager
def _main_script_not_reimported():
    """Within it, spawned processes do not re-run the main script's imports (onu_train.py's TensorFlow).

    A spawned worker imports the main script's file (as __mp_main__) before running anything; the
    work functions live in library modules, which the worker imports itself, so it needs none of it.
    """
    main = sys.modules.get('__main__')
    main_file = getattr(main, '__file__', None)
    if main_file is None or getattr(main, '__spec__', None) is not None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = main_file


@contextlib.contextmanager
def process_pool(processes, initializer=None):
    """A pool of worker processes, or None when a single process is asked for (work runs in the caller)."""
    if processes <= 1:
        yield None
        return
    # 'spawn', not 'fork': callers may already run TensorFlow threads, which do not survive a fork.
    with _main_script_not_reimported():
        pool = multiprocessing.get_context('spawn').Pool(processes, initializer=initializer)
    try:
        yield pool
    finally:
        pool.terminate()  # callers collect every result first; this also stops workers still starting up


def parallel_map(fn, items, pool, window=8):
    """Yields fn(item) for items in order, computed by pool's workers (in this process if pool is None).

    When a result is yielded, the next `window` items are already submitted, and no more: a slow consumer
    never makes the workers fill the RAM.
    """
    if pool is None:
        yield from map(fn, items)
        return
    items = iter(items)
    pending = collections.deque(pool.apply_async(fn, (item,)) for item in itertools.islice(items, window))
    while pending:
        result = pending.popleft().get()
        for item in itertools.islice(items, 1):
            pending.append(pool.apply_async(fn, (item,)))
        yield result
